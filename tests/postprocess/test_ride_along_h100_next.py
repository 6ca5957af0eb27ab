"""``verl-consistency run hybrid`` ride-along on an H100, with and without a planted weight-sync fault,
re-paired on CPU: the layer view and the per-tensor weight check (issue 42) side by side.

``fixtures/h100-next-weights-ride.tar.xz`` and ``fixtures/h100-next-weights-fault.tar.xz`` are the run
folders ``bench/gpu/verl_gpu.sh ride`` brought back from one NVIDIA H100 80GB on 2026-12-07 (main
11d51d1; ``bench/results/gpu-2026-12-07/``, its README says how): ``VERL_CONSISTENCY_PIN_SET=next
verl-consistency run hybrid --device cuda --capture fraction:1`` under verl 0.9.1's own ``main_ppo``
(vLLM 0.23.0, the FSDP actor with SDPA, GRPO, a random bf16 Qwen2 of 4 layers and width 512, 8 prompts
x n=2 a step, micro batch 8 on both sides), a ride-along collection (full responses, the weights
move), msprobe statistics L0, the weight check on (every sync fingerprinted tensor by tensor as the
trainer exported it, as each vLLM worker received it, and where vLLM's model holds it). The fault
run (``FAULT=1 STEPS=4``) applied ``bench/gpu/faults/skip-down-proj.patch`` to the staged verl: every
weight sync after the first skips ``model.layers.2.mlp.down_proj.weight``. Each folder is what
``bench/gpu/trim_run.py --max-pairs 24`` left (the shortest prompts), trimmed again to the two shortest
of each step (``--per-step 2 --max-mib 16 --min-pairs 1``: 16 and 8 pairs, each ~1.4 s of msprobe
compare in CI); the weight records and the token view are whole. Both travel packed (~0.1 MB as
xz) and go through the real CLI here: ``postprocess`` (pair, compare with msprobe, weight check,
report, bundle), ``verify``, ``extract``. (They replace the 2026-12-06 runs of the same command,
made before the weight check.)

What the device's own postprocess of the whole runs said (``bench/results/gpu-2026-12-07/*/summary.md``):
- ride-along, 8 steps: 128 of 128 requests paired, all healthy; weights 0-7 at steps 1-8; worst
  relative error 0.0044-0.0073 a step; mean |delta log p| 0.0024-0.0029; grad_norm 3.55-4.11; the 9
  weight syncs (labels 0-8, 51 tensors each) all exact;
- fault, 4 steps: 64 of 64 paired; step 1 16 healthy, steps 2-4 16 of 16 diverged each, first at
  ``layers.2.mlp``; mean |delta log p| 0.0028 then 0.105-0.116; the weight check names
  ``model.layers.2.mlp.down_proj.weight`` at every version from 1 (on CUDA verl's level-2 sleep
  frees the weights, so the skipped tensor holds whatever the re-mapped memory held: ``wrong_values``
  that "match no version this worker loaded", where a level-1 sleep would leave it ``stale``).
When committed, each re-paired pair had the verdict and first divergence the device's summary gave
it. When the statistics thresholds change, the verdicts below change with them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.postprocess.gpu_runs import (
    FIXTURES,
    Repaired,
    assert_fault_pairs,
    assert_weights_move,
    repair,
    unpack,
)
from verl_consistency.postprocess.compare.verdict import DIVERGED_REL_ERR, HEALTHY_REL_ERR

pytestmark = pytest.mark.msprobe


RIDE_ID = "h100-next-weights-ride"
FAULT_ID = "h100-next-weights-fault"
ARCHIVES = {RIDE_ID: f"{RIDE_ID}.tar.xz", FAULT_ID: f"{FAULT_ID}.tar.xz"}
STEPS = {RIDE_ID: 8, FAULT_ID: 4}
RESPONSES = 16
"""A step's requests: 8 prompts x n=2, one response each."""
M8 = (
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
)
LAYERS = 4
FAULT_MODULE = "model.layers.2.mlp.down_proj"
FAULT_TENSOR = f"{FAULT_MODULE}.weight"
TENSORS = 51
"""What one sync exports of the 4-layer Qwen2 (tied embedding: lm_head is not sent)."""

# The device's summary.md of the whole ride-along run (128 pairs), per step 1-8.
RIDE_WORST_REL_ERR = (0.0073, 0.0047, 0.0055, 0.0046, 0.0044, 0.0054, 0.0044, 0.0071)
RIDE_MEAN_ABS_LOGP = (0.0026, 0.0029, 0.0028, 0.0024, 0.0028, 0.0026, 0.0027, 0.0027)
RIDE_TRIMMED_PAIRS = (2,) * 8
"""What trim_run.py kept of each step's 16 (the two shortest prompts of each)."""
# ... and of the fault run (64 pairs), per step 1-4.
FAULT_MEAN_ABS_LOGP = (0.0028, 0.1096, 0.1164, 0.1051)
FAULT_TRIMMED_PAIRS = (2, 2, 2, 2)


