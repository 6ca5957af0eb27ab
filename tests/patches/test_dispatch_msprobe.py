"""The dispatch hook, driven the way the patched vllm-ascend runner drives it, with real parts.

Real: vLLM's ``SchedulerOutput`` / ``NewRequestData`` / ``CachedRequestData`` of the pin set in
force (0.18.0 or 0.23.0; the wheel's own source, imported on CPU; fixtures in ``conftest.py``),
the ``AscendAttentionState`` member names (read from the set's vllm-ascend source: importing it
needs torch_npu), and mindstudio-probe 26.2.0's
``PrecisionDebugger`` dumping a small torch module on CPU. Not real: the model (a two-layer MLP
over packed token rows, which is how vLLM lays a step's tokens out) and the scheduler (the test
writes the schedule; the objects carrying it are vLLM's).

msprobe's debugger is a per-process singleton, so every scenario runs in its own subprocess:
``python -m tests.patches.test_dispatch_msprobe SCENARIO.json`` (see :func:`main`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fixtures.subprocess_run import run_module_json
from verl_consistency.contracts import capture, records
from verl_consistency.contracts.env import CAPTURE, RUN_DIR
from verl_consistency.contracts.records import DISPATCH_LOG, DispatchRecord

pytestmark = [pytest.mark.upstream, pytest.mark.msprobe, pytest.mark.pinset]

REPO = Path(__file__).resolve().parents[2]
HIDDEN = 4
FIRST_LINEAR = "Module.0.Linear.forward.0"

# ---------------------------------------------------------------------------------------------
# The subprocess side: one scenario per process (msprobe's debugger is a singleton).
# ---------------------------------------------------------------------------------------------


def _scheduler_output(step: dict[str, Any]) -> Any:
    """A real vLLM SchedulerOutput (the set's release) for one scheduled step of the schedule file."""
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    new = [
        NewRequestData(
            req_id=r["id"],
            prompt_token_ids=list(range(r["prompt"])),
            mm_features=[],
            sampling_params=None,
            pooling_params=None,
            block_ids=([0],),
            num_computed_tokens=r.get("computed", 0),
            lora_request=None,
        )
        for r in step.get("new", [])
    ]
    cached_reqs = step.get("cached", [])
    cached = CachedRequestData(
        req_ids=[r["id"] for r in cached_reqs],
        resumed_req_ids=set(),
        new_token_ids=[],
        all_token_ids={},
        new_block_ids=[None for _ in cached_reqs],
        num_computed_tokens=[10 for _ in cached_reqs],
        num_output_tokens=[1 for _ in cached_reqs],
    )
    counts = {r["id"]: r["tokens"] for r in step.get("scheduler_order", [])} or {
        r["id"]: r.get("tokens", r.get("prompt")) for r in [*step.get("new", []), *cached_reqs]
    }
    return SchedulerOutput(
        scheduled_new_reqs=new,
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=counts,
        total_num_scheduled_tokens=sum(counts.values()),
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        num_common_prefix_blocks=[0],
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
    )


def _packed_input(so: Any, batch_order: list[str], fills: dict[str, float]) -> Any:
    """The step's tokens packed in batch order; every row of a request holds that request's value."""
    import torch

    rows = [torch.full((so.num_scheduled_tokens[rid], HIDDEN), fills.get(rid, 0.0)) for rid in batch_order]
    return torch.cat(rows)


def _write_config(path: Path, dump_root: Path, level: str = "L0", dump_enable: bool = True) -> None:
    cfg: dict[str, Any] = {
        "task": "statistics",
        "dump_path": str(dump_root),
        "rank": [],
        "step": [],
        "level": level,
        "async_dump": False,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    }
    if dump_enable:
        cfg["dump_enable"] = True  # turns on msprobe 26.x's config hot reload
    path.write_text(json.dumps(cfg))


def main(argv: list[str]) -> int:
    """Run one scenario file; writes ``result.json`` next to it."""
    scenario_path = Path(argv[0])
    sc = json.loads(scenario_path.read_text())
    sys.path.insert(0, sc["vllm_src"])
    import enum

    import torch
    from msprobe.pytorch import PrecisionDebugger

    from verl_consistency.patches.hooks.rollout.dispatch import DispatchLogger

    states = enum.Enum("AscendAttentionState", sc["attn_states"])  # type: ignore[misc]
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN)
    )
    cfg = Path(sc["config"])
    result: dict[str, Any] = {"pid": os.getpid()}

    if sc.get("recipe_redirect"):
        # The recipe's way: construct from the file, then point the service's config copy at a
        # per-pid folder.
        debugger = PrecisionDebugger(str(cfg))
        debugger.service.config.dump_path = sc["recipe_redirect"]
        logger = None
    else:
        logger = DispatchLogger.for_rollout(cfg)
        debugger = PrecisionDebugger(str(cfg), dump_path=str(logger.dump_path))
        result["dump_path"] = str(logger.dump_path)
    first_config = debugger.config

    for i, step in enumerate(sc["steps"]):
        if sc.get("edit_config_before") == i:
            # A user edits the live config (here: its dump_path): msprobe reloads it.
            time.sleep(0.6)
            _write_config(cfg, Path(sc["edited_dump_root"]))
        so = _scheduler_output(step)
        order = step.get("batch_order") or list(so.num_scheduled_tokens)
        state = states[step["attn_state"]]
        x = _packed_input(so, order, step.get("fills", {}))
        if logger is None:
            debugger.start(model=model)
            started = True
        else:
            started = logger.start(debugger, model, so, state, order)
        with torch.no_grad():
            model(x)
        # one stop site per step, as in the runner (which of the three depends on the path)
        if logger.finish() if logger is not None else started:
            debugger.stop()
            debugger.step()
        if logger is not None:
            result.setdefault("second_finish", []).append(logger.finish())
    result["reloaded"] = debugger.config is not first_config
    result["final_dump_path"] = debugger.service.config.dump_path
    (scenario_path.parent / "result.json").write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------------
