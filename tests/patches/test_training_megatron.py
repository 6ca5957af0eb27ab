"""verl's real Megatron engine on CPU: each request's lane of a micro batch equals its prompt alone.

``megatron_driver.py`` builds verl's own ``MegatronEngineWithLMHead`` (megatron-core 0.16.1 and
mbridge 0.15.1, verl's Hydra defaults, its bshd layout) on the tiny random Qwen2 of the FSDP tests,
with the driver's named CPU stand-ins, and runs the old log-probs pass (``infer_batch``) and one
actor update with the training-side dump on. The reference is each request's prompt alone: a
PROMPTS_ONLY micro batch of one row, dumped whole. A micro batch of four (PROMPTS_ONLY), and the
ride-along forward over prompt + response (micro batches of four and of one), must give one lane
per request whose every tensor, module by module, has the statistics of that reference: Megatron's
sequence-first activations cut on their sequence dimension, its batch-first ids and logits on their
batch dimension (``hooks/training/megatron_lanes.py``); and its output row (the next-token record
read from Megatron's ``output_layer`` at the row's last prompt position) must be the alone one's
(the FSDP test's check, ``test_training_fsdp._assert_lanes_equal_alone``).
The ride-along run keeps verl 0.9.1's ``pad_bshd_to_minibatch_max`` default: every micro batch
padded past its own longest row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.support.verl_support import run_patched
from tests.patches.test_training_fsdp import (
    _assert_lanes_equal_alone,
    _free_port,
    _msprobe_config,
    _records,
)
from verl_consistency.contracts import records

DRIVER = Path(__file__).resolve().parent / "megatron_driver.py"
pytestmark = [pytest.mark.timeout(300), pytest.mark.pinset]


def _drive(root: Path, work: Path, run_dir: Path, cfg: Path, **env: str) -> dict[str, Any]:
    """One driver run with the log_prob phase dumped into ``run_dir``; it must end finite."""
    out = run_patched(
        root,
        f"import runpy; runpy.run_path({str(DRIVER)!r}, run_name='__main__')",
        env={
            "VC_TEST_WORK": str(work),
            "VC_TEST_PORT": _free_port(),
            "VC_TEST_DEVICE": "cpu",
            "DUMP_ON": "1",
            "DUMP_PHASE": "log_prob",
            "VERL_CONSISTENCY_TOKEN_LEVEL": "1",
            "VC_TEST_NEXT_TOKEN": "1",
            "VERL_CONSISTENCY_ACTOR_CONFIG": str(cfg),
            "VERL_CONSISTENCY_RUN_DIR": str(run_dir),
            **env,
        },
        timeout=280,
    )
    line = next(x for x in out.splitlines() if x.startswith("VC_REPORT "))
    report = json.loads(line.removeprefix("VC_REPORT "))
    assert report["old_log_probs_finite"], report
    assert report["finite"], report
    return report


def _embedded_tokens(dump_json: Path) -> int:
    """The tokens the dump's forward saw: the embedding's ``[s, b, h]`` output, its ``s``."""
    data = json.loads(dump_json.read_text())["data"]
    key = next(k for k in data if ".LanguageModelEmbedding.forward." in k)
    return int(data[key]["output"][0]["shape"][0])


@pytest.fixture(scope="module")
def megatron_alone(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], tuple[Path, list[records.UpdateActorRecord], Path]]:
    """The reference (once a module): each request's prompt alone, a PROMPTS_ONLY micro batch of 1."""
    done: list[tuple[Path, list[records.UpdateActorRecord], Path]] = []

    def get() -> tuple[Path, list[records.UpdateActorRecord], Path]:
        if not done:
            tmp = tmp_path_factory.mktemp("megatron-alone")
            work = tmp_path_factory.mktemp("megatron-work")
            cfg = _msprobe_config(tmp / "msprobe_actor.json", tmp / "unused")
            run_dir = tmp / "hybrid-20261207-000000-aaaa"
            _drive(root, work, run_dir, cfg)
            recs = _records(run_dir)
            assert [r.num_requests for r in recs] == [1, 1, 1, 1]
            assert all(r.backend == "megatron" and r.lane_request_ids is None for r in recs)
            done.append((run_dir, recs, work))
        return done[0]

    return get


