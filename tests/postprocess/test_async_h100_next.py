"""``verl-consistency run fully-async`` and ``run colocate-async`` ride-along on an H100, a planted
weight-sync fault included, re-paired on CPU.

The three fixtures are run folders ``bench/gpu/verl_gpu.sh`` brought back from one NVIDIA H100 80GB
on 2026-12-06 (main 493b466, issue 41; the run ids keep the script's ``h200-next-`` prefix; the
device's own summaries, logs and commands: ``bench/results/gpu-2026-12-06b/``). All ran verl 0.9.1's
own ``main_ppo`` (vLLM 0.23.0, the FSDP actor with SDPA, GRPO, a random bf16 Qwen2 of 4 layers and
width 512, 8 prompts x n=2 a step, micro batch 8 on both sides), a ride-along collection (full
responses, the weights move), msprobe statistics L0, ``--capture fraction:1``:

- ``h100-next-fully-async.tar.xz``: ``STEPS=10 verl_gpu.sh fullyasync``, V1 ``separate_async`` on the
  one-GPU harness (``bench/gpu/one_gpu/``: vLLM and the trainer on one card, weights through the
  checkpoint engine). The rollouter runs one version ahead: step 1 trains what weights 0 generated,
  every later step what the weights before its own generated (staleness 1).
- ``h100-next-fully-async-fault.tar.xz``: the same with ``FAULT=1 STEPS=6`` and
  ``actor_rollout_ref.actor.optim.lr=2e-3``: ``bench/gpu/faults/skip-down-proj.patch`` makes every
  sync after the first skip ``model.layers.2.mlp.down_proj.weight``. The standalone vLLM never
  sleeps, so the skipped tensor keeps version 0 and only shows once the trainer's copy moves (hence
  the higher learning rate).
- ``h100-next-colocate-async.tar.xz``: ``MODE=colocate-async STEPS=10 verl_gpu.sh ride``, V1
  ``colocate_async`` sharing the card: staleness alternates 0 and 1.

A stale request's dumped training forward ran again at its rollout's weights
(``patches/hooks/training/older_weights.py``), so every trained request pairs; the 16 that do not are the
rollouter's last batch in flight, never trained (``no_training_micro_batch``). What the device's
postprocess of the whole runs said (``summary.md`` there): fully async 160 of 176 paired, all
healthy; the fault run 96 of 112, steps 1-2 healthy and steps 3-6 diverged at
``model.layers.2.mlp.down_proj``; colocate-async 160 of 176, all healthy.

The device kept 72 pairs of each (``trim_run.py --max-pairs 72``); for CI they were trimmed to 40
(``--max-pairs 40 --max-mib 16``: the shortest prompts), then again to the two shortest of each step
(``bench/gpu/trim_run.py RUN DEST --per-step 2 --max-mib 16 --min-pairs 1``; the healthy runs' last
step had kept one): 19, 12 and 19 pairs, ~0.08 MB as xz, ~5 MB unpacked, each pair ~1.4 s of msprobe
compare in CI. The other requests re-pair as ``dump_missing``. The per-step pair counts below are
what that trim kept; the versions, staleness, worst errors and the token view are the device's. When
the statistics thresholds change, the verdicts below change with them.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.postprocess.gpu_runs import FIXTURES, Repaired, assert_fault_pairs, repair, unpack
from verl_consistency.postprocess.compare.verdict import DIVERGED_REL_ERR, HEALTHY_REL_ERR

pytestmark = pytest.mark.msprobe


RESPONSES = 16
"""A step's requests: 8 prompts x n=2, one response each; also the size of the untrained last batch."""
M8 = (
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
)
LAYERS = 4
FAULT_MODULE = "model.layers.2.mlp.down_proj"


