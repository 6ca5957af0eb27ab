"""The refusal table of the pin set in force: each conflicting override is rejected (exit 2) with a
message naming it and why, before anything is written; every required and refused row fires."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from verl_consistency.contracts.env import DumpPhase
from verl_consistency.entrypoints.cli import app
from verl_consistency.entrypoints.run import overrides as table
from verl_consistency.entrypoints.run.bypass import verl_default
from verl_consistency.entrypoints.run.megatron import (
    CP_KEY,
    MICRO_BATCH_KEYS,
    MODEL_REMOVE_PADDING_KEY,
    REMOVE_PADDING_KEY,
    SP_KEY,
    TP_KEY,
)
from verl_consistency.entrypoints.run.overrides import CURRENT, NEXT, Mode, RunKind, pin_set
from verl_consistency.entrypoints.run.plan import build_plan
from verl_consistency.entrypoints.run.plan_options import PlanError, PlanOptions

from .conftest import clean_env, supported

pytestmark = pytest.mark.pinset

SET = pin_set()

# (mode, extra options, the refused override, words the message must contain)
CONFLICTS = [
    ("hybrid", [], "actor_rollout_ref.rollout.enforce_eager=False", "eager mode"),
    ("fully-async", [], "trainer.test_freq=0", "ZeroDivisionError"),
    ("fully-async", [], "actor_rollout_ref.rollout.enforce_eager=false", "eager mode"),
    ("hybrid", [], "actor_rollout_ref.actor.use_dynamic_bsz=True", "re-forms micro batches by token count"),
    ("fully-async", [], "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true", "mixes samples"),
    # --prompts-only: the recipe's rows (ride-along leaves them to the job: test_ride_along_*)
    ("fully-async", ["--prompts-only"], "algorithm.rollout_correction.bypass_mode=True", "bypass mode off"),
    (
        "hybrid",
        ["--prompts-only", "--phase", "all"],
        "algorithm.rollout_correction.bypass_mode=true",
        "refuses bypass mode in every phase",
    ),
    (
        "hybrid",
        ["--prompts-only"],
        "+algorithm.rollout_correction.rollout_is=token",
        "rollout_correction=null",
    ),
    ("hybrid", [], "global_profiler.tool=precision_debugger", "PrecisionDebugger"),
    ("fully-async", [], "actor_rollout_ref.actor.profiler.tool=precision_debugger", "singleton"),
    (
        "hybrid",
        [],
        "+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_USE_V2_MODEL_RUNNER='1'",
        "V2 model runner",
    ),
    ("hybrid", [], "ray_kwargs.ray_init.runtime_env={}", "it replaces"),
    ("hybrid", [], "actor_rollout_ref.rollout.enable_prefix_caching=True", "prefix-cache hit"),
    ("fully-async", [], "actor_rollout_ref.rollout.enable_chunked_prefill=True", "chunked prefill"),
    ("hybrid", ["--prompts-only"], "trainer.balance_batch=True", "balance_batch"),
    ("fully-async", ["--prompts-only"], "data.shuffle=True", "prompt order"),
    ("hybrid", ["--prompts-only"], "data.shuffle=true", "prompt order"),
    ("fully-async", [], "actor_rollout_ref.hybrid_engine=True", "separate pools"),
    ("hybrid", [], "trainer.val_before_train=True", "validation before training"),
    ("fully-async", [], "trainer.test_freq=5", "test_freq=-1"),
    ("hybrid", [], "actor_rollout_ref.model.use_remove_padding=False", "padded training forward"),
    ("hybrid", [], "actor_rollout_ref.actor.ppo_micro_batch_size=8", "deprecated global micro batch"),
    ("hybrid", [], "actor_rollout_ref.rollout.name=sglang", "vllm-ascend"),
    (
        "fully-async",
        [],
        "actor_rollout_ref.rollout.calculate_log_probs=False",
        {CURRENT: "must rollout calculate", NEXT: "output row"}[SET],
    ),
    (
        "hybrid",
        [],
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path=/home/c.json",
        "inference-side msprobe config",
    ),
    ("hybrid", [], "~actor_rollout_ref.rollout.enforce_eager", "eager mode"),
    ("hybrid", [], "actor_rollout_ref.rollout={}", "it replaces"),
    # update_actor: one optimizer step per training step, before which every forward is dumped
    ("hybrid", ["--phase", "update_actor"], "actor_rollout_ref.actor.ppo_epochs=2", "second PPO epoch"),
    ("fully-async", ["--phase", "all"], "actor_rollout_ref.actor.ppo_epochs=3", "already stepped"),
    (
        "hybrid",
        ["--phase", "update_actor"],
        "data.train_batch_size=16",
        "data.train_batch_size == actor_rollout_ref.actor.ppo_mini_batch_size "
        "(here data.train_batch_size=16, actor_rollout_ref.actor.ppo_mini_batch_size=8)",
    ),
    ("hybrid", ["--phase", "all"], "actor_rollout_ref.actor.ppo_mini_batch_size=4", "second mini batch"),
    ("hybrid", ["--phase", "update_actor"], "~data.train_batch_size", "data.train_batch_size=<deleted>"),
]

# verl 0.9.1's V1 trainer: the legacy trainer and fully_async_main, the trainer mode, one weight version.
NEXT_CONFLICTS = [
    ("hybrid", [], "trainer.use_v1=false", "main_ppo_v0"),
    ("fully-async", [], "trainer.use_v1=False", "VERL_CONSISTENCY_PIN_SET=current"),
    ("hybrid", [], "trainer.v1.trainer_mode=separate_async", "separate_async: `run fully-async`"),
    ("fully-async", [], "trainer.v1.trainer_mode=sync", "sync: `run hybrid`"),
    ("colocate-async", [], "trainer.v1.trainer_mode=sync", "colocate_async: `run colocate-async`"),
    ("hybrid", [], "trainer.v1={}", "it replaces"),
    ("fully-async", [], "async_training.staleness_threshold=0.1", "fully_async_main"),
    ("fully-async", [], "+async_training.partial_rollout=false", "partial_rollout -> always on"),
    ("fully-async", [], "rollout.n_gpus_per_node=4", "actor_rollout_ref.rollout.{nnodes,n_gpus_per_node}"),
    ("hybrid", [], "rollout.total_rollout_steps=64", "deprecate"),
    (
        "fully-async",
        ["--prompts-only"],
        "trainer.v1.sampler.max_off_policy_threshold=8",
        "the weights that generated it",
    ),
    (
        "colocate-async",
        ["--token-level"],
        "trainer.v1.sampler.max_off_policy_threshold=null",
        "partial rollout",
    ),
    ("fully-async", ["--prompts-only"], "trainer.v1.sampler.max_off_policy_strategy=wait", "older weights"),
    ("colocate-async", ["--prompts-only"], "trainer.v1.colocate_async.num_warmup_batches=1", "warm-up batch"),
    (
        "fully-async",
        ["--prompts-only", "--phase", "update_actor"],
        "trainer.v1.separate_async.parameter_sync_step=4",
        "k-th mini batch",
    ),
    (
        "fully-async",
        ["--prompts-only", "--phase", "all"],
        "~trainer.v1.separate_async.parameter_sync_step",
        "k-th mini batch",
    ),
    ("hybrid", [], "+trainer.v1.sync.parameter_sync_step=2", "trainer_base.py:130"),
    ("colocate-async", [], "+trainer.v1.colocate_async.parameter_sync_step=4", "never had"),
    ("hybrid", [], "trainer.v1.sampler.custom_sampler.path=/x/sampler.py", "custom replay buffer"),
    ("fully-async", [], "actor_rollout_ref.hybrid_engine=true", "training NPUs"),
    ("colocate-async", [], "actor_rollout_ref.rollout.enforce_eager=False", "eager mode"),
    ("colocate-async", ["--prompts-only"], "data.shuffle=true", "prompt order"),
    ("colocate-async", ["--phase", "update_actor"], "data.train_batch_size=32", "set both to the same value"),
]

# verl 0.8.0's fully_async_main: one weight version per pair (async_training.*).
CURRENT_CONFLICTS = [
    ("fully-async", ["--prompts-only"], "async_training.staleness_threshold=0.1", "run ahead"),
    ("fully-async", ["--token-level"], "~async_training.staleness_threshold", "no request is in flight"),
    ("fully-async", ["--prompts-only"], "async_training={}", "it replaces"),
    (
        "fully-async",
        ["--prompts-only", "--phase", "update_actor"],
        "async_training.trigger_parameter_sync_step=4",
        "updated k-1 times",
    ),
    (
        "fully-async",
        ["--prompts-only", "--phase", "all"],
        "async_training.trigger_parameter_sync_step=2",
        "every step syncs",
    ),
    (
        "fully-async",
        ["--prompts-only", "--phase", "update_actor"],
        "async_training.require_batches=2",
        "second mini batch",
    ),
    ("fully-async", ["--prompts-only", "--phase", "all"], "~async_training.require_batches", "never had"),
]

CASES = CONFLICTS + {CURRENT: CURRENT_CONFLICTS, NEXT: NEXT_CONFLICTS}[SET]


def _invoke(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    runner = CliRunner()
    return runner.invoke(
        app,
        ["run", *args, "--dump-root", str(tmp_path), "--run-id", "refused"],
        env=env,
        catch_exceptions=False,
    )


@pytest.mark.parametrize(
    ("mode", "options", "override", "why"), CASES, ids=[f"{m}:{o}" for m, _, o, _ in CASES]
)
def test_conflict_is_refused(
    tmp_path: Path, mode: str, options: list[str], override: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in set(__import__("os").environ) - set(clean_env()):
        monkeypatch.delenv(name)
    result = _invoke(tmp_path, mode, *options, override)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"refused `{override}`" in text
    assert why in text
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_all_conflicts_are_reported_at_once(tmp_path: Path) -> None:
    result = _invoke(
        tmp_path,
        "hybrid",
        "--prompts-only",
        "trainer.balance_batch=True",
        "global_profiler.tool=precision_debugger",
    )
    assert result.exit_code == 2
    assert "2 problem(s)" in result.output


@pytest.mark.parametrize(
    "override",
    [
        "actor_rollout_ref.rollout.enforce_eager=True",  # the required value itself: accepted, not repeated
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.ascend_scheduler_config={enabled:false}",
        "+ray_kwargs.ray_init.runtime_env.env_vars.HCCL_CONNECT_TIMEOUT='1800'",
        "trainer.test_freq=-1",
        "global_profiler.tool=npu",
        "data.shuffle=False",
        # the user's own micro batches: each request of an FSDP micro batch gets a lane
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    ],
)
def test_compatible_overrides_pass_through(tmp_path: Path, override: str) -> None:
    result = CliRunner().invoke(
        app,
        ["run", "hybrid", "--dry-run", "--json", "--dump-root", str(tmp_path), "--run-id", "ok", override],
        env=dict.fromkeys(("DUMP_ON",)),
    )
    assert result.exit_code == 0, result.output
    import json

    overrides = json.loads(result.output)["overrides"]
    key = override.split("=")[0]
    assert sum(o.split("=")[0] == key for o in overrides) == 1


def test_prompts_only_refuses_bypass_even_when_only_update_actor_is_dumped(tmp_path: Path) -> None:
    """The PROMPTS_ONLY trim drops rollout log-probs, so bypass mode would fail at the first step
    in every phase (patches/hooks/training/prompts_only.py): refuse it up front, not after an NPU-hour."""
    result = CliRunner().invoke(
        app,
        [
            "run",
            "fully-async",
            "--prompts-only",
            "--dry-run",
            "--json",
            "--phase",
            "update_actor",
            "--dump-root",
            str(tmp_path),
            "--run-id",
            "ok",
            "algorithm.rollout_correction.bypass_mode=True",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "algorithm.rollout_correction" in result.output


def test_conflicting_caller_environment_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["run", "hybrid", "--dump-root", str(tmp_path), "--run-id", "env"],
        env={"VLLM_USE_V2_MODEL_RUNNER": "1"},
    )
    assert result.exit_code == 2
    assert "refused environment VLLM_USE_V2_MODEL_RUNNER='1'" in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--capture", "fraction:2"], "fraction:F"),
        (["--steps", "5-2"], "N <= M"),
        (["--ranks", "x"], "is not N or N-M"),
        (["--config-name", "x"], "unknown option '--config-name'"),
        (["--cfg", "bogus"], "--cfg takes one of"),
        (["trainer.logger=[console"], "not valid Hydra syntax"),
    ],
)
def test_bad_options_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    result = _invoke(tmp_path, "hybrid", *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_relative_dump_root_is_refused() -> None:
    result = CliRunner().invoke(app, ["run", "hybrid", "--dry-run", "--dump-root", "dumps", "--run-id", "x"])
    assert result.exit_code == 2
    assert "absolute path" in result.output


def test_a_bad_run_id_message_keeps_its_pattern(tmp_path: Path) -> None:
    """The message names the allowed pattern whole: rich must not read ``[a-z0-9]`` as markup."""
    result = CliRunner().invoke(
        app, ["run", "hybrid", "--dry-run", "--dump-root", str(tmp_path), "--run-id", "Bad!"]
    )
    assert result.exit_code == 2, result.output
    assert "^[a-z0-9][a-z0-9._-]{0,127}$" in " ".join(result.output.split())


def test_phase_option_wins_over_its_env_source(tmp_path: Path) -> None:
    import json

    result = CliRunner().invoke(
        app,
        [
            "run",
            "hybrid",
            "--dry-run",
            "--json",
            "--phase",
            "all",
            "--dump-root",
            str(tmp_path),
            "--run-id",
            "p",
        ],
        env={"DUMP_PHASE": "log_prob"},
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["env"]["DUMP_PHASE"] == "all"


def _contradiction(row: table.Override) -> str:
    """An override that contradicts a required row: its deletion."""
    return f"~{row.key}"


def _refused_value(row: table.Refusal) -> str:
    key = row.key + (".x" if row.match == "subtree" else "")
    if row.bad is not None:
        value = row.bad[0]
    elif row.allowed is not None:
        value = "not-allowed"
    else:
        value = 3
    return f"+{key}={table.hydra_value(value)}"


def _plans() -> list[tuple[Mode, DumpPhase, RunKind]]:
    """Every mode, phase and kind a run can have on this set. A ride-along run does not dump
    log_prob where verl's default turns bypass mode on (test_bypass.py)."""
    return [
        (mode, phase, kind)
        for mode in Mode
        if supported(mode.value)
        for phase in DumpPhase
        for kind in RunKind
        if kind is not RunKind.TOKEN_LEVEL or phase is DumpPhase.LOG_PROB
        if not (kind is RunKind.RIDE_ALONG and phase is DumpPhase.LOG_PROB and verl_default(mode, SET).on)
    ]


