"""The patched real verl FSDP engine of the pin set in force, on CPU, with real mindstudio-probe dumps.

Each test runs ``bench/support/fsdp_driver.py`` in a subprocess against a freshly patched verl
(0.8.0 on the current set, 0.9.1 on next; a tiny random Qwen2, gloo world size 1) and checks what
landed on disk. On the next set one more test sends the batch through verl 0.9's V1 data path
(a real TransferQueue) first.
"""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.support.verl_support import run_patched, series_has
from verl_consistency.contracts import capture, pins, records

DRIVER = Path(__file__).resolve().parents[2] / "bench" / "support" / "fsdp_driver.py"
PROMPT_VALID = [6, 4, 5, 3]
pytestmark = [pytest.mark.timeout(300), pytest.mark.pinset]


def _msprobe_config(path: Path, dump_path: Path, summary_mode: str = "statistics") -> Path:
    path.write_text(
        json.dumps(
            {
                "task": "statistics",
                "dump_path": str(dump_path),
                "rank": [],
                "step": [],
                "level": "L0",
                "async_dump": False,
                "statistics": {
                    "scope": [],
                    "list": [],
                    "tensor_list": [],
                    "data_mode": ["all"],
                    "summary_mode": summary_mode,
                },
            }
        )
    )
    return path


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _drive(root: Path, work: Path, **env: str) -> dict[str, Any]:
    out = run_patched(
        root,
        f"import runpy; runpy.run_path({str(DRIVER)!r}, run_name='__main__')",
        env={"VC_TEST_WORK": str(work), "VC_TEST_PORT": _free_port(), **env},
    )
    line = next(x for x in out.splitlines() if x.startswith("VC_REPORT "))
    return json.loads(line.removeprefix("VC_REPORT "))


def _dumping_drive(root: Path, work: Path, run_dir: Path, cfg: Path, **env: str) -> dict[str, Any]:
    """:func:`_drive` with the training-side dump on, into ``run_dir``; the run must end finite."""
    report = _drive(
        root,
        work,
        DUMP_ON="1",
        VERL_CONSISTENCY_ACTOR_CONFIG=str(cfg),
        VERL_CONSISTENCY_RUN_DIR=str(run_dir),
        **env,
    )
    assert report["error"] is None
    assert report["finite"]
    return report


def _records(run_dir: Path) -> list[records.UpdateActorRecord]:
    logs = list((run_dir / "actor").glob(f"*/{records.UPDATE_ACTOR_LOG}"))
    assert len(logs) == 1, logs
    return [records.UpdateActorRecord.model_validate_json(x) for x in logs[0].read_text().splitlines()]


def _embed_tokens(dump_json: Path) -> int:
    """Number of tokens the micro batch's forward saw (the embedding output's packed length)."""
    data = json.loads(dump_json.read_text())["data"]
    key = next(k for k in data if ".embed_tokens." in k and ".forward." in k)
    return int(data[key]["output"][0]["shape"][1])


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fsdp-work")


def test_one_dump_per_micro_batch_in_both_phases_with_prompts_only(
    root: Path, model_cache: Path, tmp_path: Path
):
    run_dir = tmp_path / "dumps" / "hybrid-20261129-000000-abcd"
    cfg = _msprobe_config(tmp_path / "msprobe_actor.json", tmp_path / "unused")
    report = _dumping_drive(root, model_cache, run_dir, cfg, DUMP_PHASE="all", VC_TEST_TRIM="ours")
    assert report["old_log_probs_finite"]
    assert report["advantages_abs_max"] == 0.0, "the re-split response carries no reward"

    recs = _records(run_dir)
    ids = report["request_ids"]
    assert [r.phase for r in recs] == ["log_prob"] * 4 + ["update_actor"] * 4
    assert [r.step for r in recs] == list(range(8)), "step is msprobe's current_iter, one per micro batch"
    assert [r.request_ids for r in recs] == [[i] for i in ids] * 2
    assert all(r.backend == "fsdp" and r.rank == 0 and r.num_requests == 1 for r in recs)
    assert recs[0].model_extra is not None
    assert recs[0].model_extra["request_ids_all"][0][0] == ids[0]
    assert len(recs[0].model_extra["request_ids_all"][0]) == 2, "the resumed sample keeps both ids"

    pid_dirs = list((run_dir / "actor").iterdir())
    assert len(pid_dirs) == 1
    assert recs[0].dump_path == f"actor/{pid_dirs[0].name}", "dump_path is relative to the run folder"
    dumps = sorted((run_dir / recs[0].dump_path).glob("step*/*/dump.json"))
    assert len(dumps) == 8, "one dump.json per micro batch, nothing else"
    for rec in recs:
        (dump,) = (run_dir / rec.dump_path).glob(f"step{rec.step}/*/dump.json")
        # PROMPTS_ONLY: each micro batch's forward covers exactly its prompt's tokens
        assert _embed_tokens(dump) == PROMPT_VALID[rec.step % 4]
        has_backward = any(".backward." in k for k in json.loads(dump.read_text())["data"])
        assert has_backward == (rec.phase == "update_actor")