@dataclass(frozen=True)
class Run:
    """One fixture, and what the device's summary.md of the whole run said, per step from 1."""

    archive: str
    mode: str
    trainer_mode: str
    rollout_versions: tuple[int, ...]
    """The weights each step's requests were generated with (the device's *rollout weights*)."""
    device_pairs: int
    decode_only: int
    """The device's decode-only dispatch records (kept by the trim: every record is)."""
    worst_rel_err: tuple[float, ...]
    mean_abs_logp: tuple[float, ...]
    trimmed: tuple[int, ...]
    """What the CI trim kept of each step's 16 pairs."""

    @property
    def steps(self) -> int:
        return len(self.rollout_versions)


FA_ID = "h200-next-fully-async-ride-along"
FAULT_ID = f"{FA_ID}-fault"
CA_ID = "h200-next-colocate-async-ride-along"
RUNS = {
    FA_ID: Run(
        archive="h100-next-fully-async.tar.xz",
        mode="fully-async",
        trainer_mode="separate_async",
        rollout_versions=(0, 0, 1, 2, 3, 4, 5, 6, 7, 8),
        device_pairs=160,
        decode_only=160,
        worst_rel_err=(0.0051, 0.0073, 0.0053, 0.004, 0.0044, 0.0055, 0.0057, 0.0051, 0.0057, 0.0072),
        mean_abs_logp=(0.0025, 0.0028, 0.0028, 0.0028, 0.0024, 0.0027, 0.0029, 0.0029, 0.0027, 0.0029),
        trimmed=(2, 2, 2, 2, 2, 2, 2, 2, 2, 1),
    ),
    FAULT_ID: Run(
        archive="h100-next-fully-async-fault.tar.xz",
        mode="fully-async",
        trainer_mode="separate_async",
        rollout_versions=(0, 0, 1, 2, 3, 4),
        device_pairs=96,
        decode_only=104,
        worst_rel_err=(0.0073, 0.0051, math.inf, math.inf, math.inf, math.inf),
        mean_abs_logp=(0.0026, 0.5226, 0.4703, 0.3655, 0.3079, 0.2514),
        trimmed=(2, 2, 2, 2, 2, 2),
    ),
    CA_ID: Run(
        archive="h100-next-colocate-async.tar.xz",
        mode="colocate-async",
        trainer_mode="colocate_async",
        rollout_versions=(0, 0, 2, 2, 4, 4, 6, 6, 8, 8),
        device_pairs=160,
        decode_only=101,
        worst_rel_err=(0.0049, 0.0073, 0.0055, 0.005, 0.0044, 0.0042, 0.0063, 0.0071, 0.0074, 0.0076),
        mean_abs_logp=(0.0028, 0.0025, 0.0025, 0.0025, 0.0025, 0.0025, 0.0027, 0.0027, 0.0024, 0.0027),
        trimmed=(2, 2, 2, 2, 2, 2, 2, 2, 2, 1),
    ),
}
HEALTHY_RUNS = (FA_ID, CA_ID)


@pytest.fixture(scope="module")
def repaired(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Repaired]:
    """Each fixture through postprocess, verify and extract once for the module (~30 s each)."""
    done: dict[str, Repaired] = {}

    def get(run_id: str) -> Repaired:
        if run_id not in done:
            done[run_id] = repair(RUNS[run_id].archive, run_id, tmp_path_factory)
        return done[run_id]

    return get


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _trained_step(run_dir: Path) -> dict[str, int]:
    """Request id -> the global step that trained it, from verl's own token records (not the pairing)."""
    return {r["request_id"]: r["global_step"] for r in _jsonl(run_dir / "token_mismatch.jsonl")}


def _prefill_version(run_dir: Path) -> dict[str, int]:
    """Request id -> the weight version of the vLLM prefill that first computed it (dispatch logs)."""
    out: dict[str, int] = {}
    for log in sorted((run_dir / "rollout").glob("*/dispatch_log.jsonl")):
        for rec in _jsonl(log):
            if rec["phase"] != "prefill":
                continue
            for req in rec["requests"]:
                if req["type"] == "new":
                    out.setdefault(req["request_id"].rsplit("-", 1)[0], rec["weight_version"])
    return out


