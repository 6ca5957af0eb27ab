"""Ride-along is the default collection (issue 35): the job's own training step, no PROMPTS_ONLY;
``--prompts-only`` is the recipe, with every one of its rows; bypass mode picks the dumped phase.

Through the command itself (typer's CliRunner), as a user types it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from verl_consistency.contracts.env import PROMPTS_ONLY
from verl_consistency.contracts.run_manifest import RunManifest
from verl_consistency.entrypoints.cli import app
from verl_consistency.entrypoints.run.overrides import CURRENT, ENV, NEXT, RUNTIME_ENV_PREFIX, pin_set

from .conftest import MODEL, supported

pytestmark = pytest.mark.pinset

SET = pin_set()
UNSET = dict.fromkeys({row.name for row in ENV} | {"VERL_CONSISTENCY_RUN_ID", "VERL_CONSISTENCY_CAPTURE"})
RUNTIME_PROMPTS_ONLY = f"+{RUNTIME_ENV_PREFIX}.{PROMPTS_ONLY}"


def invoke(mode: str, *args: str, env: dict[str, str | None] | None = None, root: str = "/dump") -> Any:
    argv = ["run", mode, *args, "--dump-root", root, "--run-id", "ride", f"model={MODEL}"]
    return CliRunner().invoke(app, argv, env={**UNSET, **(env or {})})


def plan_of(mode: str, *args: str, env: dict[str, str | None] | None = None) -> dict[str, Any]:
    result = invoke(mode, *args, "--dry-run", "--json", env=env)
    assert result.exit_code == 0, result.output
    plan: dict[str, Any] = json.loads(result.stdout)
    return plan


def prompts_only_rows(plan: dict[str, Any]) -> list[str]:
    return [o for o in plan["overrides"] if o.startswith(RUNTIME_PROMPTS_ONLY + "=")]


@pytest.mark.parametrize("mode", ["hybrid", "fully-async"])
def test_default_run_sets_no_prompts_only(mode: str) -> None:
    plan = plan_of(mode)
    assert PROMPTS_ONLY not in plan["env"]
    assert prompts_only_rows(plan) == []
    assert (plan["kind"], plan["collection"]) == ("collection", "ride-along")
    assert "--ride-along" in plan["invocation"]
    assert plan["invocation"][plan["invocation"].index("--phase") + 1] == "auto"
    text = invoke(mode, "--dry-run").stdout
    assert text.splitlines()[2].startswith("# collection: ride-along")
    assert "PROMPTS_ONLY" not in text


@pytest.mark.parametrize("mode", ["hybrid", "fully-async"])
def test_prompts_only_sets_it_and_keeps_the_recipe(mode: str) -> None:
    plan = plan_of(mode, "--prompts-only")
    assert plan["env"][PROMPTS_ONLY] == "1"
    assert prompts_only_rows(plan) == [f"{RUNTIME_PROMPTS_ONLY}='1'"]
    assert plan["collection"] == "prompts-only"
    assert plan["phase"] == "log_prob"
    assert plan["phase_reason"] is None
    assert "algorithm.rollout_correction=null" in plan["overrides"]
    assert "trainer.balance_batch=false" in plan["overrides"]
    assert "--prompts-only" in plan["invocation"]
    assert (
        invoke(mode, "--prompts-only", "--dry-run")
        .stdout.splitlines()[2]
        .startswith("# collection: prompts-only")
    )
    recipe = {
        (CURRENT, "fully-async"): ["async_training.staleness_threshold=0", "data.shuffle=false"],
        (NEXT, "fully-async"): ["trainer.v1.sampler.max_off_policy_threshold=1", "data.shuffle=false"],
    }.get((SET, mode), [])
    assert set(recipe) <= set(plan["overrides"])


@pytest.mark.parametrize("mode", ["hybrid", "fully-async", "colocate-async"])
def test_ride_along_leaves_the_staleness_knobs_to_the_job(mode: str) -> None:
    if not supported(mode):
        pytest.skip(f"{mode} is not run on this pin set")
    keys = {o.split("=", 1)[0] for o in plan_of(mode)["overrides"]}
    for key in (
        "algorithm.rollout_correction",
        "trainer.balance_batch",
        "data.shuffle",
        "async_training.staleness_threshold",
        "async_training.require_batches",
        "trainer.v1.sampler.max_off_policy_threshold",
        "trainer.v1.sampler.max_off_policy_strategy",
        "trainer.v1.colocate_async.num_warmup_batches",
    ):
        assert key not in keys, key
    # what the dumps need stays in every collection run
    for key in (
        "actor_rollout_ref.rollout.name",
        "actor_rollout_ref.rollout.enforce_eager",
        "actor_rollout_ref.rollout.enable_prefix_caching",
        "actor_rollout_ref.rollout.enable_chunked_prefill",
        "actor_rollout_ref.model.use_remove_padding",
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "trainer.val_before_train",
        "actor_rollout_ref.rollout.calculate_log_probs",
    ):
        assert key in keys, key


@pytest.mark.parametrize(
    ("mode", "override"),
    [
        ("hybrid", "trainer.balance_batch=True"),
        ("hybrid", "data.shuffle=true"),
        ("fully-async", "data.shuffle=True"),
        ("hybrid", "+algorithm.rollout_correction.rollout_is=token"),
        *([("fully-async", "async_training.staleness_threshold=0.1")] if SET == CURRENT else []),
        *([("fully-async", "trainer.v1.sampler.max_off_policy_threshold=8")] if SET == NEXT else []),
        *([("colocate-async", "trainer.v1.colocate_async.num_warmup_batches=1")] if SET == NEXT else []),
    ],
)
def test_ride_along_takes_what_only_the_recipe_refuses(mode: str, override: str) -> None:
    assert override in plan_of(mode, override)["overrides"]
    refused = invoke(mode, "--prompts-only", "--dry-run", override)
    assert refused.exit_code == 2, refused.output
    assert f"refused `{override}`" in " ".join(refused.output.split())


def test_prompts_only_with_token_level_is_refused(tmp_path: Path) -> None:
    result = invoke("hybrid", "--prompts-only", "--token-level", root=str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "--prompts-only and --token-level" in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == []


def test_token_level_is_unchanged() -> None:
    plan = plan_of("hybrid", "--token-level")
    assert plan["env"][PROMPTS_ONLY] == "0"
    assert (plan["kind"], plan["collection"]) == ("token-level", None)
    assert "--ride-along" not in plan["invocation"]
    assert "--phase" not in plan["invocation"]


def test_a_trim_in_the_callers_environment_is_refused_in_ride_along(tmp_path: Path) -> None:
    result = invoke("hybrid", root=str(tmp_path), env={PROMPTS_ONLY: "1"})
    assert result.exit_code == 2, result.output
    assert "--prompts-only" in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == []
    assert plan_of("hybrid", "--prompts-only", env={PROMPTS_ONLY: "1"})["env"][PROMPTS_ONLY] == "1"


# ---------------------------------------------------------------------------------------------
# Bypass mode: accepted in ride-along, where it decides the phase
# ---------------------------------------------------------------------------------------------

BYPASS = "algorithm.rollout_correction.bypass_mode=true"


@pytest.mark.parametrize("mode", ["hybrid", "fully-async", "colocate-async"])
def test_bypass_without_phase_dumps_update_actor_and_says_why(mode: str) -> None:
    if not supported(mode):
        pytest.skip(f"{mode} is not run on this pin set")
    plan = plan_of(mode, BYPASS)
    assert plan["phase"] == plan["env"]["DUMP_PHASE"] == "update_actor"
    assert "bypass mode is in force (`algorithm.rollout_correction.bypass_mode=true`)" in plan["phase_reason"]
    assert BYPASS in plan["overrides"]
    text = invoke(mode, BYPASS, "--dry-run").stdout
    assert text.splitlines()[3].startswith("# dump phase: update_actor: bypass mode is in force")


@pytest.mark.parametrize("how", [["--phase", "log_prob"], ["--phase=log_prob"], "env"])
def test_bypass_with_phase_log_prob_is_refused_naming_both_fixes(tmp_path: Path, how: Any) -> None:
    options, env = ([], {"DUMP_PHASE": "log_prob"}) if how == "env" else (how, None)
    result = invoke("hybrid", *options, BYPASS, root=str(tmp_path), env=env)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "--phase log_prob" in text
    assert "refused" in text
    assert "leave --phase out" in text
    assert "algorithm.rollout_correction.bypass_mode=false" in text
    assert list(tmp_path.iterdir()) == []


def test_bypass_with_an_update_phase_given_is_taken_as_given() -> None:
    for phase in ("update_actor", "all"):
        plan = plan_of("hybrid", "--phase", phase, BYPASS)
        assert (plan["phase"], plan["phase_reason"]) == (phase, None)


def test_the_modes_verl_default_decides_without_an_override() -> None:
    """verl 0.8.0's fully-async config turns bypass on; verl 0.9.1's main_ppo leaves it off."""
    plan = plan_of("fully-async")
    if SET == CURRENT:
        assert plan["phase"] == "update_actor"
        assert "fully_async_ppo_trainer.yaml:69" in plan["phase_reason"]
        refused = invoke("fully-async", "--phase", "log_prob", "--dry-run")
        assert refused.exit_code == 2, refused.output
    else:
        assert (plan["phase"], plan["phase_reason"]) == ("log_prob", None)
    assert plan_of("hybrid")["phase"] == "log_prob"


@pytest.mark.parametrize(
    "off",
    [
        "algorithm.rollout_correction.bypass_mode=false",
        "algorithm.rollout_correction=null",
        "~algorithm.rollout_correction.bypass_mode",
    ],
)
def test_bypass_turned_off_by_the_user_dumps_log_prob(off: str) -> None:
    plan = plan_of("fully-async", off)
    assert (plan["phase"], plan["phase_reason"]) == ("log_prob", None)
    assert plan_of("fully-async", "--phase", "log_prob", off)["phase"] == "log_prob"


def test_the_last_word_on_bypass_wins() -> None:
    assert plan_of("hybrid", BYPASS, "algorithm.rollout_correction=null")["phase"] == "log_prob"
    assert plan_of("hybrid", "algorithm.rollout_correction=null", BYPASS)["phase"] == "update_actor"


def test_prompts_only_still_refuses_bypass() -> None:
    result = invoke("hybrid", "--prompts-only", "--dry-run", BYPASS)
    assert result.exit_code == 2, result.output
    assert f"refused `{BYPASS}`" in " ".join(result.output.split())


# ---------------------------------------------------------------------------------------------
# run.json
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "want"), [((), "ride-along"), (("--prompts-only",), "prompts-only")])
def test_run_json_records_the_collection(tmp_path: Path, args: tuple[str, ...], want: str) -> None:
    from verl_consistency.entrypoints.run.command import prepare_run_dir
    from verl_consistency.entrypoints.run.overrides import Mode
    from verl_consistency.entrypoints.run.plan import build_plan
    from verl_consistency.entrypoints.run.plan_options import PlanOptions

    options = PlanOptions(dump_root=str(tmp_path), run_id="m", environ={}, prompts_only=bool(args))
    plan = build_plan(Mode.HYBRID, options)
    prepare_run_dir(plan)
    manifest = RunManifest.read(plan.layout.run_manifest)
    assert (manifest.kind, manifest.collection) == ("collection", want)
    raw = json.loads(plan.layout.run_manifest.read_text())
    assert raw["collection"] == want


@pytest.mark.parametrize(("kind", "want"), [("collection", "prompts-only"), ("token-level", None)])
def test_an_older_run_json_still_loads(tmp_path: Path, kind: str, want: str | None) -> None:
    """Before ride-along every collection run was the recipe: an older run.json reads as prompts-only."""
    from verl_consistency.entrypoints.run.command import prepare_run_dir
    from verl_consistency.entrypoints.run.overrides import Mode
    from verl_consistency.entrypoints.run.plan import build_plan
    from verl_consistency.entrypoints.run.plan_options import PlanOptions

    plan = build_plan(
        Mode.HYBRID,
        PlanOptions(dump_root=str(tmp_path), run_id="o", environ={}, token_level=kind == "token-level"),
    )
    prepare_run_dir(plan)
    path = plan.layout.run_manifest
    old = json.loads(path.read_text())
    del old["collection"], old["phase_reason"]
    path.write_text(json.dumps(old))
    assert RunManifest.read(path).collection == want