def test_recipe_trim_to_zero_response_tokens_gives_nan_loss(root: Path, model_cache: Path):
    """The recipe bug our trim fixes, reproduced on the same real engine and loss."""
    report = _drive(root, model_cache, VC_TEST_TRIM="recipe")
    assert report["error"] is not None or not report["finite"]


def test_capture_mode_and_a_borrowed_debugger(root: Path, model_cache: Path, tmp_path: Path):
    """Default phase (log_prob) only; fraction capture; msprobe's singleton created by someone else first."""
    run_dir = tmp_path / "dumps" / "async-20261129-000000-abcd"
    cfg = _msprobe_config(tmp_path / "msprobe_actor.json", tmp_path / "unused")
    other_cfg = _msprobe_config(tmp_path / "other.json", tmp_path / "ignored", summary_mode="md5")
    report = _drive(
        root,
        model_cache,
        DUMP_ON="1",
        VERL_CONSISTENCY_ACTOR_CONFIG=str(cfg),
        VERL_CONSISTENCY_RUN_DIR=str(run_dir),
        VERL_CONSISTENCY_CAPTURE="fraction:0.3",
        VC_TEST_BORROW="1",
        VC_TEST_OTHER_CONFIG=str(other_cfg),
    )
    assert report["error"] is None
    assert report["finite"]
    rule = capture.parse("fraction:0.3")
    captured = [i for i in report["request_ids"] if rule.captures(i)]
    assert 0 < len(captured) < len(report["request_ids"]), "fixture ids must split"

    recs = _records(run_dir)
    assert [r.request_ids for r in recs] == [[i] for i in captured]
    assert {r.phase for r in recs} == {"log_prob"}
    # msprobe's counter is shared with the owner, who dumped step 0 first
    assert [r.step for r in recs] == list(range(1, 1 + len(captured)))
    actor_steps = sorted(
        p.parent.parent.name for p in (run_dir / recs[0].dump_path).glob("step*/*/dump.json")
    )
    assert actor_steps == [f"step{r.step}" for r in recs]
    for rec in recs:
        (dump,) = (run_dir / rec.dump_path).glob(f"step{rec.step}/*/dump.json")
        text = dump.read_text()
        assert '"Max"' in text
        assert '"md5"' not in text, "the actor's own config, not the owner's"

    other = Path(str(model_cache / "other-owner"))
    other_steps = sorted(p.parent.parent.name for p in other.glob("step*/*/dump.json"))
    assert other_steps == ["step0", f"step{1 + len(captured)}"], "the owner keeps its folder and steps"
    assert all('"md5"' in p.read_text() for p in other.glob("step*/*/dump.json"))
    assert report["other_config_dump_path"] == str(other)


@pytest.mark.skipif(pins.get("set.name") != "next", reason="verl 0.8.0 has no V1 trainer data path")
def test_v1_transfer_queue_path_dumps_every_micro_batch_with_its_ids(
    root: Path, model_cache: Path, tmp_path: Path
):
    """verl 0.9's V1 path: upstream keeps the ids inside ``extra_fields`` (one dict per row), patch
    0001 lifts them into fields of their own; the trainer's padding row copies row 0's fields.
    No PROMPTS_ONLY here (ride-along): each one-row micro batch is cut to its prompt rows."""
    run_dir = tmp_path / "dumps" / "hybrid-20261201-000000-abcd"
    cfg = _msprobe_config(tmp_path / "msprobe_actor.json", tmp_path / "unused")
    report = _dumping_drive(root, model_cache, run_dir, cfg, DUMP_PHASE="all", VC_TEST_V1_TQ="1")
    assert report["has_request_id_column"] == series_has("verl", "0001-"), (
        "0001 lifts the id out of extra_fields"
    )
    ids = report["request_ids"]
    assert len(report["uids"]) == 4, "the trainer padded the batch"
    assert report["uids"][3].startswith("pad")

    recs = _records(run_dir)
    # the padding row's micro batch (a copy of row 0's fields, its id included) is never dumped
    assert [r.phase for r in recs] == ["log_prob"] * 3 + ["update_actor"] * 3
    assert [r.request_ids for r in recs] == [[i] for i in ids] * 2
    assert [r.step for r in recs] == list(range(6))
    assert recs[0].model_extra is not None
    assert recs[0].model_extra["request_ids_all"] == [[ids[0], report["resumed_id"]]]
    lane = records.lane_folder(0)
    dumps = sorted((run_dir / recs[0].dump_path).glob(f"step*/*/{lane}/dump.json"))
    assert len(dumps) == 6, "one lane per dumped micro batch, nothing for the padding row"
    assert not list((run_dir / recs[0].dump_path).glob("step*/*/dump.json")), "no whole dumps"
    for rec in recs:
        assert rec.lane_request_ids == rec.request_ids
        (dump,) = (run_dir / rec.dump_path).glob(f"step{rec.step}/*/{lane}/dump.json")
        sample = ids.index(rec.request_ids[0])
        # ride-along: the forward covers prompt + response (nested 'prompts', as verl reads them);
        # the lane is the prompt's rows
        assert _embed_tokens(dump) == PROMPT_VALID[sample], "the row's prompt rows"


