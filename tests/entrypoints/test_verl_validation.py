"""Every run kind of every mode passes the pin set's verl's own config checks, on CPU, in seconds.

The overrides are the command's own (``verl-consistency run MODE ... --dry-run --json``); the
checks are verl's (:mod:`.verl_validation`): its driver's ``validate_config``, its V1 trainer's
constructor, and the ``__post_init__`` of the config dataclasses its workers build. Issue 35:
``run hybrid --token-level`` composed under ``--cfg job`` but failed on an H200, first on
``FSDPActorConfig``'s micro-batch assert, then on ``Missing mandatory value:
actor_rollout_ref.rollout.name``; here that fails in ``make test``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verl_consistency.contracts.env import DumpPhase
from verl_consistency.entrypoints.cli import app
from verl_consistency.entrypoints.run.megatron import MICRO_BATCH_KEYS, MODEL_REMOVE_PADDING_KEY
from verl_consistency.entrypoints.run.overrides import ENV, MODEL_PATH_KEY, Mode

from . import verl_validation
from .conftest import MODEL, supported

pytestmark = [pytest.mark.verl, pytest.mark.pinset]

BYPASS_ON = "algorithm.rollout_correction.bypass_mode=true"
BYPASS_OFF = "algorithm.rollout_correction.bypass_mode=false"

KINDS: dict[str, tuple[str, ...]] = {
    "ride-along": (),
    "ride-along-bypass": (BYPASS_ON,),
    "ride-along-log_prob": ("--phase", "log_prob", BYPASS_OFF),
    **{f"ride-along-{p.value}": ("--phase", p.value) for p in DumpPhase if p is not DumpPhase.LOG_PROB},
    "prompts-only": ("--prompts-only",),
    **{
        f"prompts-only-{p.value}": ("--prompts-only", "--phase", p.value)
        for p in DumpPhase
        if p is not DumpPhase.LOG_PROB
    },
    "token-level": ("--token-level",),
    "capture-all": ("--capture", "all"),
    "prompts-only-capture-all": ("--prompts-only", "--capture", "all"),
    "cuda": ("--device", "cuda"),
    "prompts-only-cuda": ("--prompts-only", "--device", "cuda"),
    "token-level-cuda": ("--token-level", "--device", "cuda"),
}
"""Every kind of run the command makes (issue 35): ride-along, the default (the phase the run
picks, bypass mode on, log_prob with bypass off, the other phases: their rows differ), the
recipe ``--prompts-only`` in each phase, the token-level triage, the whole-step capture, and
``--device cuda`` (it adds ``trainer.device``)."""

CASES = [pytest.param(mode, kind, id=f"{mode.value}-{kind}") for mode in Mode for kind in KINDS]


def dry_run_plan(mode: Mode, *options: str) -> dict[str, object]:
    """``verl-consistency run MODE OPTIONS --dry-run --json``, typed with none of our variables set."""
    unset = dict.fromkeys({row.name for row in ENV} | {"VERL_CONSISTENCY_RUN_ID", "VERL_CONSISTENCY_CAPTURE"})
    args = ["run", mode.value, *options, "--dry-run", "--json", "--dump-root", "/dump", "--run-id", "v"]
    result = CliRunner().invoke(app, [*args, f"model={MODEL}"], env=unset)
    assert result.exit_code == 0, result.output
    plan: dict[str, object] = json.loads(result.stdout)
    return plan


@pytest.mark.parametrize(("mode", "kind"), CASES)
def test_run_passes_verls_own_config_checks(mode: Mode, kind: str) -> None:
    if not supported(mode.value):
        pytest.skip(f"{mode.value} is not run on this pin set")
    plan = dry_run_plan(mode, *KINDS[kind])
    config = verl_validation.validate(str(plan["module"]), list(plan["overrides"]))  # type: ignore[call-overload]
    # The checks ran on the run's own config, not on verl's defaults.
    assert config.actor_rollout_ref.model.path == MODEL == plan_value(plan, MODEL_PATH_KEY)
    assert config.trainer.experiment_name == "v"


def plan_value(plan: dict[str, object], key: str) -> str:
    """The value the plan's overrides give ``key`` (as written)."""
    overrides: list[str] = plan["overrides"]  # type: ignore[assignment]
    return next(o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key)


