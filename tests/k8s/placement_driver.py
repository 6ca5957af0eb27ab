"""Ray driver for tests/k8s/test_placement.py: builds verl's own fully-async pools, reports bundles.

Run as a subprocess (one Ray job per run)::

    python placement_driver.py ADDRESS SCENARIOS_JSON [RUNTIME_ENV_YAML_FILE]

With a runtime-env file it does what KubeRay's RayJob does: the job supervisor hands the
RayJob's ``runtimeEnvYAML`` to the driver as ``RAY_JOB_CONFIG_JSON_ENV_VAR`` and Ray merges it
with the runtime env that verl's ``run_ppo`` passes to ``ray.init``. Then, like verl's task
runner, an actor composes verl's real Hydra config and creates the pools with verl's own code.
Which code depends on the verl release the actor finds (its distribution version, through
:func:`verl_consistency.patches.hooks.ray_setup.placement.has_v1_trainer`), not on the pin set's name:

* verl 0.8.0 (``fully_async_policy``), as ``FullyAsyncTaskRunner`` does: the trainer pool with
  ``create_resource_pool_manager`` + ``create_resource_pool()`` (``_create_trainer`` /
  ``FullyAsyncTrainer._init_resource_pools``), and one standalone pool per rollout replica
  through the real ``RolloutReplica.init_standalone``
  (``FullyAsyncAgentLoopManager._initialize_llm_servers``).
* verl >= 0.9 (the V1 trainer, ``trainer.v1.trainer_mode=separate_async``), as
  ``PPOTrainerSeparateAsync._setup`` does: the real ``PPOTrainerSeparateAsync(config)``, its
  ``_init_resource_pool_mgr()`` and ``resource_pool_manager.create_resource_pool()``
  (``trainer_base.py:230-231``), a worker group per pool, then the real
  ``LLMServerManager._initialize_llm_servers``: the hybrid replicas on the trainer's worker group
  (``actor_rollout_ref.hybrid_engine``, the default), then the standalone ones starting at rank =
  number of hybrid replicas (``trainer_separate_async.py:_setup``), each through the real
  ``init_standalone`` (``replica.py:198``). TransferQueue is not started: no pool needs it.
  The bundles' device resource comes from verl's platform layer (``base.py:139-144``):
  ``StandInNPUPlatform`` is verl's own ``PlatformNPU`` but for ``is_available()``, which needs
  ``torch.npu`` (torch_npu) even when only the Ray resource name ``NPU`` is asked for.

Stand-ins, for what cannot exist on a CPU host: ``StandInWorkerGroup`` replaces
``RayWorkerGroup`` (it calls ``get_placement_groups`` exactly as ``RayWorkerGroup`` does, but
starts no torch workers), and ``StandInReplica`` is a ``RolloutReplica`` whose ``launch_servers``
starts no vLLM server. On 0.8.0, ``is_torch_npu_available`` is answered True so verl asks for ``NPU``.
Every stage runs in a thread with a deadline, because verl waits in ``ray.get(pg.ready())``
while a pool cannot be placed; a stage that fails raises here.
Prints one JSON line: ``{"scenario": [{"pg": name, "state": ..., "nodes": [...], "bundles": [...]}]}``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import ray
import yaml

RESULT = "RESULT "
"""The prefix of the one stdout line that carries the driver's JSON result."""
FULLY_ASYNC_CONFIG = "experimental/fully_async_policy/config"  # verl 0.8.0
PPO_CONFIG = "trainer/config"  # verl >= 0.9: fully async is main_ppo's V1 separate_async mode