@pytest.fixture(scope="module")
def ride(tmp_path_factory: pytest.TempPathFactory) -> Repaired:
    return repair(ARCHIVES[RIDE_ID], RIDE_ID, tmp_path_factory)


@pytest.fixture(scope="module")
def fault(tmp_path_factory: pytest.TempPathFactory) -> Repaired:
    return repair(ARCHIVES[FAULT_ID], FAULT_ID, tmp_path_factory)


@pytest.mark.parametrize("run_id", sorted(ARCHIVES))
def test_fixtures_are_ride_along_runs_of_verls_own_driver(run_id: str, tmp_path: Path) -> None:
    assert (FIXTURES / ARCHIVES[run_id]).stat().st_size <= 256 * 2**10, "a committed fixture stays small"
    run_dir = unpack(ARCHIVES[run_id], run_id, tmp_path)
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["run_id"], run["kind"], run["collection"]) == (run_id, "collection", "ride-along")
    assert (run["mode"], run["trainer_mode"], run["dump_phase"]) == ("hybrid", "sync", "log_prob")
    assert (run["verl_module"], run["device"], run["pin_set"], run["exit_code"]) == (
        "verl.trainer.main_ppo",
        "cuda",
        "next",
        0,
    )
    assert (run["installed"]["verl"], run["installed"]["vllm"]) == ("0.9.1", "0.23.0")
    assert "--ride-along" in run["invocation"]
    assert set(M8) <= set(run["invocation"]), "the user's micro batch of 8 on both sides"
    assert_weights_move(run["steps"], STEPS[run_id])
    for s in run["steps"]:
        assert s["not_finite"] == []


def _per_step(r: Repaired) -> list[dict[str, Any]]:
    per_step: list[dict[str, Any]] = r.summary["per_step"]
    assert [s["global_step"] for s in per_step] == [s["step"] for s in r.run["steps"]]
    for s, logged in zip(per_step, r.run["steps"], strict=True):
        assert s["weight_version"] == s["global_step"] - 1, "step s ran the weights of version s - 1"
        assert s["grad_norm"] == logged["grad_norm"]
        assert s["responses"] == RESPONSES
    return per_step


def _trimmed(r: Repaired, run_id: str, kept: tuple[int, ...], dispatch: int, decode_only: int) -> None:
    """Every request pairs but those whose dumps the trim dropped, with weight versions 0.. per step."""
    p = r.manifest["pairing"]
    actor_dumps = len(list((r.run_dir / "actor").rglob("dump.json")))
    assert p["pairs"] == actor_dumps == sum(kept)
    requests = STEPS[run_id] * RESPONSES
    assert (p["requests_seen"], p["dispatch_records"], p["actor_records"]) == (
        requests,
        dispatch,
        2 * STEPS[run_id],
    )
    gone = requests - p["pairs"]
    assert p["requests_unpaired"] == gone
    assert p["unpaired_counts"] == {
        "actor_step": {"dump_missing": gone},
        "request": {"decode_only": 0, "dump_missing": gone, "no_rollout_prefill": 0},
        "rollout_step": {"decode_only": decode_only, "dump_missing": gone},
    }
    assert {pair["backend"] for pair in r.manifest["pairs"]} == {"fsdp"}
    versions = Counter(pair["weight_version"] for pair in r.manifest["pairs"])
    assert versions == dict(enumerate(kept)), "weight versions 0.., as many pairs as each step kept"


def test_ride_along_pairs_every_request_the_trim_kept(ride: Repaired) -> None:
    _trimmed(ride, RIDE_ID, RIDE_TRIMMED_PAIRS, dispatch=144, decode_only=127)


def test_ride_along_healthy_at_every_step_as_the_weights_move(ride: Repaired) -> None:
    per_step = _per_step(ride)
    assert [s["pairs"] for s in per_step] == list(RIDE_TRIMMED_PAIRS)
    for s, worst, logp in zip(per_step, RIDE_WORST_REL_ERR, RIDE_MEAN_ABS_LOGP, strict=True):
        assert s["verdicts"] == {"healthy": s["pairs"], "suspicious": 0, "diverged": 0, "failed": 0}
        assert s["first_divergence"] is None
        assert s["worst_rel_err"] <= worst + 5e-5, "a subset of the device's pairs: no worse than all"
        assert round(s["mean_abs_logp_diff"], 4) == logp, "the token view is the whole run's"
    assert (ride.summary["overall"], ride.summary["drift"]) == ("healthy", "step 1+: healthy")
    cs = ride.manifest["comparisons"]
    assert Counter(c["verdict"] for c in cs) == {"healthy": sum(RIDE_TRIMMED_PAIRS)}
    for c in cs:
        assert (c["status"], c["task"], c["first_divergence"]) == ("ok", "statistics", None)
        assert 0.001 < c["max_rel_err"] <= HEALTHY_REL_ERR, "two bf16 engines: close, not equal"
        labels = [x["label"] for x in c["layer_profile"]]
        assert labels == ["embed", *(str(i) for i in range(LAYERS)), "head"]
        assert c["output"]["status"] == "ok"
        assert c["output"]["abs_diff"] < 0.016, "|delta log p| of the next token"
    assert 'id="per-step"' in ride.report