def _stats(dump_json: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every tensor's (shape, Max, Min, Mean, Norm) per module call, in dump order."""
    out: dict[str, list[tuple[Any, ...]]] = {}

    def walk(x: Any, found: list[tuple[Any, ...]]) -> None:
        if isinstance(x, dict):
            if x.get("type") == "torch.Tensor":
                found.append((tuple(x["shape"]), x.get("Max"), x.get("Min"), x.get("Mean"), x.get("Norm")))
            else:
                for v in x.values():
                    walk(v, found)
        elif isinstance(x, list):
            for v in x:
                walk(v, found)

    for key, entry in json.loads(dump_json.read_text())["data"].items():
        out[key] = []
        walk(entry, out[key])
    return out


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if a[0] != b[0]:
        return False
    return all(
        (x is None and y is None)
        or (x is not None and y is not None and math.isclose(x, y, rel_tol=2e-4, abs_tol=2e-5))
        for x, y in zip(a[1:], b[1:], strict=True)
    )


def _square_4d(shape: tuple[int, ...]) -> bool:
    return len(shape) == 4 and shape[-1] == shape[-2]


def _lane_run(
    root: Path, work: Path, run_dir: Path, cfg: Path, **env: str
) -> list[records.UpdateActorRecord]:
    _dumping_drive(
        root,
        work,
        run_dir,
        cfg,
        DUMP_PHASE="log_prob",
        VERL_CONSISTENCY_TOKEN_LEVEL="1",
        VC_TEST_NEXT_TOKEN="1",
        **env,
    )
    return _records(run_dir)


def _next_tokens(run_dir: Path) -> dict[str, dict[str, Any]]:
    (log,) = (run_dir / "actor").glob("*/next_token.jsonl")
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    return {r["request_id"]: r for r in recs}


ALONE = "hybrid-20261201-000000-aaaa"


@pytest.fixture(scope="module")
def alone_runs(
    root: Path, model_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], tuple[Path, list[records.UpdateActorRecord]]]:
    """Per layout, the reference: PROMPTS_ONLY micro batches of 1, each request's prompt alone
    (run once per module and layout)."""
    done: dict[str, tuple[Path, list[records.UpdateActorRecord]]] = {}

    def get(rmpad: str) -> tuple[Path, list[records.UpdateActorRecord]]:
        if rmpad not in done:
            tmp = tmp_path_factory.mktemp(f"alone-{rmpad}")
            cfg = _msprobe_config(tmp / "msprobe_actor.json", tmp / "unused")
            run_dir = tmp / ALONE
            recs = _lane_run(root, model_cache, run_dir, cfg, VC_TEST_RMPAD=rmpad)
            assert [r.num_requests for r in recs] == [1, 1, 1, 1]
            assert all(r.lane_request_ids is None for r in recs), "one prompt-only row: dumped whole"
            done[rmpad] = (run_dir, recs)
        return done[rmpad]

    return get


