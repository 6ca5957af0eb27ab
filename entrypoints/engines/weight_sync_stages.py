"""The two engine processes of the weight-sync flow: ``python -m
verl_consistency.entrypoints.engines.weight_sync_stages rollout|train``, started and driven by
``engines/weight_sync_flow`` through ``engines/session`` (never by hand).

* ``rollout``: one real vLLM ``AsyncLLM`` (as ``engines/vllm_stage``, with verl's worker
  extension, ``engines/cpu_worker_extension``) that generates, and loads weight syncs between
  generations without restarting; the patched runner dumps every prefill under
  ``$VERL_CONSISTENCY_RUN_DIR/rollout/<pid>`` and stamps each step with the loaded sync's label.
* ``train``: verl's FSDP engine (``engines/fsdp_stage``) that computes old log-probs (dumped,
  PROMPTS_ONLY, as the demo's), takes an optimizer step, and sends its weights
  (``engines/weight_sync``).

Each keeps its engine between requests; why one process per engine: ``engines/stages``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from verl_consistency.entrypoints.engines import fsdp_stage, vllm_stage, weight_sync
from verl_consistency.entrypoints.engines.session import serve


class Rollout:
    """The vLLM side: one engine and the event loop its requests and syncs run on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.engine: Any = None
        self.top_k = 20

    def start(self, args: dict[str, Any]) -> dict[str, Any]:
        """Start the engine, then one request alone: the first sampling step compiles (see
        ``vllm_stage.rollout``); its dump stays unpaired."""
        from vllm import SamplingParams
        from vllm.v1.engine.async_llm import AsyncLLM

        t0 = time.monotonic()
        eargs = {**args, "engine_kwargs": {"worker_extension_cls": weight_sync.EXTENSION}}
        self.engine = AsyncLLM.from_engine_args(vllm_stage.engine_args(eargs, prefix_caching=True))
        params = SamplingParams(max_tokens=2, temperature=1.0, detokenize=False, logprobs=self.top_k)
        warm = self.loop.run_until_complete(vllm_stage.generate(self.engine, args["warmup_prompt"], params))
        return {"engine_start_s": round(time.monotonic() - t0, 1), "warmup_request_id": warm["request_id"]}

    def load(self, args: dict[str, Any]) -> dict[str, Any]:
        return self.loop.run_until_complete(weight_sync.load(self.engine, int(args["label"])))

    def generate(self, args: dict[str, Any]) -> dict[str, Any]:
        """Every prompt at once with verl's request ids (``vllm_stage.generate``)."""
        from vllm import SamplingParams

        params = SamplingParams(
            max_tokens=int(args["max_tokens"]), temperature=1.0, detokenize=False, logprobs=self.top_k
        )

        async def run_all() -> list[dict[str, Any]]:
            sent = (vllm_stage.generate(self.engine, p, params) for p in args["prompts"])
            return list(await asyncio.gather(*sent))

        t0 = time.monotonic()
        requests = self.loop.run_until_complete(run_all())
        return {"requests": requests, "generate_s": round(time.monotonic() - t0, 1)}

    def close(self) -> None:
        """Shut the engine down, then end what it left on the loop (its output handler), as
        ``asyncio.run`` does for ``vllm_stage``: a loop closed with tasks pending logs their errors."""
        if self.engine is not None:
            self.engine.shutdown()
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()


def _nll(model_output: Any, data: Any, dp_group: Any = None) -> tuple[Any, dict[str, Any]]:
    """The optimizer step's loss: mean negative log-likelihood of every token. What the flow needs
    is weights that move, not an RL objective (verl's ``ppo_loss`` wants advantages)."""
    log_probs = model_output["log_probs"]
    values = log_probs.values() if log_probs.is_nested else log_probs
    return -values.mean(), {}


class Trainer:
    """The training side: verl's FSDP engine, kept between log-prob passes, steps and syncs."""

    def __init__(self) -> None:
        self.engine: Any = None
        self.micro_batch = 1
        self.job_id = ""

    def start(self, args: dict[str, Any]) -> dict[str, Any]:
        t0 = time.monotonic()
        fsdp_stage.start("cpu", int(args["port"]))
        self.micro_batch, self.job_id = int(args["micro_batch"]), str(args["job_id"])
        lr = f"actor_rollout_ref.actor.optim.lr={args['lr']}"
        self.engine = fsdp_stage.build(
            args["model_dir"], int(args["requests"]), "cpu", "float32", lr, micro_batch=self.micro_batch
        )
        return {"engine_start_s": round(time.monotonic() - t0, 1)}

    def log_probs(self, args: dict[str, Any]) -> dict[str, Any]:
        return fsdp_stage.log_probs(self.engine, args["requests"], self.micro_batch)

    def _full(self, name: str) -> Any:
        """One parameter, whole (fsdp2 holds DTensors), as a plain fp32 copy."""
        param = dict(self.engine.module.named_parameters())[name]
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        return full.detach().float().clone()

    def step(self, args: dict[str, Any]) -> dict[str, Any]:
        """One optimizer step (verl's ``train_batch``) over the requests' full responses; how far
        it moved the fault's parameter (relative L2), which the fault must make visible."""
        batch = fsdp_stage.rollout_batch(args["requests"])
        td = fsdp_stage.engine_input(batch, self.micro_batch)
        before = self._full(weight_sync.FAULT_PARAM)
        with self.engine.train_mode():
            out = self.engine.train_batch(td, loss_function=_nll)
        after = self._full(weight_sync.FAULT_PARAM)
        grad_norm = out["metrics"].get("grad_norm")
        return {
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "fault_param_rel_change": float((after - before).norm() / before.norm()),
        }

    def send(self, args: dict[str, Any]) -> dict[str, Any]:
        skip = frozenset(args.get("skip") or ())
        scale = frozenset(args.get("scale") or ())
        return asyncio.run(weight_sync.send(self.engine, self.job_id, int(args["label"]), skip, scale))

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["rollout"]:
        r = Rollout()
        return serve({"start": r.start, "load": r.load, "generate": r.generate}, r.close)
    if args == ["train"]:
        t = Trainer()
        handlers = {"start": t.start, "log_probs": t.log_probs, "step": t.step, "send": t.send}
        return serve(handlers, t.close)
    print(f"usage: python -m {__spec__.name if __spec__ else __name__} rollout|train", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