def test_ride_along_every_weight_sync_exact_tensor_by_tensor(ride: Repaired) -> None:
    """verl's FSDP engine exports fp32 and vLLM holds bf16: each of the 9 syncs (the checkpoint's
    and one after each of the 8 steps) is compared after the loader's rounding, and nothing differs."""
    versions = ride.summary["weights"]["versions"]
    assert [v["version"] for v in versions] == list(range(STEPS[RIDE_ID] + 1))
    for v in versions:
        assert (v["exported"], v["compared"], v["not_checked"], v["differing"]) == (TENSORS, TENSORS, 0, [])
        assert v["diverged_pairs"] == 0
    assert [v["pairs"] for v in versions] == [*RIDE_TRIMMED_PAIRS, 0]
    assert "all 9 syncs exact" in ride.summary_md
    rows = (ride.results / "weights.csv").read_text().splitlines()
    assert len(rows) == 1, "a header, no differing tensor"


def test_fault_pairs_every_request_the_trim_kept(fault: Repaired) -> None:
    _trimmed(fault, FAULT_ID, FAULT_TRIMMED_PAIRS, dispatch=72, decode_only=64)


def test_fault_named_at_its_module_from_the_first_step_it_affects(fault: Repaired) -> None:
    """Step 1 ran the first sync's weights (all of them): healthy. Every later sync skipped one
    tensor, so from step 2 every pair diverges, first at the module that tensor belongs to."""
    first, *later = _per_step(fault)
    assert [s["pairs"] for s in (first, *later)] == list(FAULT_TRIMMED_PAIRS)
    assert first["verdicts"] == {"healthy": first["pairs"], "suspicious": 0, "diverged": 0, "failed": 0}
    assert first["first_divergence"] is None
    assert first["worst_rel_err"] <= HEALTHY_REL_ERR
    for s in later:
        assert s["verdicts"] == {"healthy": 0, "suspicious": 0, "diverged": s["pairs"], "failed": 0}
        assert (s["first_divergence"], s["first_divergence_module"]) == ("layers.2.mlp", FAULT_MODULE)
        assert s["first_divergence_pairs"] == s["pairs"]
        assert s["worst_rel_err"] > DIVERGED_REL_ERR
    logp = [round(s["mean_abs_logp_diff"], 4) for s in (first, *later)]
    assert logp == list(FAULT_MEAN_ABS_LOGP)
    assert min(logp[1:]) > 30 * logp[0], "the token view moves with it"
    assert (fault.summary["overall"], fault.summary["drift"]) == (
        "diverged",
        "step 1: healthy · step 2+: diverged at layers.2.mlp",
    )
    diverged = sum(FAULT_TRIMMED_PAIRS[1:])
    assert (
        f"Most common first divergence: `{FAULT_MODULE}` ({diverged} of {sum(FAULT_TRIMMED_PAIRS)} pairs)"
        in fault.summary_md
    )
    cs = fault.manifest["comparisons"]
    assert Counter(c["verdict"] for c in cs) == {"healthy": FAULT_TRIMMED_PAIRS[0], "diverged": diverged}
    assert_fault_pairs(fault.manifest, FAULT_MODULE, layer=2)


def test_fault_tensor_named_from_its_first_version_beside_the_layers(fault: Repaired) -> None:
    """The weight check names the skipped tensor itself, at every sync that skipped it (versions
    1-4; version 4 is the sync after the last step: no pair ran it), and nothing else; the pairs
    that ran those weights diverged first at that tensor's module."""
    versions = fault.summary["weights"]["versions"]
    assert [v["version"] for v in versions] == list(range(STEPS[FAULT_ID] + 1))
    v0, *skipped = versions
    assert (v0["compared"], v0["differing"], v0["diverged_pairs"]) == (TENSORS, [], 0)
    for v, pairs in zip(skipped, [*FAULT_TRIMMED_PAIRS[1:], 0], strict=True):
        assert v["compared"] == TENSORS
        (d,) = v["differing"]
        assert (d["tensor"], d["kind"], d["first_version"]) == (FAULT_TENSOR, "wrong_values", 1)
        assert "not in this sync" in d["detail"]
        assert (v["pairs"], v["diverged_pairs"]) == (pairs, pairs)
        assert v["first_divergence"] == ("layers.2.mlp" if pairs else None)
    assert f"{FAULT_TENSOR} wrong_values from version 1" in fault.summary_md
    rows = (fault.results / "weights.csv").read_text().splitlines()[1:]
    assert len(rows) == STEPS[FAULT_ID], "one row per version that skipped it"
    assert all(FAULT_TENSOR in r for r in rows)
