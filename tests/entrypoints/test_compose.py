"""Every mode of the pin set in force composed with its verl's real Hydra config (0.8.0 on the
current set, 0.9.1 on the next), from the command this tool builds."""

from __future__ import annotations

import json

import pytest

from verl_consistency.contracts import pins
from verl_consistency.entrypoints.run.overrides import (
    ASYNC_MODES,
    ENV,
    NEXT,
    RUNTIME_ENV_PREFIX,
    Mode,
    launch,
    pin_set,
)

from .conftest import MODEL, Composed

pytestmark = [pytest.mark.verl, pytest.mark.pinset]


def test_values_that_matter(composed: Composed) -> None:
    run_dir = str(composed.run_dir)
    expected = {
        "actor_rollout_ref.model.path": MODEL,
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.enforce_eager": True,
        "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path": (
            f"{run_dir}/config/msprobe_rollout.json"
        ),
        "actor_rollout_ref.rollout.enable_prefix_caching": False,
        "actor_rollout_ref.rollout.enable_chunked_prefill": False,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.actor.use_dynamic_bsz": False,
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": False,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
        "trainer.val_before_train": False,
        "trainer.balance_batch": False,
        "trainer.test_freq": -1,
        "algorithm.rollout_correction": None,
        "global_profiler.tool": None,
        "data.train_files": f"{run_dir}/data/train.parquet",
        "reward.custom_reward_function.path": f"{run_dir}/data/reward.py",
        "reward.custom_reward_function.name": "compute_score",
        "trainer.logger": ["console"],
    }
    if composed.mode == "fully-async":
        expected |= {
            "actor_rollout_ref.hybrid_engine": False,
            "data.shuffle": False,
            "actor_rollout_ref.rollout.calculate_log_probs": True,
        }
        if pin_set() == NEXT:
            # verl 0.9: main_ppo's own config; the V1 async modes force gen_batch_size to 1 at run time
            expected |= {
                "data.gen_batch_size": None,
                "data.train_batch_size": 8,
                "trainer.v1.separate_async.parameter_sync_step": 1,
                "actor_rollout_ref.rollout.nnodes": 1,
                "actor_rollout_ref.rollout.n_gpus_per_node": 4,
                "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl",
            }
        else:
            # verl 0.8.0's fully_async_main: no sample is older than the trainer's weights
            # (staleness 0); one trainer step per weight sync by default (log_prob phase).
            # partial_rollout and use_trainer_do_validate keep verl's defaults: with staleness 0
            # no request is in flight at a sync, and validation is off.
            expected |= {
                "data.gen_batch_size": 1,
                "async_training.staleness_threshold": 0,
                "async_training.trigger_parameter_sync_step": 1,
                "async_training.require_batches": 1,
                "async_training.partial_rollout": True,
                "async_training.use_trainer_do_validate": False,
            }
    elif composed.mode == "colocate-async":
        expected |= {
            "actor_rollout_ref.hybrid_engine": True,
            "data.shuffle": False,
            "actor_rollout_ref.rollout.calculate_log_probs": True,
            "trainer.v1.colocate_async.num_warmup_batches": 0,
        }
    else:
        expected |= {"actor_rollout_ref.hybrid_engine": True, "trainer.nnodes": 1}
    trainer_mode = launch(Mode(composed.mode)).trainer_mode
    if trainer_mode is not None:
        expected |= {"trainer.use_v1": True, "trainer.v1.trainer_mode": trainer_mode}
    if Mode(composed.mode) in ASYNC_MODES and pin_set() == NEXT:
        expected |= {
            "trainer.v1.sampler.max_off_policy_threshold": 1,
            "trainer.v1.sampler.max_off_policy_strategy": "drop",
        }
    assert composed.plan["pin_set"] == pin_set()
    assert composed.plan["trainer_mode"] == trainer_mode
    got = {key: composed.get(key) for key in expected}
    assert got == expected