def test_every_required_row_and_refusal_of_the_set_fires() -> None:
    """Every row of the set in force, in every mode, phase and kind it applies to, refuses its
    contradiction (a deletion of a required key; a refused value)."""
    fired: set[tuple[str, str]] = set()
    for mode, phase, kind in _plans():
        cases = [(_contradiction(r), r.why) for r in table.required_rows(mode, phase, kind)]
        cases += [(_refused_value(r), r.why) for r in table.rows_for(table.REFUSALS, mode, phase, kind)]
        for override, why in cases:
            with pytest.raises(PlanError) as err:
                build_plan(
                    mode,
                    PlanOptions(
                        dump_root="/dump",
                        run_id="r",
                        phase=phase,
                        environ={},
                        token_level=kind is RunKind.TOKEN_LEVEL,
                        prompts_only=kind is RunKind.PROMPTS_ONLY,
                        extra_args=[override],
                    ),
                )
            (message,) = err.value.messages
            assert message.startswith(f"refused `{override}`"), message
            assert why in message, (override, message)
            fired.add((override, why))
    rows = [r for r in (*table.REQUIRED, *table.REFUSALS) if SET in r.sets]
    assert {r.why for r in rows} <= {why for _, why in fired}, "a row of the set never applied"


def test_rows_of_another_set_do_not_fire() -> None:
    """A refusal of another set does not fire here: e.g. the next set refuses the legacy fully-async
    knobs (async_training.*, the top-level rollout.*), which the current set's fully_async_main reads."""
    other = [r for r in table.REFUSALS if SET not in r.sets]
    if not other:
        pytest.skip(f"every refusal of the other sets applies to {SET!r} too")
    for row in other:
        plan = build_plan(
            Mode.FULLY_ASYNC,
            PlanOptions(dump_root="/dump", run_id="r", environ={}, extra_args=[_refused_value(row)]),
        )
        assert plan.pin_set == SET


