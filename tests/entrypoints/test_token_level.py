"""`verl-consistency run ... --token-level`: the triage run, composed with the pin set's verl Hydra config."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from verl_consistency.contracts.env import DumpPhase
from verl_consistency.entrypoints.run.overrides import RUNTIME_ENV_PREFIX, Mode
from verl_consistency.entrypoints.run.plan import build_plan
from verl_consistency.entrypoints.run.plan_options import PlanError, PlanOptions

from .conftest import COMPOSE_TIMEOUT, MODEL, clean_env, cli, supported

pytestmark = pytest.mark.pinset


def _compose(tmp: Path, mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    dry = cli("run", mode, "--token-level", "--dry-run", "--json", "--dump-root", str(tmp), "--run-id", "tl")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    verl = subprocess.run(
        [*plan["argv"], f"actor_rollout_ref.model.path={MODEL}", "--cfg", "job"],
        env={**clean_env(), **plan["env"]},
        capture_output=True,
        text=True,
        timeout=COMPOSE_TIMEOUT,
    )
    assert verl.returncode == 0, verl.stderr[-4000:]
    return plan, yaml.safe_load(verl.stdout)


def _get(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node[part]
    return node


@pytest.mark.verl
@pytest.mark.parametrize("mode", ["hybrid", "fully-async", "colocate-async"])
def test_token_level_composes_with_verls_config(tmp_path: Path, mode: str) -> None:
    if not supported(mode):
        pytest.skip(f"{mode} is not run on this pin set")
    plan, config = _compose(tmp_path, mode)
    assert plan["kind"] == "token-level"
    assert "--token-level" in plan["invocation"]
    assert "--capture" not in plan["invocation"]
    assert _get(config, "actor_rollout_ref.rollout.calculate_log_probs") is True
    assert _get(config, "algorithm.rollout_correction.bypass_mode") is False
    # no msprobe on either side: vLLM gets no dump config, the trainer no DUMP_ON/PROMPTS_ONLY
    vllm_kwargs = _get(config, "actor_rollout_ref.rollout.engine_kwargs.vllm") or {}
    assert "additional_config" not in vllm_kwargs
    env_vars = _get(config, RUNTIME_ENV_PREFIX)
    assert env_vars["VERL_CONSISTENCY_TOKEN_LEVEL"] == "1"
    assert env_vars["DUMP_ON"] == "0"
    assert env_vars["PROMPTS_ONLY"] == "0"
    assert env_vars["VERL_CONSISTENCY_RUN_DIR"] == str(tmp_path / "tl")
    assert "VERL_CONSISTENCY_ACTOR_CONFIG" not in env_vars
    # a collection run's data constraints do not apply: verl's own prefix caching stays
    assert _get(config, "actor_rollout_ref.rollout.enable_prefix_caching") is True
    # what verl cannot start without is set, as defaults (test_verl_validation.py runs verl's checks)
    assert _get(config, "actor_rollout_ref.rollout.name") == "vllm"
    assert _get(config, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") == 1
    assert _get(config, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu") == 1
    if mode == "fully-async":
        assert _get(config, "actor_rollout_ref.hybrid_engine") is False
    if plan["trainer_mode"] is not None:  # verl 0.9: the same trainer mode and weight-version rules
        assert _get(config, "trainer.v1.trainer_mode") == plan["trainer_mode"]
        if mode != "hybrid":
            assert _get(config, "trainer.v1.sampler.max_off_policy_threshold") == 1


def _plan(**kw: Any) -> Any:
    return build_plan(
        Mode.HYBRID, PlanOptions(dump_root="/dump", run_id="r1", environ={}, token_level=True, **kw)
    )


@pytest.mark.parametrize(
    ("kw", "option"),
    [
        ({"capture": "fraction:0.1"}, "--capture"),
        ({"phase": DumpPhase.ALL}, "--phase"),
        ({"steps": "0-3"}, "--steps"),
        ({"modules": "all"}, "--modules"),
    ],
)
def test_collection_options_are_refused(kw: dict[str, Any], option: str) -> None:
    with pytest.raises(PlanError) as err:
        _plan(**kw)
    assert any(m.startswith(option) and "--token-level" in m for m in err.value.messages)


@pytest.mark.parametrize(
    "override",
    [
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.rollout.calculate_log_probs=false",
        "actor_rollout_ref.rollout.mode=sync",
    ],
)
def test_token_level_refusals(override: str) -> None:
    with pytest.raises(PlanError, match="refused"):
        _plan(extra_args=[override])


def test_collection_only_constraints_are_free_in_a_triage_run() -> None:
    plan = _plan(
        extra_args=[
            "actor_rollout_ref.rollout.enable_prefix_caching=true",
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "trainer.balance_batch=true",
            "trainer.test_freq=5",
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        ]
    )
    assert plan.env["DUMP_ON"] == "0"
    # the defaults verl needs give way to the user's own values, each key given once
    for key, value in (
        ("actor_rollout_ref.rollout.name", "sglang"),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "8"),
    ):
        assert [o for o in plan.overrides if o.split("=", 1)[0] == key] == [f"{key}={value}"]


def test_caller_env_with_dumps_on_is_refused() -> None:
    with pytest.raises(PlanError, match="DUMP_ON"):
        build_plan(
            Mode.HYBRID,
            PlanOptions(dump_root="/dump", run_id="r1", environ={"DUMP_ON": "1"}, token_level=True),
        )


@pytest.mark.parametrize("prompts_only", [False, True], ids=["ride-along", "prompts-only"])
def test_a_collection_run_records_next_token_records_too(prompts_only: bool) -> None:
    plan = build_plan(
        Mode.HYBRID, PlanOptions(dump_root="/dump", run_id="r1", environ={}, prompts_only=prompts_only)
    )
    assert plan.env["VERL_CONSISTENCY_TOKEN_LEVEL"] == "1"
    assert plan.env.get("PROMPTS_ONLY") == ("1" if prompts_only else None)
    assert "actor_rollout_ref.rollout.calculate_log_probs=true" in plan.overrides