@pytest.mark.parametrize("run_id", sorted(RUNS))
def test_fixtures_are_async_ride_along_runs_of_verls_own_driver(run_id: str, tmp_path: Path) -> None:
    spec = RUNS[run_id]
    assert (FIXTURES / spec.archive).stat().st_size <= 256 * 2**10, "a committed fixture stays small"
    run_dir = unpack(RUNS[run_id].archive, run_id, tmp_path)
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["run_id"], run["kind"], run["collection"]) == (run_id, "collection", "ride-along")
    assert (run["mode"], run["trainer_mode"], run["dump_phase"]) == (spec.mode, spec.trainer_mode, "log_prob")
    assert (run["verl_module"], run["device"], run["pin_set"], run["exit_code"]) == (
        "verl.trainer.main_ppo",
        "cuda",
        "next",
        0,
    )
    assert (run["installed"]["verl"], run["installed"]["vllm"]) == ("0.9.1", "0.23.0")
    assert "--ride-along" in run["invocation"]
    assert set(M8) <= set(run["invocation"]), "the user's micro batch of 8 on both sides"
    assert ("actor_rollout_ref.actor.optim.lr=2e-3" in run["invocation"]) == (run_id == FAULT_ID)
    steps = run["steps"]
    assert [s["step"] for s in steps] == list(range(1, spec.steps + 1))
    for s in steps:
        assert math.isfinite(s["grad_norm"])
        assert s["grad_norm"] > 0, "the weights move at every step"
        assert s["not_finite"] == []


@pytest.mark.parametrize("run_id", sorted(RUNS))
def test_every_trained_request_the_trim_kept_pairs(run_id: str, repaired: Callable[[str], Repaired]) -> None:
    """Stale requests included: only the trim's drops and the never-trained last batch stay unpaired."""
    spec, r = RUNS[run_id], repaired(run_id)
    p = r.manifest["pairing"]
    actor_dumps = len(list((r.run_dir / "actor").rglob("dump.json")))
    assert p["pairs"] == actor_dumps == sum(spec.trimmed)
    assert p["requests_seen"] == (spec.steps + 1) * RESPONSES, "every step's requests and the last batch"
    gone = spec.device_pairs - p["pairs"]
    assert p["unpaired_counts"] == {
        "actor_step": {"dump_missing": gone},
        "request": {
            "decode_only": 0,
            "dump_missing": gone,
            "no_rollout_prefill": 0,
            "no_training_micro_batch": RESPONSES,
        },
        "rollout_step": {"decode_only": spec.decode_only, "dump_missing": gone},
    }
    reasons = Counter((u["subject"], u["reason"]) for u in r.manifest["unpaired"])
    assert {reason for _, reason in reasons} == {"dump_missing", "no_training_micro_batch"}
    assert reasons[("request", "no_training_micro_batch")] == RESPONSES
    assert {pair["backend"] for pair in r.manifest["pairs"]} == {"fsdp"}


@pytest.mark.parametrize("run_id", sorted(RUNS))
def test_the_unpaired_sixteen_are_the_last_batch_never_trained(
    run_id: str, repaired: Callable[[str], Repaired]
) -> None:
    """verl's token records hold every trained request; the 16 the pairing leaves are not among them,
    and vLLM prefilled all 16 with the newest weights it ever held: the batch in flight at the end."""
    r = repaired(run_id)
    untrained = {u["ref"] for u in r.manifest["unpaired"] if u["reason"] == "no_training_micro_batch"}
    trained, prefilled = _trained_step(r.run_dir), _prefill_version(r.run_dir)
    assert len(trained) == RUNS[run_id].steps * RESPONSES
    assert untrained == set(prefilled) - set(trained)
    assert {prefilled[rid] for rid in untrained} == {max(prefilled.values())}