def _assert_lanes_equal_alone(
    alone_dir: Path,
    alone: list[records.UpdateActorRecord],
    run_dir: Path,
    recs: list[records.UpdateActorRecord],
    tokens: Callable[[Path], int] = _embed_tokens,
) -> None:
    """Every lane of ``recs`` holds, module by module, the statistics of its request's prompt
    forward alone (the embedding, every layer and the logits), and its next-token record is the
    alone one's (the last prompt position). ``tokens`` reads how many tokens a dump's forward saw
    (the engine's embedding output; Megatron's is sequence-first)."""
    by_id = {r.request_ids[0]: r for r in alone}
    order = list(by_id)
    compared, lanes = 0, []
    for rec in recs:
        assert rec.lane_request_ids is not None, "every captured row gets a lane"
        (rank,) = (run_dir / rec.dump_path / f"step{rec.step}").iterdir()
        assert not (rank / "dump.json").exists(), "no whole-batch dump beside the lanes"
        for k, rid in enumerate(rec.lane_request_ids):
            lanes.append((rec.step, rid))
            lane_json = rank / records.lane_folder(k) / "dump.json"
            lane, a = _stats(lane_json), by_id[rid]
            (ref_dump,) = (alone_dir / a.dump_path).glob(f"step{a.step}/*/dump.json")
            ref = _stats(ref_dump)
            assert lane.keys() == ref.keys()
            assert tokens(lane_json) == PROMPT_VALID[order.index(rid)], "the prompt rows only"
            for key, tensors in lane.items():
                bad = [i for i, (x, y) in enumerate(zip(tensors, ref[key], strict=True)) if not _same(x, y)]
                # the 4-D attention mask a layer is handed, and eager attention's probabilities, span
                # every token of the micro batch ([b, 1|heads, t, t]); they are not rows of a request
                # and have no vLLM counterpart. Every other tensor must match.
                bad = [i for i in bad if not _square_4d(tensors[i][0])]
                assert bad == [], f"lane {k} ({rid}) {key}: tensors {bad} differ from the prompt alone"
                compared += len(tensors)
    assert sorted(rid for _, rid in lanes) == sorted(by_id)
    assert compared > 100 * len(lanes)
    # the next-token view: one record per lane, each the request's own last prompt position
    alone_next, got_next = _next_tokens(alone_dir), _next_tokens(run_dir)
    assert sorted(got_next) == sorted(alone_next)
    steps = dict((rid, step) for step, rid in lanes)
    for rid, got in got_next.items():
        want = alone_next[rid]
        assert got["step"] == steps[rid]
        assert (got["token"], got["train_argmax"]) == (want["token"], want["train_argmax"])
        assert math.isclose(got["rollout_log_prob"], want["rollout_log_prob"], rel_tol=1e-6), rid
        assert math.isclose(got["train_log_prob"], want["train_log_prob"], rel_tol=1e-3, abs_tol=1e-4), rid


@pytest.mark.parametrize("rmpad", ["1", "0"], ids=["thd", "padded"])
def test_packed_micro_batch_dumps_one_lane_per_request_equal_to_the_request_alone(
    root: Path, model_cache: Path, tmp_path: Path, rmpad: str, alone_runs: Any
):
    """PROMPTS_ONLY: a micro batch of 4 (verl's packed THD layout, or its padded one) against
    micro batches of 1. Each lane holds its request's whole (prompt-only) row."""
    alone_dir, alone = alone_runs(rmpad)
    cfg = _msprobe_config(tmp_path / "msprobe_actor.json", tmp_path / "unused")
    packed_dir = tmp_path / "packed" / "hybrid-20261201-000000-bbbb"
    packed = _lane_run(root, model_cache, packed_dir, cfg, VC_TEST_MICRO="4", VC_TEST_RMPAD=rmpad)
    (rec,) = packed
    assert rec.num_requests == 4
    assert rec.lane_request_ids == rec.request_ids, "every captured row gets a lane, in row order"
    _assert_lanes_equal_alone(alone_dir, alone, packed_dir, packed)


@pytest.mark.parametrize("micro", ["4", "1"], ids=["packed", "one-row"])
@pytest.mark.parametrize("rmpad", ["1", "0"], ids=["thd", "padded"])
def test_ride_along_lanes_are_the_prompt_rows_of_a_prompt_and_response_forward(
    root: Path, model_cache: Path, tmp_path: Path, rmpad: str, micro: str, alone_runs: Any
):
    """Ride-along (no PROMPTS_ONLY): the forward covers each request's prompt and response.

    Attention is causal, so each row's prompt positions are its prompt's forward alone: every
    lane, cut to them, equals the PROMPTS_ONLY run of that prompt alone, and the output row is
    the last prompt position, with vLLM's token read from ``responses[:, 0]``. A micro batch of
    one row is cut too (its forward is longer than the prompt).
    """
    alone_dir, alone = alone_runs(rmpad)
    cfg = _msprobe_config(tmp_path / "msprobe_actor.json", tmp_path / "unused")
    run_dir = tmp_path / "ride" / "hybrid-20261201-000000-cccc"
    recs = _lane_run(
        root, model_cache, run_dir, cfg, VC_TEST_TRIM="none", VC_TEST_MICRO=micro, VC_TEST_RMPAD=rmpad
    )
    ids = [r.request_ids[0] for r in alone]
    assert [x for r in recs for x in r.request_ids] == ids
    assert [x for r in recs for x in (r.lane_request_ids or [])] == ids, "every request its own lane"
    _assert_lanes_equal_alone(alone_dir, alone, run_dir, recs)