def run_bounded(stage: Callable[[], Any], timeout: float) -> None:
    """Run ``stage`` in a daemon thread for at most ``timeout`` s: a pool that cannot be placed
    leaves verl waiting in ``ray.get(pg.ready())``. An error that ``stage`` raises is raised here."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            stage()
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=timeout)
    if errors:
        raise errors[0]


class StandInWorkerGroup:
    """Stand-in for RayWorkerGroup: the same get_placement_groups call, no torch workers."""

    def __init__(self, resource_pool: Any, bin_pack: bool = True, device_name: str = "cuda", **_: Any):
        strategy = "STRICT_PACK" if bin_pack else "PACK"  # RayWorkerGroup._init_with_resource_pool
        self.pgs = resource_pool.get_placement_groups(strategy=strategy, device_name=device_name)
        self.world_size = resource_pool.world_size
        self.workers: list[Any] = [None] * self.world_size  # init_hybrid slices them per replica


def compose(config_dir: str, config_name: str, overrides: list[str]) -> Any:
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(
        config_dir=os.path.join(os.path.dirname(verl.__file__), config_dir), version_base=None
    ):
        return hydra_compose(config_name, overrides=overrides)


def build_fully_async_policy(scenario: dict[str, Any]) -> None:
    """verl 0.8.0: ``fully_async_policy``'s trainer pool and standalone rollout pools."""
    import asyncio

    import verl.workers.rollout.replica as replica_mod
    from verl.experimental.separation.utils import create_resource_pool_manager
    from verl.trainer.ppo.utils import Role

    class StandInReplica(replica_mod.RolloutReplica):
        """Stand-in for vLLMReplica: no vLLM server behind it."""

        async def launch_servers(self) -> None:
            return None

    replica_mod.RayWorkerGroup = StandInWorkerGroup  # type: ignore[attr-defined]
    replica_mod.is_torch_npu_available = lambda check_device=False: True  # type: ignore[attr-defined]

    config = compose(
        FULLY_ASYNC_CONFIG,
        "fully_async_ppo_trainer",
        [
            f"trainer.nnodes={scenario['trainer_nodes']}",
            f"trainer.n_gpus_per_node={scenario['trainer_npus']}",
            f"rollout.nnodes={scenario['rollout_nodes']}",
            f"rollout.n_gpus_per_node={scenario['rollout_npus']}",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "trainer.device=npu",
        ],
    )
    # fully_async_main.main copies the top-level rollout block into actor_rollout_ref.rollout.
    config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
    config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    timeout = scenario.get("ready_timeout_s", 120)  # a stage that places returns at once

    if scenario.get("trainer", True):

        def trainer() -> None:
            # FullyAsyncTaskRunner._create_trainer: roles of create_role_worker_mapping minus Rollout.
            manager = create_resource_pool_manager(config, roles=[Role.Actor, Role.Critic])
            manager.create_resource_pool()
            for pool in manager.resource_pool_dict.values():
                StandInWorkerGroup(resource_pool=pool, device_name=config.trainer.device)

        run_bounded(trainer, timeout)

    if scenario.get("rollout", True):
        rollout_config = config.actor_rollout_ref.rollout
        world = rollout_config.tensor_model_parallel_size * rollout_config.data_parallel_size
        world *= rollout_config.pipeline_model_parallel_size
        n_replicas = rollout_config.n_gpus_per_node * rollout_config.nnodes // world
        for rank in range(n_replicas):
            replica = StandInReplica(
                replica_rank=rank,
                config=rollout_config,
                model_config=None,
                gpus_per_node=rollout_config.n_gpus_per_node,
            )
            run_bounded(lambda r=replica: asyncio.run(r.init_standalone()), timeout)


def build_v1_separate_async(scenario: dict[str, Any]) -> None:
    """verl >= 0.9: the V1 ``separate_async`` trainer's ``global_pool`` and its rollout pools."""
    import asyncio

    from verl.plugin.platform import get_platform, set_platform
    from verl.plugin.platform.platform_npu import PlatformNPU

    class StandInNPUPlatform(PlatformNPU):
        """Stand-in NPU platform: verl's own PlatformNPU (device ``npu``, Ray resource ``NPU``)
        on a host without torch_npu, where the real one dies in ``is_available()`` on ``torch.npu``
        (``VERL_PLATFORM=huawei`` selects it, and ``_create_platform`` asks)."""

        def is_available(self) -> bool:
            return False  # no NPU here; verl then only warns, as in a CPU-only Ray actor

    standin_platform = StandInNPUPlatform()
    set_platform(standin_platform)  # before verl's first get_platform(), which would fall back to cuda

    import verl.workers.rollout.replica as replica_mod
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
    from verl.workers.rollout.llm_server import LLMServerManager

    if get_platform() is not standin_platform:
        raise RuntimeError(f"verl replaced the stand-in NPU platform: {get_platform()!r}")

    class StandInReplica(replica_mod.RolloutReplica):
        """Stand-in for vLLMReplica: no vLLM server behind it."""

        async def launch_servers(self) -> None:
            return None

    class StandInServerManager(LLMServerManager):
        # LLMServerManager.__init__ keeps a class-level rollout_replica_class ("for recipe to change").
        rollout_replica_class = StandInReplica

    replica_mod.RayWorkerGroup = StandInWorkerGroup  # type: ignore[attr-defined]

    sync_step = 2  # separate_async asserts train_batch_size == parameter_sync_step * ppo_mini_batch_size
    config = compose(
        PPO_CONFIG,
        "ppo_trainer",
        [
            "trainer.use_v1=true",
            "trainer.v1.trainer_mode=separate_async",
            f"trainer.v1.separate_async.parameter_sync_step={sync_step}",
            f"data.train_batch_size={sync_step * 2}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            f"actor_rollout_ref.hybrid_engine={str(scenario.get('hybrid_engine', True)).lower()}",
            f"trainer.nnodes={scenario['trainer_nodes']}",
            f"trainer.n_gpus_per_node={scenario['trainer_npus']}",
            f"actor_rollout_ref.rollout.nnodes={scenario['rollout_nodes']}",
            f"actor_rollout_ref.rollout.n_gpus_per_node={scenario['rollout_npus']}",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=hccl",  # separate_async refuses naive
            "trainer.device=npu",
        ],
    )
    trainer = PPOTrainerSeparateAsync(config)
    timeout = scenario.get("ready_timeout_s", 120)  # a stage that places returns at once
    hybrid_replicas: list[Any] = []

    if scenario.get("trainer", True):

        def trainer_pools() -> None:
            # PPOTrainer._setup, trainer_base.py:230-231, then one worker group per pool (L306-314).
            trainer._init_resource_pool_mgr()
            trainer.resource_pool_manager.create_resource_pool()
            groups = {
                pool: StandInWorkerGroup(resource_pool=pool, device_name=config.trainer.device)
                for pool in trainer.resource_pool_manager.resource_pool_dict.values()
            }
            if trainer._enable_hybrid_replicas:
                # PPOTrainer._setup step 9 (L371-376): replicas on the actor's worker group, no pool
                # of their own. The first role that _init_resource_pool_mgr maps is the actor's.
                actor_role = next(iter(trainer.role_worker_mapping))
                actor_wg = groups[trainer.resource_pool_manager.get_resource_pool(actor_role)]
                manager = StandInServerManager(config=config, worker_group=actor_wg)
                asyncio.run(manager._initialize_llm_servers())
                hybrid_replicas.extend(manager.rollout_replicas)

        run_bounded(trainer_pools, timeout)
    elif trainer._enable_hybrid_replicas:
        raise ValueError("hybrid replicas come first, so the standalone ranks need the trainer: build it")

    if scenario.get("rollout", True):
        # PPOTrainerSeparateAsync._setup (L153-156): standalone ranks start at the number of hybrid replicas.
        standalone = StandInServerManager(config=config, start_rank=len(hybrid_replicas))
        run_bounded(lambda: asyncio.run(standalone._initialize_llm_servers()), timeout)


