"""Driver of test_one_gpu.py's Ray test: verl 0.9.1's own pools and weight sync, two logical GPUs over one.

Run as ``python -m tests.bench.one_gpu_driver RESULT.json WORK_DIR`` from the repository root, in
the next set's venv, on CPU. It does what the one-GPU harness (bench/gpu/one_gpu/README.md) sets
up on the device, with verl's and Ray's real code:

* Ray is started as verl's ``run_ppo`` starts it with ``+ray_kwargs.ray_init.num_gpus=2``, in an
  environment holding ``CUDA_VISIBLE_DEVICES=0,0`` (Ray declares two GPUs; no GPU is needed here).
* The trainer's pool is verl's ``ResourcePoolManager`` (``global_pool``, one GPU, as
  ``trainer_base._init_resource_pool_mgr``); the rollout's is made as
  ``RolloutReplica.init_standalone`` makes it (``rollout_pool_0``, ``max_colocate_count=2``), and
  its worker is verl's real ``CheckpointEngineWorker``, created by ``RayWorkerGroup``.
* Each worker reports what Ray gave it: the accelerator ids (what ``Worker.
  _setup_env_cuda_visible_devices`` and vLLM's ``launch_servers`` read) and ``CUDA_VISIBLE_DEVICES``.
* verl's real ``CheckpointEngineManager.update_weights`` moves two versions of the weights from
  the trainer to the rollout through the stand-in backend, registered by
  ``custom_backend_module=one_gpu_ckpt``.

Stand-ins, named so: the trainer worker (:class:`TrainerStandIn`, the two methods of
``engine_workers.ActorRolloutRefWorker`` that the manager calls, and its engine construction,
engine_workers.py:680-688), the replica (:class:`ReplicaStandIn`: no vLLM server), and the server
adapter (:class:`RecordingAdapter`: saves what verl's ``CheckpointEngineWorker.update_weights``
hands to vLLM).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ONE_GPU = REPO / "bench" / "gpu" / "one_gpu"
BACKEND_MODULE = "one_gpu_ckpt"
BUCKET_MB = 1


def make_weights(version: int) -> list[tuple[str, Any]]:
    """The trainer's weights at a version: dtypes of a bf16 model and its fp32 norms, a tensor
    larger than a bucket, odd sizes; the same on both sides of the check."""
    import torch

    g = torch.Generator().manual_seed(1000 + version)
    return [
        ("model.embed_tokens.weight", torch.randn(600, 1024, generator=g).to(torch.bfloat16)),  # > 1 MiB
        ("model.layers.0.input_layernorm.weight", torch.randn(513, generator=g)),
        ("model.layers.0.self_attn.q_proj.bias", torch.randn(37, generator=g).to(torch.bfloat16)),
        ("model.layers.0.mlp.down_proj.weight", torch.randn(256, 300, generator=g).to(torch.float16)),
        ("lm_head.weight", torch.randn(700, 512, generator=g).to(torch.bfloat16)),
    ]


def placement_report() -> dict[str, Any]:
    import ray

    ctx = ray.get_runtime_context()
    return {
        "accelerator_ids": ctx.get_accelerator_ids().get("GPU"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "local_rank": os.environ.get("LOCAL_RANK"),
    }


class RecordingAdapter:
    """Stand-in for vLLM's ServerAdapter: saves each sync's (name, tensor) list to OUT/sync-<step>.pt."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.replica_rank = 0
        self.is_leader_rank = True

    async def update_weights(self, weights: Any, global_steps: int | None = None, **kwargs: Any) -> None:
        import torch

        got = [(name, t.clone()) async for name, t in weights]
        torch.save(
            {"wire_format": kwargs.get("wire_format"), "weights": got}, f"{self.out}/sync-{global_steps}.pt"
        )


class ReplicaStandIn:
    """Stand-in for a standalone ``RolloutReplica``: its workers, and no-op server controls."""

    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def resume_generation(self) -> None:
        return None


