"""Both modes composed with verl 0.8.0's real Hydra config, from the command this tool builds."""

from __future__ import annotations

import json

import pytest

from verl_consistency.entrypoints.overrides import ENV, RUNTIME_ENV_PREFIX, Mode

from .conftest import MODEL, Composed

pytestmark = pytest.mark.verl


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
            "data.gen_batch_size": 1,
        }
    else:
        expected |= {"actor_rollout_ref.hybrid_engine": True, "trainer.nnodes": 1}
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
    assert ("TORCHDYNAMO_DISABLE" in env_vars) is (mode is Mode.FULLY_ASYNC)


def test_verl_hands_the_env_to_ray_init(fully_async: Composed, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run verl 0.8.0's own run_ppo on the composed config and catch what it passes to ray.init."""
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
        main_ppo.run_ppo(OmegaConf.create(fully_async.config))
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
    assert manifest["overrides"] == hybrid.plan["overrides"]
    assert manifest["env"] == hybrid.plan["env"]
    assert manifest["installed"]["verl"] == manifest["pinned"]["verl"] == "0.8.0"
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