def test_env_reaches_ray_workers_through_the_composed_config(composed: Composed) -> None:
    """Every variable but the driver-only ones is in ray_kwargs.ray_init.runtime_env.env_vars, as str."""
    mode = Mode(composed.mode)
    env_vars = composed.get(RUNTIME_ENV_PREFIX)
    want = {
        k: v for k, v in composed.plan["env"].items() if not next(r for r in ENV if r.name == k).driver_only
    }
    assert env_vars == want
    assert all(isinstance(v, str) for v in env_vars.values())
    assert env_vars["DUMP_ON"] == "1"
    assert env_vars["PROMPTS_ONLY"] == "1"
    assert env_vars["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert env_vars["VERL_CONSISTENCY_ACTOR_CONFIG"] == f"{composed.run_dir}/config/msprobe_actor.json"
    assert ("TORCHDYNAMO_DISABLE" in env_vars) is (mode in ASYNC_MODES)


def test_ride_along_keeps_the_jobs_own_training_step(ride_along: Composed) -> None:
    """The default collection: no PROMPTS_ONLY anywhere, verl's own rollout correction and
    staleness settings, and the dump rows the data needs."""
    from verl_consistency.entrypoints.run import bypass

    env_vars = ride_along.get(RUNTIME_ENV_PREFIX)
    assert "PROMPTS_ONLY" not in env_vars
    assert "PROMPTS_ONLY" not in ride_along.plan["env"]
    on = bypass.verl_default(Mode.FULLY_ASYNC, pin_set()).on
    assert ride_along.get("algorithm.rollout_correction.bypass_mode") is on
    assert env_vars["DUMP_PHASE"] == ("update_actor" if on else "log_prob")
    assert ride_along.get("actor_rollout_ref.rollout.enforce_eager") is True
    assert ride_along.get("actor_rollout_ref.rollout.enable_prefix_caching") is False
    assert ride_along.get("actor_rollout_ref.hybrid_engine") is False
    if pin_set() == NEXT:
        assert ride_along.get("trainer.v1.sampler.max_off_policy_threshold") != 1  # verl's own
    else:
        assert ride_along.get("async_training.staleness_threshold") != 0  # verl's own


def test_verl_hands_the_env_to_ray_init(fully_async: Composed, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the set's verl's own run_ppo on the composed config and catch what it passes to ray.init."""
    import ray
    from omegaconf import OmegaConf
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR
    from verl.trainer import main_ppo

    captured: dict[str, object] = {}

    class Stop(Exception):
        pass

    def fake_init(**kwargs: object) -> None:
        captured.update(kwargs)
        raise Stop

    monkeypatch.delenv(RAY_JOB_CONFIG_JSON_ENV_VAR, raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    with pytest.raises(Stop):
        main_ppo.run_ppo(OmegaConf.create(fully_async.config), task_runner_class=None)
    env_vars = captured["runtime_env"]["env_vars"]  # type: ignore[index]
    for name, value in fully_async.plan["env"].items():
        if name != "RAY_OVERRIDE_JOB_RUNTIME_ENV":
            assert env_vars[name] == value, name


def test_rayjob_runtime_env_conflict_resolves_to_ours() -> None:
    """On a RayJob, Ray merges the job's runtime env with ray.init's; RAY_OVERRIDE_JOB_RUNTIME_ENV=1
    (which the run sets on the driver) makes ours win instead of failing (ray/_private/worker.py)."""
    from ray.runtime_env.runtime_env import _merge_runtime_env

    job = {"env_vars": {"DUMP_ON": "0", "OTHER": "x"}}
    ours = {"env_vars": {"DUMP_ON": "1"}}
    assert _merge_runtime_env(job, ours, override=False) is None
    assert _merge_runtime_env(job, ours, override=True) == {"env_vars": {"DUMP_ON": "1", "OTHER": "x"}}


def test_real_run_wrote_the_run_folder(hybrid: Composed) -> None:
    run = hybrid.run_dir
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["exit_code"] == 0
    assert manifest["finished_at"]
    assert manifest["command"][1:3] == ["-m", "verl.trainer.main_ppo"]
    assert manifest["pin_set"] == pin_set()
    assert manifest["trainer_mode"] == launch(Mode.HYBRID).trainer_mode
    assert manifest["overrides"] == hybrid.plan["overrides"]
    assert manifest["env"] == hybrid.plan["env"]
    assert manifest["installed"]["verl"] == manifest["pinned"]["verl"] == pins.get("upstream.verl")
    assert manifest["msprobe"]["actor"]["dump_path"] == str(run / "actor")
    assert manifest["msprobe"]["rollout"]["step"] == ["0-3"]
    for rel in (
        "config/msprobe_rollout.json",
        "config/msprobe_actor.json",
        "data/train.parquet",
        "data/reward.py",
    ):
        assert (run / rel).is_file(), rel
    assert json.loads((run / "config/msprobe_rollout.json").read_text()) == manifest["msprobe"]["rollout"]
    # The summary line says where the dumps are and what to run next.
    assert f"Next: verl-consistency postprocess {run}" in " ".join(hybrid.stderr.split())


def test_rerun_with_same_run_id_is_refused(hybrid: Composed) -> None:
    from .conftest import cli

    before = (hybrid.run_dir / "run.json").read_bytes()
    again = cli(
        "run",
        "hybrid",
        "--dump-root",
        str(hybrid.run_dir.parent),
        "--run-id",
        "hy-test",
        f"model={MODEL}",
        "--cfg",
        "job",
    )
    assert again.returncode == 2
    assert "was used already" in again.stderr
    assert (hybrid.run_dir / "run.json").read_bytes() == before