def _per_step(r: Repaired, spec: Run) -> list[dict[str, Any]]:
    per_step: list[dict[str, Any]] = r.summary["per_step"]
    assert [s["global_step"] for s in per_step] == [s["step"] for s in r.run["steps"]]
    for s, logged in zip(per_step, r.run["steps"], strict=True):
        assert s["weight_version"] == s["global_step"] - 1, "step s ran the weights of version s - 1"
        assert s["grad_norm"] == logged["grad_norm"] > 0
        assert s["responses"] == RESPONSES
    assert [s["pairs"] for s in per_step] == list(spec.trimmed), "every step keeps some pairs"
    return per_step


@pytest.mark.parametrize("run_id", sorted(RUNS))
def test_each_step_names_its_rollout_versions_and_staleness(
    run_id: str, repaired: Callable[[str], Repaired]
) -> None:
    spec, r = RUNS[run_id], repaired(run_id)
    per_step = _per_step(r, spec)
    assert [s["rollout_versions"] for s in per_step] == [[v] for v in spec.rollout_versions]
    staleness = [s["weight_version"] - v for s, v in zip(per_step, spec.rollout_versions, strict=True)]
    assert [s["max_staleness"] for s in per_step] == staleness
    assert max(staleness) == 1, "the rollout at most one version behind the trainer"
    if spec.mode == "colocate-async":
        assert staleness == [0, 1] * (spec.steps // 2)
    else:
        assert staleness == [0] + [1] * (spec.steps - 1), "the rollouter one version ahead after step 1"
    versions = Counter(p["weight_version"] for p in r.manifest["pairs"])
    expected: Counter[int] = Counter()
    for v, n in zip(spec.rollout_versions, spec.trimmed, strict=True):
        expected[v] += n
    assert versions == expected, "each pair compared at its rollout's weights"


@pytest.mark.parametrize("run_id", sorted(RUNS))
def test_every_stale_pair_carries_the_trainers_weight_version(
    run_id: str, repaired: Callable[[str], Repaired]
) -> None:
    """Checked against verl's token records (which step trained the request), not the pairing."""
    r = repaired(run_id)
    trained = _trained_step(r.run_dir)
    stale = fresh = 0
    for pair in r.manifest["pairs"]:
        version = trained[pair["request_id"]] - 1
        if pair["weight_version"] < version:
            assert pair["trainer_weight_version"] == version, pair["pair_id"]
            stale += 1
        else:
            assert pair["weight_version"] == version
            assert "trainer_weight_version" not in pair, pair["pair_id"]
            fresh += 1
    assert stale > 0
    assert fresh > 0
    spec = RUNS[run_id]
    expected_stale = sum(n for s, n in enumerate(spec.trimmed) if spec.rollout_versions[s] < s)
    assert stale == expected_stale


@pytest.mark.parametrize("run_id", HEALTHY_RUNS)
def test_healthy_at_every_step_at_the_rollouts_weights(
    run_id: str, repaired: Callable[[str], Repaired]
) -> None:
    spec, r = RUNS[run_id], repaired(run_id)
    per_step = _per_step(r, spec)
    for s, worst, logp in zip(per_step, spec.worst_rel_err, spec.mean_abs_logp, strict=True):
        assert s["verdicts"] == {"healthy": s["pairs"], "suspicious": 0, "diverged": 0, "failed": 0}
        assert s["first_divergence"] is None
        assert s["worst_rel_err"] <= worst + 5e-5, "a subset of the device's pairs: no worse than all"
        assert round(s["mean_abs_logp_diff"], 4) == logp, "the token view is the whole run's"
    assert (r.summary["overall"], r.summary["drift"]) == ("healthy", "step 1+: healthy")
    cs = r.manifest["comparisons"]
    assert Counter(c["verdict"] for c in cs) == {"healthy": sum(spec.trimmed)}
    for c in cs:
        assert (c["status"], c["task"], c["first_divergence"]) == ("ok", "statistics", None)
        assert 0.001 < c["max_rel_err"] <= HEALTHY_REL_ERR, "two bf16 engines: close, not equal"
        labels = [x["label"] for x in c["layer_profile"]]
        assert labels == ["embed", *(str(i) for i in range(LAYERS)), "head"]
        assert c["output"]["status"] == "ok"
        assert c["output"]["abs_diff"] < 0.016, "|delta log p| of the next token"


def test_fault_named_at_its_module_from_the_first_version_it_affects(
    repaired: Callable[[str], Repaired],
) -> None:
    """Steps 1-2 trained what weights 0 generated (the first sync, whole): healthy. Every later
    sync skipped one tensor, so from step 3 (rollout weights 1) every pair diverges, first at
    the module that tensor belongs to."""
    spec, r = RUNS[FAULT_ID], repaired(FAULT_ID)
    per_step = _per_step(r, spec)
    for s, worst in zip(per_step[:2], spec.worst_rel_err, strict=False):
        assert s["rollout_versions"] == [0]
        assert s["verdicts"] == {"healthy": s["pairs"], "suspicious": 0, "diverged": 0, "failed": 0}
        assert s["first_divergence"] is None
        assert s["worst_rel_err"] <= worst + 5e-5
    for s in per_step[2:]:
        assert s["rollout_versions"][0] >= 1
        assert s["verdicts"] == {"healthy": 0, "suspicious": 0, "diverged": s["pairs"], "failed": 0}
        assert (s["first_divergence"], s["first_divergence_module"]) == ("layers.2.mlp", FAULT_MODULE)
        assert s["first_divergence_pairs"] == s["pairs"]
        assert s["worst_rel_err"] > DIVERGED_REL_ERR
    assert (r.summary["overall"], r.summary["drift"]) == (
        "diverged",
        "steps 1–2: healthy · step 3+: diverged at layers.2.mlp",
    )
    kept, diverged = sum(spec.trimmed), sum(spec.trimmed[2:])
    assert f"Most common first divergence: `{FAULT_MODULE}` ({diverged} of {kept} pairs)" in r.summary_md
    cs = r.manifest["comparisons"]
    assert Counter(c["verdict"] for c in cs) == {"healthy": kept - diverged, "diverged": diverged}
    assert_fault_pairs(r.manifest, FAULT_MODULE, layer=2)


def test_the_token_view_carries_staleness_the_layer_view_does_not(
    repaired: Callable[[str], Repaired],
) -> None:
    """verl's token view compares vLLM's log-probs with the trainer's own, current weights. At step 2
    of the fault run (lr 2e-3) those are one version newer than the rollout's: mean |delta log p|
    jumps 200-fold while the layer view, at the rollout's weights, is healthy. At the default
    learning rate (verl's 1e-6, the healthy fully-async run) one version of staleness barely moves it."""
    spec, fault = RUNS[FAULT_ID], repaired(FAULT_ID)
    first, second = _per_step(fault, spec)[:2]
    assert (first["max_staleness"], second["max_staleness"]) == (0, 1)
    assert second["verdicts"]["healthy"] == second["pairs"] > 0
    assert second["worst_rel_err"] <= HEALTHY_REL_ERR
    assert [round(s["mean_abs_logp_diff"], 4) for s in (first, second)] == list(spec.mean_abs_logp[:2])
    assert second["mean_abs_logp_diff"] > 100 * first["mean_abs_logp_diff"]
    healthy = _per_step(repaired(FA_ID), RUNS[FA_ID])
    assert [s["max_staleness"] for s in healthy[1:]] == [1] * (len(healthy) - 1)
    assert max(s["mean_abs_logp_diff"] for s in healthy) < 2 * healthy[0]["mean_abs_logp_diff"]
