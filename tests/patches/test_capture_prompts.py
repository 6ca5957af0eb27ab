"""``--capture prompts:FILE``: exactly the listed prompts are captured, on both sides.

The ids are made the way the patched verl agent loop makes them (``request_ids.enter_prompt`` in one
asyncio task per sample, then ``request_ids.new_request_id``); the vLLM side's decision is the
dispatch hook's own ``request_scope.should_dump``; the training side is the real verl FSDP
engine on CPU with real msprobe dumps. Both pin sets (``pinset``): the patched files are those of
the set in force; the ids made through verl's real client are checked in
``test_verl_request_ids.py`` (one Ray run shared with it).
"""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

import pytest

from bench.support.verl_support import series_has
from tests.patches.test_training_fsdp import _drive, _msprobe_config, _records
from verl_consistency.contracts import capture, env, pins, records
from verl_consistency.contracts.records import ScheduledRequest
from verl_consistency.entrypoints.run.overrides import Mode
from verl_consistency.entrypoints.run.plan import CAPTURE_PROMPTS, build_plan
from verl_consistency.entrypoints.run.plan_options import PlanError, PlanOptions
from verl_consistency.patches.hooks.rollout import request_ids, request_scope

pytestmark = [pytest.mark.timeout(300), pytest.mark.pinset]


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "capture-these.txt"
    path.write_text(text)
    return path


def test_the_reports_file_format(tmp_path: Path) -> None:
    path = _file(tmp_path, "# header\nindex:3  # request r step 1\n\n7\nuid:abc\n")
    assert capture.read_prompts(path) == {"index:3", "index:7", "uid:abc"}
    rule = capture.parse(f"prompts:{path}")
    assert rule.spec() == f"prompts:{path}"
    assert not rule.is_all
    assert rule.lists({"index": 3})
    assert rule.lists({"index": 9, "uid": "abc"})
    assert not rule.lists({"index": 4, "uid": "x"})


@pytest.mark.parametrize(
    ("text", "where"), [("index:1\nline:2\n", ":2:"), ("# nothing\n", "lists no prompt")]
)
def test_a_bad_file_names_the_line(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(capture.CaptureFileError, match=where):
        capture.read_prompts(_file(tmp_path, text))


def _ids(monkeypatch: pytest.MonkeyPatch, spec: str, n: int) -> list[str]:
    monkeypatch.setenv(env.CAPTURE, spec)

    async def one(i: int) -> str:
        request_ids.enter_prompt({"index": i, "uid": f"u{i}"})
        await asyncio.sleep(0)
        return request_ids.new_request_id()

    async def main() -> list[str]:
        return list(await asyncio.gather(*(one(i) for i in range(n))))

    return asyncio.run(main())


def test_both_sides_capture_exactly_the_listed_prompts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = _file(tmp_path, "index:2\nindex:5\nuid:u11\n")
    ids = _ids(monkeypatch, f"prompts:{path}", 16)
    rule = capture.parse(f"prompts:{path}")
    marked = [i for i, rid in enumerate(ids) if rid.startswith(capture.CAPTURED_PREFIX)]
    assert marked == [2, 5, 11], "task-local: concurrent samples never see each other's answer"
    assert all(len(rid) == 32 for rid in ids)
    # training side (BatchDumper._wanted) and vLLM side (should_dump) decide on the id alone,
    # after vLLM's -<8 hex> suffix and an n>1 child prefix
    assert [i for i, rid in enumerate(ids) if rule.captures(records.base_request_id(rid))] == marked
    for i, rid in enumerate(ids):
        vllm_id = f"1_{rid}-0123abcd"
        req = ScheduledRequest(
            request_id=vllm_id, type="new", tokens=9, prompt_tokens=9, num_computed_tokens=0
        )
        assert (request_scope.should_dump([req], "prefill", rule) == vllm_id) == (i in marked)
    # every other mode keeps verl's own ids
    plain = _ids(monkeypatch, "fraction:0.5", 8)
    assert not any(rid.startswith(capture.CAPTURED_PREFIX) for rid in plain)


def _function(tree: ast.AST, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    (fn,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
    ]
    return fn


def test_patch_marks_ids_where_verl_makes_them(root: Path) -> None:
    tree = ast.parse((root / "verl/experimental/agent_loop/agent_loop.py").read_text())
    fn = _function(tree, "_run_agent_loop")
    assert "request_ids.enter_prompt(kwargs)" in ast.unparse(fn.body[1]), "before the agent loop runs"
    server_src = (root / "verl/workers/rollout/llm_server.py").read_text()
    if pins.get("set.name") == "next":
        # verl 0.9.1 makes the vLLM id in LLMServerClient._vllm_request_id; generate sends its result
        made = ast.unparse(_function(ast.parse(server_src), "_vllm_request_id"))
        assert "return request_ids.new_request_id()" in made
        assert "return request_ids.mark_listed(request_id)" in made, "the full_determinism branch"
        assert "uuid4()" not in made
        assert "vllm_request_id = self._vllm_request_id(request_id)" in server_src
    else:
        assert "vllm_request_id = request_ids.new_request_id()" in server_src
    assert "request_id=vllm_request_id" in server_src


@pytest.mark.skipif(
    not series_has("verl", "0002-"), reason="the set in force carries no FSDP training-dump patch (0002) yet"
)
def test_the_real_fsdp_engine_dumps_exactly_the_listed_prompts(root: Path, tmp_path: Path) -> None:
    listed = _file(tmp_path, "index:1\nindex:3\n")
    run_dir = tmp_path / "run"
    cfg = _msprobe_config(tmp_path / "msprobe_actor.json", tmp_path / "unused")
    report = _drive(
        root,
        tmp_path / "work",
        DUMP_ON="1",
        VERL_CONSISTENCY_ACTOR_CONFIG=str(cfg),
        VERL_CONSISTENCY_RUN_DIR=str(run_dir),
        VERL_CONSISTENCY_CAPTURE=f"prompts:{listed}",
        VC_TEST_IDS_FROM_AGENT_LOOP="1",
    )
    assert report["error"] is None
    ids = report["request_ids"]
    recs = _records(run_dir)
    assert [r.request_ids for r in recs] == [[ids[1]], [ids[3]]]
    dumps = sorted((run_dir / recs[0].dump_path).glob("step*/*/dump.json"))
    assert len(dumps) == 2


def test_run_copies_the_file_into_the_run_folder(tmp_path: Path) -> None:
    listed = _file(tmp_path, "index:4\n")
    plan = build_plan(
        Mode.HYBRID,
        PlanOptions(dump_root=str(tmp_path / "d"), run_id="r1", environ={}, capture=f"prompts:{listed}"),
    )
    assert plan.env[env.CAPTURE] == f"prompts:{tmp_path / 'd' / 'r1' / CAPTURE_PROMPTS}"
    assert plan.capture_source == str(listed)
    assert plan.dump.task.value == "tensor"
    assert f"prompts:{listed}" in plan.invocation
    from verl_consistency.entrypoints.run.command import prepare_run_dir

    prepare_run_dir(plan)
    assert (tmp_path / "d" / "r1" / CAPTURE_PROMPTS).read_text() == "index:4\n"
    assert json.loads((tmp_path / "d" / "r1" / "run.json").read_text())["capture"].startswith("prompts:")

    bad = _file(tmp_path, "index:4\nbogus\n")
    with pytest.raises(PlanError, match=r"capture-these.txt:2"):
        build_plan(
            Mode.HYBRID, PlanOptions(dump_root="/d", run_id="r2", environ={}, capture=f"prompts:{bad}")
        )
