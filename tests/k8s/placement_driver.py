"""Ray driver for tests/k8s/test_placement.py: builds verl 0.8.0's fully-async pools, reports bundles.

Run as a subprocess (one Ray job per run)::

    python placement_driver.py ADDRESS SCENARIOS_JSON [RUNTIME_ENV_YAML_FILE]

With a runtime-env file it does what KubeRay's RayJob does: the job supervisor hands the
RayJob's ``runtimeEnvYAML`` to the driver as ``RAY_JOB_CONFIG_JSON_ENV_VAR`` and Ray merges it
with the runtime env that verl's ``run_ppo`` passes to ``ray.init``. Then, like verl's
``FullyAsyncTaskRunner``, an actor composes the real fully-async Hydra config and creates:

* the trainer pool with ``create_resource_pool_manager`` + ``create_resource_pool()``, as
  ``FullyAsyncTaskRunner._create_trainer`` / ``FullyAsyncTrainer._init_resource_pools`` do;
* one standalone pool per rollout replica through the real ``RolloutReplica.init_standalone``,
  as ``FullyAsyncAgentLoopManager._initialize_llm_servers`` does.

Two stand-ins, for what cannot exist on a CPU host: ``StandInWorkerGroup`` replaces
``RayWorkerGroup`` (it calls ``get_placement_groups`` exactly as ``RayWorkerGroup`` does, but
starts no torch workers), and ``StandInReplica`` is a ``RolloutReplica`` whose ``launch_servers``
starts no vLLM server. ``is_torch_npu_available`` is answered True so verl asks for ``NPU``.
Prints one JSON line: ``{"scenario": [{"pg": name, "state": ..., "nodes": [...], "bundles": [...]}]}``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

import ray
import yaml

FULLY_ASYNC_CONFIG = "experimental/fully_async_policy/config"


@ray.remote(num_cpus=1)  # like verl's FullyAsyncTaskRunner
class PoolBuilder:
    def build(self, scenario: dict[str, Any]) -> list[dict[str, Any]]:
        import asyncio

        import verl
        import verl.workers.rollout.replica as replica_mod
        from hydra import compose, initialize_config_dir
        from verl.experimental.separation.utils import create_resource_pool_manager
        from verl.trainer.ppo.utils import Role

        class StandInWorkerGroup:
            """Stand-in for RayWorkerGroup: the same get_placement_groups call, no torch workers."""

            def __init__(
                self, resource_pool: Any, bin_pack: bool = True, device_name: str = "cuda", **_: Any
            ):
                strategy = "STRICT_PACK" if bin_pack else "PACK"  # RayWorkerGroup._init_with_resource_pool
                self.pgs = resource_pool.get_placement_groups(strategy=strategy, device_name=device_name)
                self.workers: list[Any] = []

        class StandInReplica(replica_mod.RolloutReplica):
            """Stand-in for vLLMReplica: no vLLM server behind it."""

            async def launch_servers(self) -> None:
                return None

        replica_mod.RayWorkerGroup = StandInWorkerGroup  # type: ignore[attr-defined]
        replica_mod.is_torch_npu_available = lambda check_device=False: True  # type: ignore[attr-defined]

        overrides = [
            f"trainer.nnodes={scenario['trainer_nodes']}",
            f"trainer.n_gpus_per_node={scenario['trainer_npus']}",
            f"rollout.nnodes={scenario['rollout_nodes']}",
            f"rollout.n_gpus_per_node={scenario['rollout_npus']}",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "trainer.device=npu",
        ]
        with initialize_config_dir(
            config_dir=os.path.join(os.path.dirname(verl.__file__), FULLY_ASYNC_CONFIG), version_base=None
        ):
            config = compose("fully_async_ppo_trainer", overrides=overrides)
        # fully_async_main.main copies the top-level rollout block into actor_rollout_ref.rollout.
        config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
        config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node

        pgs: list[Any] = []
        if scenario.get("trainer", True):
            # FullyAsyncTaskRunner._create_trainer: roles of create_role_worker_mapping minus Rollout.
            manager = create_resource_pool_manager(config, roles=[Role.Actor, Role.Critic])
            manager.create_resource_pool()
            for pool in manager.resource_pool_dict.values():
                pgs += StandInWorkerGroup(resource_pool=pool, device_name=config.trainer.device).pgs

        rollout_config = config.actor_rollout_ref.rollout
        world = rollout_config.tensor_model_parallel_size * rollout_config.data_parallel_size
        world *= rollout_config.pipeline_model_parallel_size
        n_replicas = rollout_config.n_gpus_per_node * rollout_config.nnodes // world
        replicas = [
            StandInReplica(
                replica_rank=rank,
                config=rollout_config,
                model_config=None,
                gpus_per_node=rollout_config.n_gpus_per_node,
            )
            for rank in range(n_replicas)
        ]
        for replica in replicas:
            # init_standalone blocks in ray.get(pg.ready()) while a pool cannot be placed.
            thread = threading.Thread(target=asyncio.run, args=(replica.init_standalone(),), daemon=True)
            thread.start()
            thread.join(timeout=scenario.get("ready_timeout_s", 20))
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
        return sorted(report, key=lambda r: r["pg"])


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

    # verl's run_ppo: ray.init(runtime_env=merge(get_ppo_ray_runtime_env(), ray_kwargs...)).
    runtime_env = OmegaConf.to_container(OmegaConf.merge(get_ppo_ray_runtime_env(), {}))
    # The nodes listen on loopback; without this the driver looks for a raylet on the host's IP.
    ray.init(address=address, runtime_env=runtime_env, _node_ip_address="127.0.0.1", logging_level="ERROR")
    builder = PoolBuilder.remote()
    out = {s["name"]: ray.get(builder.build.remote(s)) for s in scenarios}
    print("RESULT " + json.dumps(out))
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