def test_the_checks_catch_what_stopped_the_h200_run() -> None:
    """Without the run's micro batches and rollout name, verl's checks fail here as they did there."""
    from hydra.errors import InstantiationException
    from omegaconf.errors import MissingMandatoryValue

    from verl_consistency.entrypoints.run.overrides import launch

    plan = dry_run_plan(Mode.HYBRID, "--token-level")
    overrides: list[str] = plan["overrides"]  # type: ignore[assignment]
    micro = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.name")
    module = launch(Mode.HYBRID).module
    with pytest.raises(InstantiationException, match="ppo_micro_batch_size"):
        verl_validation.validate(module, [o for o in overrides if not o.startswith(micro[0] + "=")])
    with pytest.raises(MissingMandatoryValue, match=r"actor_rollout_ref\.rollout\.name"):
        verl_validation.validate(module, [o for o in overrides if not o.startswith(micro[1] + "=")])


SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "verl_gpu.sh"


def script_array(name: str) -> list[str]:
    """A bash array of ``bench/gpu/verl_gpu.sh`` as bash expands it (its ``${VAR:-default}`` defaults)."""
    text = SCRIPT.read_text()
    found = re.search(rf"^{name}=\(.*?\)$", text, re.M | re.S)
    assert found is not None, f"{SCRIPT}: no {name}=(...)"
    clean = {k: v for k, v in os.environ.items() if k not in ("GPU_UTIL", "STEPS")}
    out = subprocess.run(
        ["bash", "-c", f'{found.group(0)}\nprintf "%s\\n" "${{{name}[@]}}"'],
        capture_output=True,
        text=True,
        check=True,
        env=clean,
    )
    return out.stdout.splitlines()


def test_the_gpu_megatron_ride_plans_and_passes_verls_checks() -> None:
    """Issue 46: ``verl_gpu.sh ride`` with ENGINE=megatron runs ``run hybrid --device cuda`` with the
    script's GPU_OVERRIDES and MEGATRON_OVERRIDES and the user's micro batch of 8. It plans (no
    refusal), the run puts the model's ``use_remove_padding`` at false (verl's V1 worker copies it
    into the Megatron engine), and verl's checks pass on the config: Megatron, bshd, mbridge."""
    if not supported(Mode.HYBRID.value):
        pytest.skip("hybrid is not run on this pin set")
    gpu, megatron = script_array("GPU_OVERRIDES"), script_array("MEGATRON_OVERRIDES")
    assert "trainer.total_training_steps=8" in gpu
    assert "model_engine=megatron" in megatron
    m8 = [f"{k}=8" for k in MICRO_BATCH_KEYS]
    plan = dry_run_plan(Mode.HYBRID, "--device", "cuda", "--capture", "fraction:1", *gpu, *megatron, *m8)
    overrides: list[str] = plan["overrides"]  # type: ignore[assignment]
    assert f"{MODEL_REMOVE_PADDING_KEY}=false" in overrides
    assert f"{MODEL_REMOVE_PADDING_KEY}=true" not in overrides
    config = verl_validation.validate(str(plan["module"]), overrides)
    arr = config.actor_rollout_ref
    assert arr.actor.strategy == "megatron"
    assert arr.model.use_remove_padding is False
    assert arr.actor.megatron.use_remove_padding is False
    assert arr.actor.megatron.vanilla_mbridge is True
    assert arr.actor.megatron.tensor_model_parallel_size == 1
    assert arr.actor.ppo_micro_batch_size_per_gpu == 8
    assert config.trainer.device == "cuda"
    assert config.trainer.total_training_steps == 8