@ray.remote(num_cpus=1)  # like verl's task runner
class PoolBuilder:
    def build(self, scenario: dict[str, Any]) -> dict[str, Any]:
        from verl_consistency.patches.hooks.ray_setup import placement

        version = placement.installed_verl_version()
        if placement.has_v1_trainer(version):
            build_v1_separate_async(scenario)
        else:
            build_fully_async_policy(scenario)

        from ray.util import placement_group_table

        table = placement_group_table()
        report = []
        names = {n["NodeID"]: n["NodeName"] for n in ray.nodes()}
        for info in table.values():
            if info["state"] == "REMOVED":
                continue
            report.append(
                {
                    "pg": info["name"],
                    "state": info["state"],
                    "nodes": [names.get(n) for n in info["bundles_to_node_id"].values()],
                    "bundles": list(info["bundles"].values()),
                }
            )
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup

        for pg_id, info in table.items():
            if info["state"] != "REMOVED":
                ray.util.remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))
        return {"verl": version, "pgs": sorted(report, key=lambda r: r["pg"])}


def main(address: str, scenarios: list[dict[str, Any]], runtime_env_file: str | None) -> None:
    if runtime_env_file:
        from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

        with open(runtime_env_file) as f:
            job_runtime_env = yaml.safe_load(f)
        # What ray's JobSupervisor sets for a submitted job (job_supervisor.py, Ray 2.48).
        os.environ[RAY_JOB_CONFIG_JSON_ENV_VAR] = json.dumps({"runtime_env": job_runtime_env, "metadata": {}})
        os.environ.update({k: str(v) for k, v in job_runtime_env.get("env_vars", {}).items()})
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    # verl's run_ppo: ray.init(runtime_env=merge(get_ppo_ray_runtime_env(), ray_kwargs...)); 0.9's
    # optional config argument only adds CUDA_DEVICE_MAX_CONNECTIONS for Megatron on Hopper/Ampere.
    runtime_env = OmegaConf.to_container(OmegaConf.merge(get_ppo_ray_runtime_env(), {}))
    # The nodes listen on loopback; without this the driver looks for a raylet on the host's IP.
    # log_to_driver=False: Ray's log thread would print the workers' lines into this stdout, and
    # once one landed on the RESULT line itself (CI: "Extra data" at its end).
    ray.init(
        address=address,
        runtime_env=runtime_env,
        _node_ip_address="127.0.0.1",
        logging_level="ERROR",
        log_to_driver=False,
    )
    builder = PoolBuilder.remote()
    out = {s["name"]: ray.get(builder.build.remote(s)) for s in scenarios}
    sys.stdout.write(f"{RESULT}{json.dumps(out)}\n")  # one write: print() writes the newline apart
    sys.stdout.flush()
    ray.shutdown()


def read_result(stdout: str) -> Any:
    """The last RESULT line's JSON document (whatever follows it on that line is ignored), or None."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT)]
    return json.JSONDecoder().raw_decode(lines[-1], len(RESULT))[0] if lines else None


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
