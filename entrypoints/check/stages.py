"""The check's vLLM process: the same prompts twice, batched then alone, on one engine.

``python -m verl_consistency.entrypoints.check.stages rollout ARGS.json OUT.json`` (started by
:mod:`verl_consistency.entrypoints.check.command`; never by hand). The training process is the
shared ``train`` stage (``engines/fsdp_stage``), told the device and dtype.

Why one engine for both passes: the batch variance must be vLLM against itself, same weights,
same kernels, same process; only what shares the step differs. Prefix caching is off, or the
alone pass would find every prompt cached by the batched pass and compute none of it. Each
request asks for one token with ``logprobs=top_k``: the prefill is what is compared, and the
top-k at the last prompt position is the head comparison (``next_token.NextTokenProbe``).

Every wait on the engine has a deadline (``request_timeout_s``, the CLI's ``--request-timeout``):
when vLLM's engine core loses a request (on the H200 its input thread died on a malformed
request and the process lived on), ``AsyncLLM.generate`` waits forever; a check must end with
the reason instead.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from verl_consistency.entrypoints.engines import vllm_stage
from verl_consistency.entrypoints.engines.stage_runner import write_result

DEFAULT_REQUEST_TIMEOUT_S = 300.0


class EngineSilent(RuntimeError):
    """vLLM answered no request within the deadline."""


async def within(aw: Any, seconds: float, what: str) -> Any:
    """``aw``'s result, or :class:`EngineSilent` naming the pass after ``seconds``."""
    try:
        return await asyncio.wait_for(aw, seconds)
    except TimeoutError:
        raise EngineSilent(
            f"vLLM answered nothing within {seconds:g} s ({what}): its engine core may have died "
            "(the lines above in this log say why), or the model needs longer: raise --request-timeout"
        ) from None


def rollout(args: dict[str, Any]) -> dict[str, Any]:
    """Warm-up request, then the batched pass (all at once), then the alone pass (one by one)."""
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    t0 = time.monotonic()
    engine = AsyncLLM.from_engine_args(vllm_stage.engine_args(args, prefix_caching=False))
    started = time.monotonic() - t0
    top_k = int(args.get("top_k", 20))
    limit = float(args.get("request_timeout_s", DEFAULT_REQUEST_TIMEOUT_S))
    params = SamplingParams(max_tokens=1, temperature=1.0, logprobs=top_k or None, detokenize=False)

    async def one(prompt: list[int]) -> dict[str, Any]:
        return await vllm_stage.generate(engine, prompt, params)

    async def passes() -> dict[str, Any]:
        prompts: list[list[int]] = args["prompts"]
        # alone and first: the engine's first step compiles and warms its caches; its dump has
        # no counterpart (unpaired, named in the report as such)
        warm = await within(one(prompts[0][:16]), limit, "the warm-up request")
        t1 = time.monotonic()
        batched = await within(asyncio.gather(*(one(p) for p in prompts)), limit, "the batched pass")
        t2 = time.monotonic()
        alone = [await within(one(p), limit, f"prompt {i} alone") for i, p in enumerate(prompts)]
        return {
            "warmup_request_id": warm["request_id"],
            "batched": list(batched),
            "alone": alone,
            "batched_s": round(t2 - t1, 2),
            "alone_s": round(time.monotonic() - t2, 2),
        }

    try:
        out = asyncio.run(passes())
    finally:
        engine.shutdown()
    return {**out, "engine_start_s": round(started, 1)}


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if len(args_list) != 3 or args_list[0] != "rollout":
        print(
            "usage: python -m verl_consistency.entrypoints.check.stages rollout ARGS.json OUT.json",
            file=sys.stderr,
        )
        return 2
    _, args_path, out_path = args_list
    try:
        result = rollout(json.loads(Path(args_path).read_text(encoding="utf-8")))
    except EngineSilent as exc:
        print(f"check rollout: {exc}", file=sys.stderr)
        return 3
    write_result(out_path, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