# The pytest side.
# ---------------------------------------------------------------------------------------------


def _run(tmp_path: Path, scenario: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    inherited = {k: v for k, v in os.environ.items() if k not in (RUN_DIR, CAPTURE)}
    return run_module_json(
        "tests.patches.test_dispatch_msprobe",
        str(path),
        result=tmp_path / "result.json",
        env={**inherited, **env},
        timeout=240,
    )


def _records(folder: Path) -> list[DispatchRecord]:
    lines = (folder / DISPATCH_LOG).read_bytes().splitlines()
    return [DispatchRecord.model_validate(orjson.loads(line)) for line in lines]


def _step_folders(folder: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("step")) for p in folder.glob("step*") if p.is_dir())


def _dump(folder: Path, step: int) -> dict[str, Any]:
    (path,) = (folder / f"step{step}").glob("*/dump.json")
    data: dict[str, Any] = json.loads(path.read_text())["data"]
    return data


def _lane_dump(folder: Path, step: int, lane: int) -> dict[str, Any]:
    (path,) = (folder / f"step{step}").glob(f"*/{records.lane_folder(lane)}/dump.json")
    data: dict[str, Any] = json.loads(path.read_text())["data"]
    return data


def _first_input(dump: dict[str, Any]) -> dict[str, Any]:
    arg: dict[str, Any] = dump[FIRST_LINEAR]["input_args"][0]
    return arg


def _ids(rule: capture.CaptureRule, want: bool, n: int) -> list[str]:
    """``n`` verl-style ids (32 hex) with the vLLM suffix whose capture decision is ``want``."""
    out = []
    i = 0
    while len(out) < n:
        base = f"{i:032x}"
        if rule.captures(base) is want:
            out.append(f"{base}-{i % 256:08x}")
        i += 1
    return out


def test_attention_states_of_the_pinned_release(attn_states):
    # the hook's phase rule and the records' attn_state names rest on these members (the same
    # five in vllm-ascend 0.18.0 and 0.23.0.post1, attention/attention_v1.py)
    assert attn_states == [
        "PrefillNoCache",
        "PrefillCacheHit",
        "DecodeOnly",
        "ChunkedPrefill",
        "SpecDecoding",
    ]