def trainer_class() -> type:
    from verl.checkpoint_engine import CheckpointEngineRegistry
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.utils.import_utils import import_external_libs
    from verl.workers.config import CheckpointEngineConfig

    class TrainerStandIn(Worker):
        """The trainer worker's checkpoint-engine part, as engine_workers.py:680-688 builds it."""

        def __init__(self, config: CheckpointEngineConfig) -> None:
            super().__init__()
            import_external_libs(config.custom_backend_module or None)
            self.checkpoint_engine = CheckpointEngineRegistry.new(
                config.backend,
                is_master=(self.rank == 0),
                bucket_size=config.update_weights_bucket_megabytes << 20,
                **config.engine_kwargs.get(config.backend, {}),
            )

        @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
        def execute_checkpoint_engine(self, method: str, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.checkpoint_engine, method)(*args, **kwargs)

        @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
        async def update_weights(self, global_steps: int | None = None, mode: str = "auto") -> dict:
            metrics = await self.checkpoint_engine.send_weights(
                iter(make_weights(global_steps or 0)), global_steps
            )
            return metrics or {}

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def placement(self) -> dict[str, Any]:
            return placement_report()

    return TrainerStandIn


def main(result: Path, work: Path, visible: str = "0,0") -> None:
    """``visible``: CUDA_VISIBLE_DEVICES for the cluster ("0,0", as the harness exports; "-" for
    unset, the setting of the failed attempt in issue 33, where the rollout's pool gets id 1)."""
    if visible == "-":
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    os.environ.pop("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", None)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ONE_GPU), str(REPO), os.environ.get("PYTHONPATH", "")])
    sys.path[:0] = [str(ONE_GPU), str(REPO)]
    import ray
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.checkpoint_engine.base import CheckpointEngineWorker
    from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, ResourcePoolManager
    from verl.workers.config import CheckpointEngineConfig

    ray.init(
        num_cpus=8, num_gpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR"
    )
    config = CheckpointEngineConfig(
        backend="one_gpu_shm",
        update_weights_bucket_megabytes=BUCKET_MB,
        engine_kwargs={"one_gpu_shm": {"root": str(work), "device": "cpu", "timeout_s": 120.0}},
        custom_backend_module=BACKEND_MODULE,
    )
    trainer_pools = ResourcePoolManager(resource_pool_spec={"global_pool": [1]}, mapping={})
    trainer_pools.create_resource_pool()
    trainer = RayWorkerGroup(
        resource_pool=trainer_pools.resource_pool_dict["global_pool"],
        ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(trainer_class()), config=config),
        name_prefix="trainer",
    )
    rollout_pools = ResourcePoolManager(
        resource_pool_spec={"rollout_pool_0": [1]}, mapping=None, max_colocate_count=2
    )  # replica.py:199-207
    rollout_pools.create_resource_pool()
    rollout_config = SimpleNamespace(name="vllm", checkpoint_engine=config)
    rollout = RayWorkerGroup(
        resource_pool=rollout_pools.resource_pool_dict["rollout_pool_0"],
        ray_cls_with_init=RayClassWithInitArgs(
            cls=ray.remote(CheckpointEngineWorker),
            rollout_config=rollout_config,
            model_config=None,
            server_adapter=RecordingAdapter(str(work)),
        ),
        bin_pack=False,
        name_prefix="rollout_standalone_0",
        use_gpu=True,
    )
    placements = {
        "trainer": trainer.placement()[0],
        "rollout": ray.get(rollout.workers[0].__ray_call__.remote(lambda self: placement_report())),
    }
    manager = CheckpointEngineManager(
        config=config, actor_wg=trainer, replicas=[ReplicaStandIn(rollout.workers)]
    )
    metrics = {step: manager.update_weights(global_steps=step) for step in (1, 2)}
    leftover = sorted(p.name for p in work.iterdir() if p.name.startswith("verl-one-gpu-"))
    result.write_text(json.dumps({"placements": placements, "metrics": metrics, "leftover": leftover}))
    ray.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:4])