def test_a_prompts_only_micro_batch_of_four_dumps_one_lane_per_request(
    root: Path, tmp_path: Path, megatron_alone: Any
) -> None:
    alone_dir, alone, work = megatron_alone()
    cfg = _msprobe_config(tmp_path / "msprobe_actor.json", tmp_path / "unused")
    run_dir = tmp_path / "hybrid-20261207-000000-bbbb"
    _drive(root, work, run_dir, cfg, VC_TEST_MICRO="4")
    (rec,) = _records(run_dir)
    assert rec.backend == "megatron"
    assert rec.num_requests == 4
    assert rec.lane_request_ids == rec.request_ids, "every row its lane, in row order"
    _assert_lanes_equal_alone(alone_dir, alone, run_dir, [rec], _embedded_tokens)


@pytest.mark.parametrize("micro", ["4", "1"], ids=["four", "one-row"])
def test_ride_along_lanes_are_the_prompt_rows_of_a_prompt_and_response_forward(
    root: Path, tmp_path: Path, megatron_alone: Any, micro: str
) -> None:
    """The forward covers prompt + response, padded to the mini batch's longest row (verl 0.9.1's
    default): each lane is its row's prompt positions, equal to the prompt alone."""
    alone_dir, alone, work = megatron_alone()
    cfg = _msprobe_config(tmp_path / "msprobe_actor.json", tmp_path / "unused")
    run_dir = tmp_path / "hybrid-20261207-000000-cccc"
    _drive(root, work, run_dir, cfg, VC_TEST_MICRO=micro, VC_TEST_TRIM="none", VC_TEST_PAD_BSHD_MAX="1")
    recs = _records(run_dir)
    ids = [r.request_ids[0] for r in alone]
    assert [x for r in recs for x in r.request_ids] == ids
    assert [x for r in recs for x in (r.lane_request_ids or [])] == ids, "every request its own lane"
    _assert_lanes_equal_alone(alone_dir, alone, run_dir, recs, _embedded_tokens)


def test_megatron_sync_exports_every_hf_tensor_exactly_and_then_the_moved_weights(
    root: Path, tmp_path: Path, megatron_alone: Any
) -> None:
    """The weight check's trainer side on Megatron: what verl's sync exports (mbridge's Megatron ->
    HF conversion) is fingerprinted per version. Before the update every tensor of the HF
    checkpoint is there under its HF name, its print that of the checkpoint's tensor in the
    exported dtype (an exact conversion); after a ride-along update (grad_norm > 0) the weights
    have moved."""
    from safetensors.torch import load_file

    from verl_consistency.contracts.weight_records import WeightSyncRecord
    from verl_consistency.patches.hooks.weights.fingerprint import fingerprint

    _, _, work = megatron_alone()
    cfg = _msprobe_config(tmp_path / "msprobe_actor.json", tmp_path / "unused")
    run_dir = tmp_path / "hybrid-20261207-000000-dddd"
    ride = {"VC_TEST_MICRO": "4", "VC_TEST_TRIM": "none"}
    report = _drive(root, work, run_dir, cfg, **ride, VC_TEST_WEIGHT_SYNCS="1")
    assert report["grad_norm"] > 0
    (log,) = (run_dir / "weights").glob("export-*.jsonl")
    before, after = (WeightSyncRecord.model_validate_json(x) for x in log.read_text().splitlines())
    assert (before.version, after.version) == (0, 1)
    checkpoint: dict[str, Any] = {}
    for f in sorted(work.glob("*-qwen2-mcore/*.safetensors")):
        checkpoint.update(load_file(str(f)))
    assert sorted(before.tensors) == sorted(checkpoint), "every HF tensor, by its HF name"
    dtypes = {p.dtype for p in before.tensors.values()}
    assert len(dtypes) == 1, dtypes
    import torch

    exported = getattr(torch, dtypes.pop())
    for name, got in before.tensors.items():
        want = fingerprint(checkpoint[name].to(exported), cols=False)
        assert (got.shape, got.rows) == (want.shape, want.rows), f"{name}: not the checkpoint's values"
    moved = [n for n in before.tensors if before.tensors[n].rows != after.tensors[n].rows]
    assert len(moved) > len(before.tensors) // 2, f"only {moved} moved"