def test_capture_all_logs_every_step_with_msprobes_step_and_per_pid_folder(tmp_path, vllm_src, attn_states):
    run = tmp_path / "run"
    cfg = tmp_path / "rollout.json"
    _write_config(cfg, tmp_path / "config-root")
    a, b, c = "req-a-0000abcd", "req-b-0000abcd", "req-c-0000abcd"
    steps = [
        {
            "attn_state": "PrefillNoCache",
            "new": [{"id": a, "prompt": 5, "tokens": 5}, {"id": b, "prompt": 3, "tokens": 3}],
        },
        {"attn_state": "DecodeOnly", "cached": [{"id": a, "tokens": 1}, {"id": b, "tokens": 1}]},
        {
            "attn_state": "ChunkedPrefill",
            "new": [{"id": c, "prompt": 4, "tokens": 4}],
            "cached": [{"id": a, "tokens": 1}, {"id": b, "tokens": 1}],
        },
        {"attn_state": "SpecDecoding", "cached": [{"id": a, "tokens": 2}]},
    ]
    scenario = {"vllm_src": str(vllm_src), "attn_states": attn_states, "config": str(cfg), "steps": steps}
    result = _run(tmp_path, scenario, {"VERL_CONSISTENCY_RUN_DIR": str(run), CAPTURE: "all"})

    folder = run / "rollout" / str(result["pid"])
    assert result["dump_path"] == str(folder)
    assert not (tmp_path / "config-root").exists(), "the config's dump_path is overridden by the run dir"
    recs = _records(folder)
    assert [r.step for r in recs] == [0, 1, 2, 3] == _step_folders(folder)
    assert [r.runner_step for r in recs] == [0, 1, 2, 3]
    assert all(r.dumped and r.scoped_request_id is None for r in recs)
    assert all(r.dump_path == f"rollout/{result['pid']}" and r.pid == result["pid"] for r in recs)
    assert [r.phase for r in recs] == ["prefill", "decode", "prefill", "prefill"]
    assert [r.attn_state for r in recs] == ["PrefillNoCache", "DecodeOnly", "ChunkedPrefill", "SpecDecoding"]
    assert [r.total_num_scheduled_tokens for r in recs] == [8, 2, 6, 2]
    first = recs[0].requests
    assert [(q.request_id, q.type, q.tokens, q.prompt_tokens, q.num_computed_tokens) for q in first] == [
        (a, "new", 5, 5, 0),
        (b, "new", 3, 3, 0),
    ]
    assert [(q.request_id, q.type, q.tokens) for q in recs[2].requests] == [
        (c, "new", 4),
        (a, "cached", 1),
        (b, "cached", 1),
    ]
    # each record's step holds the whole step: all 8 packed rows of step 0
    assert _first_input(_dump(folder, 0))["shape"] == [8, HIDDEN]
    assert result["second_finish"] == [False] * 4, "finish() must answer True once per start"
    # the recipe's field names are on the wire
    raw = orjson.loads((folder / DISPATCH_LOG).read_bytes().splitlines()[0])
    assert {"source", "timestamp", "pid", "rank", "step", "phase", "total_num_scheduled_tokens"} <= raw.keys()
    assert raw["source"] == "dispatch_logger"
    assert set(raw["requests"][0]) >= {"request_id", "type", "tokens"}