@pytest.mark.parametrize(
    ("mode", "options", "overrides"),
    [
        ("fully-async", [], ["trainer.v1.separate_async.parameter_sync_step=4", "data.train_batch_size=32"]),
        ("fully-async", [], ["trainer.v1.sampler.max_off_policy_threshold=1", "trainer.use_v1=true"]),
        (
            "hybrid",
            [],
            ["+trainer.v1.sync.parameter_sync_step=1", "trainer.v1.sampler.custom_sampler.path=null"],
        ),
        ("colocate-async", [], ["trainer.v1.colocate_async.num_warmup_batches=0"]),
    ],
)
def test_next_set_compatible_overrides_pass_through(
    mode: str, options: list[str], overrides: list[str]
) -> None:
    if SET != NEXT:
        pytest.skip("verl 0.9.1's V1 keys: the next pin set")
    plan = build_plan(
        Mode(mode), PlanOptions(dump_root="/dump", run_id="r", environ={}, extra_args=[*options, *overrides])
    )
    for override in overrides:
        key = override.split("=")[0].lstrip("+")
        assert sum(o.split("=")[0].lstrip("+") == key for o in plan.overrides) == 1, key


def test_a_pin_set_whose_verl_is_not_installed_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A next-set plan on a current-set image (or the reverse) fails loudly, not deep in Hydra."""
    import importlib.metadata as md

    from verl_consistency.contracts import pins
    from verl_consistency.contracts.env import PIN_SET

    have = md.version("verl")
    other = next(n for n in pins.set_names() if pins.get("upstream.verl", set_name=n) != have)
    monkeypatch.setenv(PIN_SET, other)
    args = ["run", "hybrid", "--dump-root", str(tmp_path), "--run-id", "wrongset", "model=/m"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"pin set {other!r} is for verl {pins.get('upstream.verl', set_name=other)}" in result.output
    assert f"verl {have} is installed" in result.output
    assert f"make image PINS={other}" in result.output
    assert not (tmp_path / "wrongset").exists()
    dry = CliRunner().invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "warning:" in dry.output
    assert f"# pin set: {other} " in dry.output


@pytest.mark.parametrize(
    "overrides",
    [
        ["async_training.trigger_parameter_sync_step=4", "async_training.require_batches=2"],
        ["async_training.staleness_threshold=0.0", "async_training.partial_rollout=false"],
        ["async_training.use_trainer_do_validate=true"],
    ],
)
def test_current_set_log_prob_run_may_batch_several_steps_per_sync(overrides: list[str]) -> None:
    """Old log-probs use the rollout's weights for the whole sync cycle (fully_async_trainer.py:476-485):
    a log_prob run may sync less often; partial rollout and trainer-side validation are not refused
    (no request is in flight at a sync, and validation is off)."""
    if SET != CURRENT:
        pytest.skip("verl 0.8.0's async_training.* keys: the current pin set")
    for prompts_only in (False, True):
        options = PlanOptions(
            dump_root="/dump", run_id="r", environ={}, extra_args=overrides, prompts_only=prompts_only
        )
        plan = build_plan(Mode.FULLY_ASYNC, options)
        assert plan.phase is (DumpPhase.LOG_PROB if prompts_only else DumpPhase.UPDATE_ACTOR)
    for override in overrides:
        key = override.split("=")[0]
        assert sum(o.split("=")[0] == key for o in plan.overrides) == 1, key


@pytest.mark.parametrize(
    ("phase", "overrides"),
    [
        (
            DumpPhase.UPDATE_ACTOR,
            ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16"],
        ),
        (
            DumpPhase.ALL,
            ["actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_epochs=1"],
        ),
        (DumpPhase.LOG_PROB, ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_epochs=2"]),
    ],
)
def test_batch_sizes_set_together_or_for_log_prob_pass_through(
    phase: DumpPhase, overrides: list[str]
) -> None:
    """The train batch may grow with the mini batch; a log_prob run (old log-probs are computed
    before any optimizer step) takes any batch sizes and epochs."""
    plan = build_plan(
        Mode.HYBRID, PlanOptions(dump_root="/dump", run_id="r", phase=phase, environ={}, extra_args=overrides)
    )
    for override in overrides:
        key = override.split("=")[0]
        assert sum(o.split("=")[0] == key for o in plan.overrides) == 1, key


def test_the_runs_own_values_satisfy_every_matched_row() -> None:
    """Untouched keys are not checked at run time, so the run's own values must match wherever a
    row applies; and every row of the set applies somewhere."""
    applied = set()
    for mode, phase, kind in _plans():
        composed = [
            *table.rows_for(table.DEFAULTS, mode, phase, kind),
            *table.required_rows(mode, phase, kind),
        ]
        for row in table.rows_for(table.MATCHED, mode, phase, kind):
            values = [next(r.value for r in composed if r.key == key) for key in row.keys]
            assert values[0] == values[1], (mode, phase, row.keys, values)
            applied.add(row.keys)
    assert applied == {r.keys for r in table.MATCHED if SET in r.sets}


def _dry_run(tmp_path: Path, mode: str, run_id: str, *args: str) -> Result:
    return CliRunner().invoke(
        app, ["run", mode, "--dry-run", "--dump-root", str(tmp_path), "--run-id", run_id, *args]
    )


@pytest.mark.parametrize("key", list(MICRO_BATCH_KEYS))
def test_megatron_micro_batches_of_several_need_the_bshd_layout(tmp_path: Path, key: str) -> None:
    """Megatron's lanes are cut in verl's bshd layout only: several samples per micro batch on the
    packed (THD) default is refused, naming the override; with it the run plans."""
    given = ["--prompts-only", "actor_rollout_ref.actor.strategy=megatron", f"{key}=4"]
    result = _invoke(tmp_path, "hybrid", *given)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"`{key}=4` puts several samples in one micro batch" in text
    assert f"Pass {REMOVE_PADDING_KEY}=False" in text
    assert list(tmp_path.iterdir()) == []
    ok = _dry_run(tmp_path, "hybrid", "ok", *given, f"{REMOVE_PADDING_KEY}=False")
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize("mode", ["hybrid", "fully-async"])
def test_megatron_ride_along_plans_in_the_bshd_layout_and_is_refused_packed(
    tmp_path: Path, mode: str
) -> None:
    """A ride-along forward covers prompt + response: each request's lane is cut to its prompt rows,
    in the bshd layout only. The packed default is refused at once, naming the override and the
    recipe's way (--prompts-only, micro batch 1); each of those plans."""
    given = ["actor_rollout_ref.actor.strategy=megatron"]
    result = _invoke(tmp_path, mode, *given)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "a ride-along forward covers prompt + response" in text
    assert f"Pass {REMOVE_PADDING_KEY}=False, or --prompts-only" in text
    assert list(tmp_path.iterdir()) == []
    one = [f"{k}=1" for k in MICRO_BATCH_KEYS]
    for i, args in enumerate(
        ([f"{REMOVE_PADDING_KEY}=False"], ["--prompts-only", *one], ["--token-level", *one])
    ):
        ok = _dry_run(tmp_path, mode, f"ok{i}", *given, *args)
        assert ok.exit_code == 0, (args, ok.output)


