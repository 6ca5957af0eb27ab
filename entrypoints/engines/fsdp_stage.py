"""The training side of a single-node run: verl's FSDP engine in a process of its own.

``train`` is the stage that :mod:`.stages` runs (``python -m verl_consistency.entrypoints.engines.stages
train ARGS.json OUT.json``): the real verl ``FSDPEngineWithLMHead`` (0.8.0, or 0.9.1 on the next
set; fsdp2, world size 1, eager attention and fp32 on CPU) computes old log-probs (``infer_batch``,
verl's ``log_prob`` phase) over the rollout's prompts and responses, PROMPTS_ONLY-trimmed by our
hook, with the request ids that came back from the rollout as top-level ``request_id`` /
``request_ids_all`` fields (0.8.0's ``non_tensor_batch`` columns; on 0.9.1 what the engine
receives once patch 0001 lifts them out of ``extra_fields``). The patched
``forward_backward_batch`` dumps each request of a micro batch in a lane of its own under
``actor/<pid>``.

The pieces (:func:`actor_config`, :func:`fsdp_engine`, :func:`rollout_batch`,
:func:`engine_input`, :func:`serve_pure_torch_attention_helpers`) are public because the tests'
FSDP driver (``bench/support/fsdp_driver.py``) and the GPU cost bench (``bench/gpu/fsdp_cost.py``)
build verl's engine the same way. ``train`` is :func:`start` (the process group), :func:`build`
(the engine) and :func:`log_probs` (one dumped pass), so that the weight-sync flow's trainer
(``engines/weight_sync_stages``), whose engine outlives one pass, runs the same three.

Stand-in, named: flash_attn's padding helpers cannot import on CPU, so verl's own pure-torch
copies (``verl.utils.npu_flash_attn_utils``) are served in their place (as in the FSDP tests).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def serve_cpu_platform() -> None:
    """verl 0.9 asks its platform layer (``verl.plugin.platform``) for every device call; the layer
    knows cuda, npu and rocm only and, finding none, falls back to cuda, so ``init_device_mesh`` dies
    in ``torch.cuda.set_device``. verl 0.8.0 answered "cpu" by itself and has no such layer."""
    try:
        from verl.plugin.platform import set_platform
        from verl.plugin.platform.platform_cuda import PlatformCUDA
    except ImportError:  # verl 0.8.0
        return
    import torch

    class PlatformCPU(PlatformCUDA):
        """CUDA's answers where they are device-free, the CPU's where they are not."""

        device_name = "cpu"  # type: ignore[assignment]
        vendor_name = "cpu"  # type: ignore[assignment]
        device_module = torch.cpu  # type: ignore[assignment]

        def is_available(self) -> bool:
            return True

        def current_device(self) -> Any:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

    set_platform(PlatformCPU())


def serve_pure_torch_attention_helpers(cpu_platform: bool = True) -> None:
    """verl's pure-torch padding helpers: flash_attn does not import off NPU/GPU (nor on a GPU
    machine without its wheel). On verl 0.9 the CPU platform is served first
    (``serve_cpu_platform``) unless ``cpu_platform`` is False: on a GPU verl's own CUDA platform
    must stay, or its device calls go to ``torch.cpu``."""
    if cpu_platform:
        serve_cpu_platform()
    import verl.utils.attention_utils as au
    from verl.utils import npu_flash_attn_utils as pt

    au._get_attention_functions = lambda: (pt.index_first_axis, pt.pad_input, pt.rearrange, pt.unpad_input)


FP32 = (
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision="
    "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
)
"""Same precision as the vLLM side (dtype=float32): verl's default is bf16 compute."""