def test_selective_skips_decode_uncaptured_and_partial_prefills_and_keeps_steps_aligned(
    tmp_path, vllm_src, attn_states
):
    rule = capture.parse("fraction:0.5")
    cap1, cap2, cap3, cap4, cap5, cap6 = _ids(rule, True, 6)
    unc1, unc2 = _ids(rule, False, 2)
    steps = [
        # 0: a prefill of an uncaptured request only
        {"attn_state": "PrefillNoCache", "new": [{"id": unc1, "prompt": 6, "tokens": 6}]},
        # 1: decode
        {"attn_state": "DecodeOnly", "cached": [{"id": unc1, "tokens": 1}]},
        # 2: mixed: cap1's whole prompt next to unc1's decode token. The scheduler's dict lists
        #    cap1 first, but the runner packs unc1 first: the dump must follow the batch order.
        {
            "attn_state": "ChunkedPrefill",
            "new": [{"id": cap1, "prompt": 5, "tokens": 5}],
            "cached": [{"id": unc1, "tokens": 1}],
            "scheduler_order": [{"id": cap1, "tokens": 5}, {"id": unc1, "tokens": 1}],
            "batch_order": [unc1, cap1],
            "fills": {unc1: -50.0, cap1: 2.0},
        },
        # 3: decode of a captured request
        {"attn_state": "DecodeOnly", "cached": [{"id": unc1, "tokens": 1}, {"id": cap1, "tokens": 1}]},
        # 4: captured, but a prefix-cache hit: only 4 of 20 prompt tokens computed here
        {"attn_state": "PrefillCacheHit", "new": [{"id": cap2, "prompt": 20, "computed": 16, "tokens": 4}]},
        # 5: captured, but chunked: 8 of 20 prompt tokens
        {"attn_state": "ChunkedPrefill", "new": [{"id": cap3, "prompt": 20, "tokens": 8}]},
        # 6: a batched prefill: uncaptured unc2 first, then captured cap4
        {
            "attn_state": "PrefillNoCache",
            "new": [{"id": unc2, "prompt": 3, "tokens": 3}, {"id": cap4, "prompt": 4, "tokens": 4}],
            "fills": {unc2: -50.0, cap4: 3.0},
        },
        # 7: a batched prefill of two captured requests: each gets a lane of its own
        {
            "attn_state": "PrefillNoCache",
            "new": [{"id": cap5, "prompt": 2, "tokens": 2}, {"id": cap6, "prompt": 6, "tokens": 6}],
            "fills": {cap5: 4.0, cap6: 5.0},
        },
    ]
    run = tmp_path / "run"
    cfg = tmp_path / "rollout.json"
    _write_config(cfg, tmp_path / "unused")
    scenario = {"vllm_src": str(vllm_src), "attn_states": attn_states, "config": str(cfg), "steps": steps}
    result = _run(tmp_path, scenario, {"VERL_CONSISTENCY_RUN_DIR": str(run), CAPTURE: "fraction:0.5"})

    folder = run / "rollout" / str(result["pid"])
    recs = _records(folder)
    assert [r.runner_step for r in recs] == list(range(8)), "every step is logged, dumped or not"
    assert [r.dumped for r in recs] == [False, False, True, False, False, False, True, True]
    lanes = [r.lane_request_ids for r in recs]
    assert lanes == [None, None, [cap1], None, None, None, [cap4], [cap5, cap6]]
    assert all(r.scoped_request_id is None for r in recs)
    dumped = [r for r in recs if r.dumped]
    assert [r.step for r in dumped] == [0, 1, 2] == _step_folders(folder), (
        "msprobe folders align with records"
    )
    assert all(r.dump_path is None for r in recs if not r.dumped)
    # an undumped record carries the step number the next dumped step takes
    assert [r.step for r in recs] == [0, 0, 0, 1, 1, 1, 1, 2]
    # one lane per captured request: only its rows are in its dump, found by batch order
    for step, lane, n_rows, fill in [(0, 0, 5, 2.0), (1, 0, 4, 3.0), (2, 0, 2, 4.0), (2, 1, 6, 5.0)]:
        arg = _first_input(_lane_dump(folder, step, lane))
        assert arg["shape"] == [n_rows, HIDDEN]
        assert arg["Min"] == arg["Max"] == fill
    # a lane step writes no whole-step dump beside its lanes
    assert not list((folder / "step2").glob("*/dump.json"))
    assert result["second_finish"] == [False] * 8


def test_dump_path_survives_config_reload(tmp_path, vllm_src, attn_states):
    cfg = tmp_path / "rollout.json"
    _write_config(cfg, tmp_path / "root")
    step = {"attn_state": "PrefillNoCache", "new": [{"id": "r-0000abcd", "prompt": 3, "tokens": 3}]}
    scenario = {
        "vllm_src": str(vllm_src),
        "attn_states": attn_states,
        "config": str(cfg),
        "steps": [step, step, step],
        "edit_config_before": 1,
        "edited_dump_root": str(tmp_path / "edited"),
    }
    # no run dir: the per-pid folder goes under the config's own dump_path (the recipe's layout)
    result = _run(tmp_path, scenario, {CAPTURE: "all"})
    assert result["reloaded"], "msprobe did not reload the edited config; the test proves nothing"
    folder = tmp_path / "root" / str(result["pid"])
    assert result["final_dump_path"] == str(folder)
    assert _step_folders(folder) == [0, 1, 2]
    assert [r.step for r in _records(folder)] == [0, 1, 2]
    assert not (tmp_path / "edited").exists()


def test_recipe_redirect_is_lost_on_config_reload(tmp_path, vllm_src, attn_states):
    """Why the patch passes ``dump_path=`` to the constructor: the recipe's redirect is undone."""
    cfg = tmp_path / "rollout.json"
    _write_config(cfg, tmp_path / "root")
    step = {"attn_state": "PrefillNoCache", "new": [{"id": "r-0000abcd", "prompt": 3, "tokens": 3}]}
    per_pid = tmp_path / "root" / "per-pid"
    scenario = {
        "vllm_src": str(vllm_src),
        "attn_states": attn_states,
        "config": str(cfg),
        "steps": [step, step],
        "edit_config_before": 1,
        "edited_dump_root": str(tmp_path / "root"),  # same root, only the mtime changes
        "recipe_redirect": str(per_pid),
    }
    result = _run(tmp_path, scenario, {})
    assert result["reloaded"]
    assert _step_folders(per_pid) == [0]
    assert _step_folders(tmp_path / "root") == [1], "after the reload the dump left the per-pid folder"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
