"""The refusal table: each conflicting override is rejected (exit 2) with a message naming it and why,
before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from verl_consistency.entrypoints.cli import app

from .conftest import clean_env

# (mode, extra options, the refused override, words the message must contain)
CONFLICTS = [
    ("hybrid", [], "actor_rollout_ref.rollout.enforce_eager=False", "eager mode"),
    ("fully-async", [], "actor_rollout_ref.rollout.enforce_eager=false", "eager mode"),
    ("hybrid", [], "actor_rollout_ref.actor.use_dynamic_bsz=True", "several samples into one micro batch"),
    ("fully-async", [], "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true", "mixes samples"),
    ("fully-async", [], "algorithm.rollout_correction.bypass_mode=True", "bypass mode off"),
    ("hybrid", ["--phase", "all"], "algorithm.rollout_correction.bypass_mode=true", "log_prob training dump"),
    ("hybrid", [], "+algorithm.rollout_correction.rollout_is=token", "rollout_correction=null"),
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
    ("hybrid", [], "trainer.balance_batch=True", "balance_batch"),
    ("fully-async", [], "data.shuffle=True", "prompt order"),
    ("hybrid", [], "data.shuffle=true", "prompt order"),
    ("fully-async", [], "actor_rollout_ref.hybrid_engine=True", "hybrid_engine is False"),
    ("hybrid", [], "trainer.val_before_train=True", "validation before training"),
    ("fully-async", [], "trainer.test_freq=5", "test_freq=-1"),
    ("hybrid", [], "actor_rollout_ref.model.use_remove_padding=False", "padded training forward"),
    (
        "hybrid",
        [],
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "one sample per log-prob",
    ),
    ("hybrid", [], "actor_rollout_ref.actor.ppo_micro_batch_size=8", "deprecated global micro batch"),
    ("hybrid", [], "actor_rollout_ref.rollout.name=sglang", "vllm-ascend"),
    ("fully-async", [], "actor_rollout_ref.rollout.calculate_log_probs=False", "must rollout calculate"),
    (
        "hybrid",
        [],
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path=/home/c.json",
        "inference-side msprobe config",
    ),
    ("hybrid", [], "~actor_rollout_ref.rollout.enforce_eager", "eager mode"),
    ("hybrid", [], "actor_rollout_ref.rollout={}", "it replaces"),
]


def _invoke(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    runner = CliRunner()
    return runner.invoke(
        app,
        ["run", *args, "--dump-root", str(tmp_path), "--run-id", "refused"],
        env=env,
        catch_exceptions=False,
    )


@pytest.mark.parametrize(
    ("mode", "options", "override", "why"), CONFLICTS, ids=[f"{m}:{o}" for m, _, o, _ in CONFLICTS]
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
        tmp_path, "hybrid", "trainer.balance_batch=True", "global_profiler.tool=precision_debugger"
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


def test_bypass_refused_even_when_only_update_actor_is_dumped(tmp_path: Path) -> None:
    """The PROMPTS_ONLY trim drops rollout log-probs, so bypass mode would fail at the first step
    in every phase (patches/hooks/prompts_only.py): refuse it up front, not after an NPU-hour."""
    result = CliRunner().invoke(
        app,
        [
            "run",
            "fully-async",
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