def compose_actor_config(config_name: str, overrides: list[str]) -> Any:
    """The actor config verl's worker builds: Hydra's compose of verl's own trainer config
    (``config_name``: ``ppo_trainer`` or ``ppo_megatron_trainer``) with ``overrides``, as verl's
    ``ActorConfig`` dataclass. The one compose of verl's config in this repository (the FSDP stage
    and the Megatron test driver both build their engines from it), so both read verl's defaults
    of the imported verl, not a copy of them."""
    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def actor_config(model_dir: str, micro_batches: int, *extra: str, micro_batch: int = 1) -> Any:
    """verl's own Hydra defaults for the actor, as its worker builds them (fsdp2 on CPU).

    ``micro_batches`` is the mini batch (every request of the demo), ``micro_batch`` the rows
    per forward: several rows are dumped one lane per request (``hooks/lanes/msprobe_lanes.py``)."""
    return compose_actor_config(
        "ppo_trainer",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.actor.strategy=fsdp2",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={micro_batches}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch}",
            "actor_rollout_ref.actor.use_dynamic_bsz=False",
            "actor_rollout_ref.actor.use_torch_compile=False",
            *extra,
        ],
    )


def rollout_batch(requests: list[dict[str, Any]]) -> Any:
    """A rollout batch shaped like verl's agent loop output: left-padded prompts, right-padded responses."""
    import numpy as np
    import torch
    from verl import DataProto

    n = len(requests)
    plen = max(len(r["prompt_ids"]) for r in requests)
    rlen = max(max(len(r["response_ids"]) for r in requests), 1)
    prompts = torch.zeros(n, plen, dtype=torch.long)
    responses = torch.zeros(n, rlen, dtype=torch.long)
    attn = torch.zeros(n, plen + rlen, dtype=torch.long)
    for i, r in enumerate(requests):
        p, resp = r["prompt_ids"], r["response_ids"]
        prompts[i, plen - len(p) :] = torch.tensor(p)
        if resp:
            responses[i, : len(resp)] = torch.tensor(resp)
        attn[i, plen - len(p) : plen + len(resp)] = 1
    input_ids = torch.cat([prompts, responses], dim=1)
    position_ids = torch.clamp(torch.cumsum(attn, dim=1) - 1, min=0)
    ids = [r["request_id"] for r in requests]
    every = np.empty(n, dtype=object)
    every[:] = [[i] for i in ids]
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": attn[:, plen:].clone(),
        "input_ids": input_ids,
        "attention_mask": attn,
        "position_ids": position_ids,
    }
    non_tensors = {"request_id": np.array(ids, dtype=object), "request_ids_all": every}
    # vLLM's log-probs where the rollout asked for them (NaN where none; only position 0 is
    # known), and its top-k there: what the PROMPTS_ONLY trim stashes for the output row
    if any(r.get("first_token_log_prob") is not None for r in requests):
        from verl_consistency.contracts.token_records import NEXT_TOKEN_TOPK

        logps = torch.full((n, rlen), float("nan"), dtype=torch.float32)
        topk = np.empty(n, dtype=object)
        for i, r in enumerate(requests):
            if r.get("first_token_log_prob") is not None:
                logps[i, 0] = r["first_token_log_prob"]
            topk[i] = r.get("topk")
        tensors["rollout_log_probs"] = logps
        non_tensors[NEXT_TOKEN_TOPK] = topk
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def fsdp_engine(model_dir: str, actor_cfg: Any, attn_implementation: str = "eager") -> Any:
    """verl's ``FSDPEngineWithLMHead`` (eager attention unless told), built directly: its registry
    knows only cuda and npu. The demo, ``check``, the tests' FSDP driver and the GPU cost bench
    (``bench/gpu/fsdp_cost.py``: ``sdpa``, the device has no flash_attn) all build it here."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    model_config = HFModelConfig(
        path=model_dir,
        load_tokenizer=False,
        override_config={"attn_implementation": attn_implementation},
        use_remove_padding=True,
        enable_gradient_checkpointing=False,
    )
    engine = FSDPEngineWithLMHead(
        model_config=model_config,
        engine_config=actor_cfg.engine,
        optimizer_config=actor_cfg.optim,
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    return engine


DIST_BACKEND = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
"""torch.distributed backend per device (world size 1: FSDP still wants a process group)."""


def precision(device: str, dtype: str) -> tuple[list[str], str]:
    """The actor overrides for ``dtype`` and the attention implementation for ``device``.

    float32: fp32 compute (:data:`FP32`), as vLLM's ``dtype=float32``; bfloat16/float16: verl's own
    mixed precision with that compute dtype (parameters gathered in it, reductions in fp32), which
    is what an RL job trains with. Attention: eager on CPU (the reference), sdpa on GPU/NPU
    (``flash_attention_2`` needs a flash-attn wheel the machine may lack).
    """
    attn = "eager" if device == "cpu" else "sdpa"
    if dtype == "float32":
        return [FP32], attn
    short = {"bfloat16": "bf16", "float16": "fp16"}[dtype]
    return [
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision="
        f"{{param_dtype:{short},reduce_dtype:fp32,buffer_dtype:fp32}}"
    ], attn


def _serve_attention_helpers(device: str) -> None:
    """verl's pure-torch padding helpers where flash_attn cannot import (CPU; a GPU without the wheel)."""
    if device == "cpu":
        serve_pure_torch_attention_helpers()
        return
    if device == "cuda":
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            serve_pure_torch_attention_helpers(cpu_platform=False)


