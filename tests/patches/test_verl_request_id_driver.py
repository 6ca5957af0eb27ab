"""Subprocess driver for the request-id threading tests (no tests here; run as a script).

Runs verl 0.8.0's real, patched ``LLMServerClient`` and ``FullyAsyncLLMServerClient`` on a local
Ray, through verl's real ``GlobalRequestLoadBalancer`` actor, against ``StandInVLLMServer``: a
stand-in for ``vLLMHttpServer`` (vLLM cannot run here). The stand-in records every request id it
is sent and aborts the first request after two tokens, the way ``pause_generation(abort)`` does,
so the fully-async client resumes. The clients' outputs then go through verl's own
``AgentLoopWorker._postprocess`` to a ``DataProto``. Prints one ``VC_REPORT`` JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace
from typing import Any


def main() -> None:
    import ray
    import torch
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopMetrics,
        AgentLoopWorker,
        _InternalAgentLoopOutput,
    )
    from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncLLMServerClient
    from verl.workers.rollout.llm_server import GlobalRequestLoadBalancer, LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}},
    )

    @ray.remote
    class StandInVLLMServer:
        """Stand-in for verl's ``vLLMHttpServer.generate`` (same signature and TokenOutput)."""

        def __init__(self, abort_first: bool) -> None:
            self.abort_first = abort_first
            self.seen: list[tuple[str, int]] = []

        async def generate(
            self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
        ) -> TokenOutput:
            self.seen.append((request_id, len(prompt_ids)))
            extra = {"global_steps": 3}
            if self.abort_first and len(self.seen) == 1:
                return TokenOutput(
                    token_ids=[11, 12], log_probs=[-0.1, -0.2], stop_reason="aborted", extra_fields=extra
                )
            return TokenOutput(
                token_ids=[13, 14], log_probs=[-0.3, -0.4], stop_reason="completed", extra_fields=extra
            )

        def requests(self) -> list[tuple[str, int]]:
            return self.seen

    async def drive() -> dict[str, Any]:
        report: dict[str, Any] = {}
        prompt = [1, 2, 3, 4, 5]
        for name, cls, config in (
            ("hybrid", LLMServerClient, OmegaConf.create({})),
            (
                "fully_async",
                FullyAsyncLLMServerClient,
                OmegaConf.create({"async_training": {"partial_rollout": True}}),
            ),
        ):
            server = StandInVLLMServer.remote(abort_first=(name == "fully_async"))
            balancer = GlobalRequestLoadBalancer.remote(servers={"s0": server})
            client = cls(config, load_balancer_handle=balancer)
            out = await client.generate(
                "trajectory-0", prompt_ids=list(prompt), sampling_params={"max_tokens": 4, "temperature": 1.0}
            )
            report[name] = {
                "extra_fields": out.extra_fields,
                "token_ids": out.token_ids,
                "server_saw": await server.requests.remote(),
            }
            report[name]["output"] = out
        return report

    report = asyncio.run(drive())

    # verl's own post-processing: extra_fields -> DataProto.non_tensor_batch
    inputs = []
    for name in ("hybrid", "fully_async"):
        out = report[name].pop("output")
        n_resp = len(out.token_ids)
        prompt = torch.tensor([[0, 1, 2, 3, 4, 5]])
        resp = torch.tensor([out.token_ids + [0] * (4 - n_resp)])
        attn = torch.tensor([[0] + [1] * 5 + [1] * n_resp + [0] * (4 - n_resp)])
        inputs.append(
            _InternalAgentLoopOutput(
                prompt_ids=prompt,
                response_ids=resp,
                input_ids=torch.cat([prompt, resp], dim=1),
                position_ids=torch.clamp(attn.cumsum(-1) - 1, min=0),
                response_mask=attn[:, 6:],
                attention_mask=attn,
                num_turns=2,
                metrics=AgentLoopMetrics(),
                extra_fields=out.extra_fields,
            )
        )
    data = AgentLoopWorker._postprocess(SimpleNamespace(reward_loop_worker_handles=None), inputs)
    report["non_tensor_batch"] = {
        "request_id": [str(x) for x in data.non_tensor_batch["request_id"]],
        "request_ids_all": [list(x) for x in data.non_tensor_batch["request_ids_all"]],
    }
    # and on to the engine's micro batches, as the trainer converts it
    from verl.utils import tensordict_utils as tu

    td = data.to_tensordict()
    report["tensordict"] = {
        "request_id": tu.get(td, "request_id"),
        "request_ids_all": tu.get(td, "request_ids_all"),
    }
    ray.shutdown()
    print("VC_REPORT " + json.dumps(report, default=str))


if __name__ == "__main__":
    main()