def _plan_overrides(tmp_path: Path, run_id: str, *args: str) -> list[str]:
    import json

    ok = _dry_run(tmp_path, "hybrid", run_id, "--json", *args)
    assert ok.exit_code == 0, ok.output
    return list(json.loads(ok.stdout)["overrides"])


@pytest.mark.parametrize("named", ["actor_rollout_ref.actor.strategy=megatron", "model_engine=megatron"])
def test_megatron_in_bshd_puts_the_models_remove_padding_at_false(tmp_path: Path, named: str) -> None:
    """verl's V1 worker overwrites the Megatron engine's use_remove_padding with the model's, which
    every collection run sets to true (FSDP's packed lanes): asked for bshd, the run sets the model's
    to false in its place, and the user may say so too. Either way of naming Megatron is refused
    packed (verl's ``model_engine`` group as well as the actor's strategy); FSDP keeps true."""
    packed = _invoke(tmp_path, "hybrid", named)
    assert packed.exit_code == 2, packed.output
    assert f"Pass {REMOVE_PADDING_KEY}=False" in " ".join(packed.output.split())
    bshd = [named, f"{REMOVE_PADDING_KEY}=False"]
    for i, extra in enumerate(([], [f"{MODEL_REMOVE_PADDING_KEY}=false"])):
        overrides = _plan_overrides(tmp_path, f"bshd{i}", *bshd, *extra)
        assert f"{MODEL_REMOVE_PADDING_KEY}=false" in overrides
        assert f"{MODEL_REMOVE_PADDING_KEY}=true" not in overrides
    assert f"{MODEL_REMOVE_PADDING_KEY}=true" in _plan_overrides(tmp_path, "fsdp")
    fsdp = _invoke(tmp_path, "hybrid", f"{MODEL_REMOVE_PADDING_KEY}=false")
    assert fsdp.exit_code == 2, fsdp.output
    assert f"requires {MODEL_REMOVE_PADDING_KEY}=true" in " ".join(fsdp.output.split())


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ([f"{CP_KEY}=2"], f"refused `{CP_KEY}=2`"),
        ([f"{TP_KEY}=2"], f"Pass {SP_KEY}=False"),
    ],
    ids=["context-parallel", "sequence-parallel"],
)
def test_megatron_lanes_refuse_a_row_split_across_ranks(tmp_path: Path, extra: list[str], named: str) -> None:
    """Context parallelism, and sequence parallelism under TP > 1, put a row's positions on several
    ranks: refused, each by name; TP 2 without sequence parallelism plans."""
    given = ["actor_rollout_ref.actor.strategy=megatron", f"{REMOVE_PADDING_KEY}=False"]
    result = _invoke(tmp_path, "hybrid", *given, *extra)
    assert result.exit_code == 2, result.output
    assert named in " ".join(result.output.split())
    if extra[0].startswith(TP_KEY):
        ok = _dry_run(tmp_path, "hybrid", "ok", *given, *extra, f"{SP_KEY}=False")
        assert ok.exit_code == 0, ok.output