def engine_input(batch: Any, micro_batch: int) -> Any:
    """The TensorDict verl's ``infer_batch`` takes (log_prob phase: static micro batches, remove
    padding, no loss), fresh per call: ``forward_backward_batch`` writes fields into the one it
    gets. The demo, ``check`` and the GPU cost bench all build it here."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(
        td,
        use_remove_padding=True,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=micro_batch,
        max_token_len_per_gpu=1 << 16,
        use_fused_kernels=False,
        temperature=1.0,
        calculate_entropy=False,
        compute_loss=False,
    )
    return td


def start(device: str, port: int) -> None:
    """The process group verl's engine wants (world size 1, the device's backend), then the
    attention helpers: every process that builds the engine starts here (``train``, and the
    weight-sync session's trainer, ``engines/weight_sync_stages``)."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    dist.init_process_group(DIST_BACKEND[device], rank=0, world_size=1)
    _serve_attention_helpers(device)


def build(model_dir: str, requests: int, device: str, dtype: str, *extra: str, micro_batch: int = 1) -> Any:
    """verl's FSDP engine over ``model_dir`` for a mini batch of ``requests``, in ``dtype`` on
    ``device``; ``extra``: more actor overrides (the weight-sync session's learning rate)."""
    overrides, attn = precision(device, dtype)
    actor_cfg = actor_config(model_dir, requests, *overrides, *extra, micro_batch=micro_batch)
    return fsdp_engine(model_dir, actor_cfg, attn_implementation=attn)


def log_probs(engine: Any, requests: list[dict[str, Any]], micro_batch: int) -> dict[str, Any]:
    """Old log-probs of ``requests`` (verl's ``infer_batch``, the log_prob phase), PROMPTS_ONLY-
    trimmed by our hook: the patched engine dumps each request in a lane of its own."""
    import torch
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    from verl_consistency.patches.hooks.training import prompts_only

    batch = prompts_only.trim(rollout_batch(requests))
    td = engine_input(batch, micro_batch)
    t0 = time.monotonic()
    with engine.eval_mode():
        out = engine.infer_batch(td)
    values = no_padding_2_padding(tu.get(out["model_output"], "log_probs"), td)
    return {
        "log_probs_finite": bool(torch.isfinite(values).all()),
        "micro_batches": -(-len(requests) // micro_batch),
        "micro_batch": micro_batch,
        "infer_s": round(time.monotonic() - t0, 1),
    }


def train(args: dict[str, Any]) -> dict[str, Any]:
    """Old log-probs on the real verl FSDP engine, PROMPTS_ONLY, ``micro_batch`` requests per forward.

    ``device`` (cpu, cuda or npu) and ``dtype`` default to the demo's: CPU, fp32.
    """
    import torch.distributed as dist

    device, dtype = str(args.get("device", "cpu")), str(args.get("dtype", "float32"))
    start(device, int(args["port"]))
    requests = args["requests"]
    micro_batch = int(args.get("micro_batch", 1))
    engine = build(args["model_dir"], len(requests), device, dtype, micro_batch=micro_batch)
    out = log_probs(engine, requests, micro_batch)
    dist.destroy_process_group()
    return {**out, "device": device, "dtype": dtype}
