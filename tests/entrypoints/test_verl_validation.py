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

import pytest
from typer.testing import CliRunner

from verl_consistency.contracts.env import DumpPhase
from verl_consistency.entrypoints.cli import app
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
