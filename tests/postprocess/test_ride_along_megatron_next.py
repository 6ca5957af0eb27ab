"""Issue 46: the ride-along on verl 0.9.1's Megatron engine, with and without the planted weight-sync
fault, re-paired on CPU. Skipped until the GPU session brings the run folders back.

``fixtures/h100-next-megatron-{ride,fault}.tar.xz`` will be what ``bench/gpu/verl_gpu.sh ride`` with
``ENGINE=megatron`` brings back (its header says the exact device calls): ``VERL_CONSISTENCY_PIN_SET=next
verl-consistency run hybrid --device cuda --capture fraction:1`` under verl 0.9.1's own ``main_ppo``
with ``model_engine=megatron`` (TP = PP = 1, mbridge, the bshd layout; megatron-core's local layer spec
in place of Transformer Engine: ``bench/gpu/no_te/megatron_local_spec.py``), vLLM 0.23.0, GRPO, the
random bf16 Qwen2 of 4 layers and width 512, micro batch 8 on both sides, 8 steps (the fault run: 4,
with ``bench/gpu/faults/skip-down-proj.patch``: every sync after the first skips
``model.layers.2.mlp.down_proj.weight``). Each folder trimmed as the FSDP ride's were
(``test_ride_along_h100_next.py``).

What is asserted holds for any such run (the numbers the device's summary gives are added with the
fixtures): the run is the Megatron engine's, the weights move at every step, every kept request pairs
on the Megatron backend; the ride is healthy at every step; the fault's step 1 is healthy and every
later step diverges first at ``layers.2.mlp``, with the weight check naming the skipped tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.postprocess.gpu_runs import FIXTURES, Repaired, assert_weights_move, repair, unpack

pytestmark = pytest.mark.msprobe

RIDE_ID = "h100-next-megatron-ride"
FAULT_ID = "h100-next-megatron-fault"
STEPS = {RIDE_ID: 8, FAULT_ID: 4}
FAULT_TENSOR = "model.layers.2.mlp.down_proj.weight"
MEGATRON = ("model_engine=megatron", "actor_rollout_ref.actor.megatron.use_remove_padding=False")


def _archive(run_id: str) -> str:
    archive = f"{run_id}.tar.xz"
    if not (FIXTURES / archive).exists():
        pytest.skip(f"fixtures/{archive} not committed yet: issue 46's GPU run (verl_gpu.sh's header)")
    return archive


@pytest.fixture(scope="module")
def ride(tmp_path_factory: pytest.TempPathFactory) -> Repaired:
    return repair(_archive(RIDE_ID), RIDE_ID, tmp_path_factory)


@pytest.fixture(scope="module")
def fault(tmp_path_factory: pytest.TempPathFactory) -> Repaired:
    return repair(_archive(FAULT_ID), FAULT_ID, tmp_path_factory)


@pytest.mark.parametrize("run_id", sorted(STEPS))
def test_fixtures_are_megatron_ride_along_runs_of_verls_own_driver(run_id: str, tmp_path: Path) -> None:
    run_dir = unpack(_archive(run_id), run_id, tmp_path)
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["run_id"], run["collection"], run["mode"], run["trainer_mode"]) == (
        run_id,
        "ride-along",
        "hybrid",
        "sync",
    )
    assert (run["verl_module"], run["device"], run["pin_set"], run["exit_code"]) == (
        "verl.trainer.main_ppo",
        "cuda",
        "next",
        0,
    )
    assert set(MEGATRON) <= set(run["invocation"]), "verl's Megatron engine, in the bshd layout"
    assert_weights_move(run["steps"], STEPS[run_id])


def _pairs_on_megatron(r: Repaired) -> None:
    assert r.manifest["pairing"]["pairs"] > 0
    assert {pair["backend"] for pair in r.manifest["pairs"]} == {"megatron"}


def test_ride_along_healthy_at_every_step_as_the_weights_move(ride: Repaired) -> None:
    _pairs_on_megatron(ride)
    for s in ride.summary["per_step"]:
        assert s["verdicts"]["healthy"] == s["pairs"], s
        assert s["first_divergence"] is None
    assert ride.summary["overall"] == "healthy"
    for v in ride.summary["weights"]["versions"]:
        assert v["differing"] == [], v


def test_fault_named_at_its_module_and_tensor_from_the_second_step(fault: Repaired) -> None:
    _pairs_on_megatron(fault)
    first, *later = fault.summary["per_step"]
    assert first["verdicts"]["healthy"] == first["pairs"]
    for s in later:
        assert s["verdicts"]["diverged"] == s["pairs"], s
        assert s["first_divergence"] == "layers.2.mlp"
    v0, *skipped = fault.summary["weights"]["versions"]
    assert v0["differing"] == []
    for v in skipped:
        assert [d["tensor"] for d in v["differing"]] == [FAULT_TENSOR]
