"""Subprocess driver for the request-id threading tests (no tests here; run as a script).

Runs the pinned verl's real, patched ``LLMServerClient`` and ``FullyAsyncLLMServerClient`` on a
local Ray, through verl's real ``GlobalRequestLoadBalancer`` actor, against ``StandInVLLMServer``:
a stand-in for ``vLLMHttpServer`` (vLLM cannot run here). The stand-in records every request id
it is sent and aborts the first request after two tokens, the way ``pause_generation(abort)``
does, so the fully-async client resumes. Prints one ``VC_REPORT`` JSON line.

What happens to the outputs then depends on the release, as it does in verl:

* verl 0.8.0: verl's own ``AgentLoopWorker._postprocess`` to a ``DataProto``, then the engine's
  TensorDict (``to_tensordict``).
* verl 0.9 (V1 trainer): verl's own ``AgentLoopWorkerTQ._agent_loop_postprocess`` into a real
  TransferQueue on the same Ray, verl's ``upsample_batch_to_divisible_size`` (synthetic padding
  samples), the worker's view of the batch (``transferqueue_utils._meta_to_realdata``, what
  ``tqbridge`` hands ``compute_log_prob``) and the engines' ``prepare_micro_batches``. Then
  PROMPTS_ONLY (the patched postprocess trims), verl's real ``PPOTrainer._compute_old_log_prob``
  with a stand-in actor worker group (token records and the V1 refusals), and capture by prompt
  through the real client (``VC_DRIVER_PARTS`` picks the parts; default all).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

PROMPT = [1, 2, 3, 4, 5]


def _clients(v1: bool) -> tuple[Any, Any]:
    if v1:
        from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
    else:
        from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncLLMServerClient
        from verl.workers.rollout.llm_server import LLMServerClient
    return LLMServerClient, FullyAsyncLLMServerClient


def _stand_in() -> Any:
    import ray
    from verl.workers.rollout.replica import TokenOutput

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
            # a weight sync aborts the first request (version 3); its resume runs version 4
            extra = {"global_steps": 3 if len(self.seen) == 1 or not self.abort_first else 4}
            if self.abort_first and len(self.seen) == 1:
                return TokenOutput(
                    token_ids=[11, 12], log_probs=[-0.1, -0.2], stop_reason="aborted", extra_fields=extra
                )
            return TokenOutput(
                token_ids=[13, 14], log_probs=[-0.3, -0.4], stop_reason="completed", extra_fields=extra
            )

        def requests(self) -> list[tuple[str, int]]:
            return self.seen

    return StandInVLLMServer


def _config(v1: bool, *, fully_async: bool, full_determinism: bool = False) -> Any:
    from omegaconf import OmegaConf

    if not v1:
        return OmegaConf.create({"async_training": {"partial_rollout": True}} if fully_async else {})
    # verl 0.9's client reads the rollout section; the V1 trainer has no async_training (resumes on)
    return OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"name": "vllm", "full_determinism": full_determinism}}}
    )


async def _generate(v1: bool, server_cls: Any, name: str, **cfg: Any) -> dict[str, Any]:
    from verl.workers.rollout.llm_server import GlobalRequestLoadBalancer

    hybrid_cls, fa_cls = _clients(v1)
    fully_async = name == "fully_async"
    server = server_cls.remote(abort_first=fully_async)
    import ray

    # verl 0.8.0 declares the balancer a Ray actor; 0.9's router wraps the plain class itself
    lb_cls = (
        GlobalRequestLoadBalancer
        if hasattr(GlobalRequestLoadBalancer, "remote")
        else ray.remote(GlobalRequestLoadBalancer)
    )
    balancer = lb_cls.remote(servers={"s0": server})
    client = (fa_cls if fully_async else hybrid_cls)(
        _config(v1, fully_async=fully_async, **cfg), load_balancer_handle=balancer
    )
    out = await client.generate(
        "trajectory-0", prompt_ids=list(PROMPT), sampling_params={"max_tokens": 4, "temperature": 1.0}
    )
    return {
        "extra_fields": out.extra_fields,
        "token_ids": out.token_ids,
        "server_saw": await server.requests.remote(),
        "output": out,
    }


def _v0_batch(report: dict[str, Any]) -> None:
    """verl 0.8.0: extra_fields -> DataProto.non_tensor_batch -> the engine's TensorDict."""
    import torch
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopMetrics,
        AgentLoopWorker,
        _InternalAgentLoopOutput,
    )
    from verl.utils import tensordict_utils as tu

    inputs = []
    for name in ("hybrid", "fully_async"):
        out = report[name].pop("output")
        n_resp = len(out.token_ids)
        prompt = torch.tensor([[0, *PROMPT]])
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
    td = data.to_tensordict()
    report["tensordict"] = {
        "request_id": tu.get(td, "request_id"),
        "request_ids_all": tu.get(td, "request_ids_all"),
    }


# ------------------------------------------------------------------------------------------
# verl 0.9: the V1 trainer's data path (TransferQueue)
# ------------------------------------------------------------------------------------------


def _worker(config: Any) -> Any:
    """A bare ``AgentLoopWorkerTQ`` (the Ray actor's class) with what the postprocess reads."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    w = object.__new__(AgentLoopWorkerTQ.__ray_actor_class__)
    w.config = config
    w.processor = None
    w.tokenizer = None
    w.reward_loop_worker_handles = None
    w.distillation_enabled = False
    return w


async def _put(worker: Any, out: Any, *, uid: str, index: int, validate: bool = False) -> str:
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    n = len(out.token_ids)
    output = AgentLoopOutput(
        prompt_ids=list(PROMPT),
        response_ids=list(out.token_ids),
        response_mask=[1] * n,
        response_logprobs=list(out.log_probs),
        reward_score=1.0,
        num_turns=2,
        metrics=AgentLoopMetrics(),
        extra_fields=dict(out.extra_fields),
    )
    await worker._agent_loop_postprocess(
        output, validate, uid=uid, session_id=0, index=index, global_steps=3, raw_prompt=[{"c": "x"}]
    )
    return f"{uid}_0_0"


def _plain(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return [None if isinstance(x, float) and math.isnan(x) else x for x in value.tolist()]
    return value


class _StandInActorWG:
    """Stand-in for the actor worker group's ``compute_log_prob`` on a KVBatchMeta.

    Writes what the real worker writes back to TransferQueue (``log_probs``/``entropy`` over the
    whole sequence, nested): log p of each response token = vLLM's value + ``DELTA``, or
    ``NO_ROLLOUT`` where vLLM has none (the PROMPTS_ONLY trim's NaN).
    """

    DELTA = 0.25
    NO_ROLLOUT = -1.5

    def compute_log_prob(self, batch: Any) -> Any:
        import torch
        import transfer_queue as tq
        from tensordict import TensorDict

        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids", "rollout_log_probs"]
        )
        lps, ents = [], []
        for ids, roll in zip(data["input_ids"].unbind(), data["rollout_log_probs"].unbind(), strict=True):
            lp = torch.zeros(ids.shape[0])
            r = roll.shape[0]
            lp[ids.shape[0] - r - 1 : ids.shape[0] - 1] = torch.where(
                torch.isnan(roll), torch.full_like(roll, self.NO_ROLLOUT), roll + self.DELTA
            )
            lps.append(lp)
            ents.append(torch.ones(ids.shape[0]))
        nested = {
            "log_probs": torch.nested.as_nested_tensor(lps, layout=torch.jagged),
            "entropy": torch.nested.as_nested_tensor(ents, layout=torch.jagged),
        }
        tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(nested, batch_size=len(lps))
        )
        return batch


def _trainer(rollout_correction: Any, reward: Any = None) -> Any:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "reward": reward,
            "algorithm": {"rollout_correction": rollout_correction},
            "actor_rollout_ref": {
                "rollout": {"temperature": 1.0, "calculate_log_probs": True},
                "actor": {"loss_agg_mode": "token-mean", "loss_scale_factor": None},
            },
        }
    )
    return SimpleNamespace(config=cfg, actor_rollout_wg=_StandInActorWG(), global_steps=7)


def _v1_batch(report: dict[str, Any], parts: set[str], run_dir: Path) -> None:
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils import tensordict_utils as tu
    from verl.utils.transferqueue_utils import _meta_to_realdata
    from verl.workers.engine.utils import prepare_micro_batches

    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    worker = _worker(_config(True, fully_async=False))
    outs = {name: report[name].pop("output") for name in ("hybrid", "fully_async")}
    v1: dict[str, Any] = {}
    report["v1"] = v1

    async def put_all(partition_prefix: str, validate: bool = False) -> list[str]:
        return [
            await _put(worker, outs["hybrid"], uid=f"{partition_prefix}u0", index=0, validate=validate),
            await _put(worker, outs["fully_async"], uid=f"{partition_prefix}u1", index=1, validate=validate),
        ]

    os.environ.pop("PROMPTS_ONLY", None)
    keys = asyncio.run(put_all(""))
    listing = tq.kv_list("train")["train"]
    tags = [listing[k] for k in keys]
    meta = KVBatchMeta(partition_id="train", keys=keys, tags=tags)
    meta = upsample_batch_to_divisible_size(meta, 4, 0)
    td = _meta_to_realdata(meta)  # what tqbridge hands the worker's compute_log_prob / update_actor
    v1["keys"] = list(meta.keys)
    v1["is_padding"] = [bool((t or {}).get("is_padding", False)) for t in meta.tags]
    v1["worker_fields"] = {
        "request_id": tu.get(td, "request_id"),
        "request_ids_all": [list(x) for x in tu.get(td, "request_ids_all")],
        "extra_fields_request_id": [(x or {}).get("request_id") for x in tu.get(td, "extra_fields")],
    }
    tu.assign_non_tensor(td, use_dynamic_bsz=False, micro_batch_size_per_gpu=1)
    micro_batches, _ = prepare_micro_batches(td)
    v1["micro_batches"] = [tu.get(mb, "request_id") for mb in micro_batches]

    if "tokens" in parts:
        os.environ.update(VERL_CONSISTENCY_TOKEN_LEVEL="1", VERL_CONSISTENCY_RUN_DIR=str(run_dir))
        metrics: dict[str, Any] = {}
        PPOTrainer._compute_old_log_prob(_trainer(None), meta, metrics)
        v1["verl_metrics"] = {k: v for k, v in metrics.items() if k.startswith("training/")}
        log = run_dir / "token_mismatch.jsonl"
        v1["token_records"] = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        steps = run_dir / "token_mismatch_steps.jsonl"
        v1["step_records"] = [json.loads(x) for x in steps.read_text().splitlines()] if steps.exists() else []
        v1["delta"] = _StandInActorWG.DELTA

    if "prompts_only" in parts:
        os.environ.update(
            PROMPTS_ONLY="1", VERL_CONSISTENCY_TOKEN_LEVEL="1", VERL_CONSISTENCY_RUN_DIR=str(run_dir)
        )
        po_keys = asyncio.run(put_all("po"))
        val_keys = asyncio.run(put_all("val", validate=True))
        listing = tq.kv_list("train")["train"]
        got = tq.kv_batch_get(keys=po_keys, partition_id="train")
        v1["prompts_only"] = {
            k: [_plain(x) for x in (got[k].unbind() if hasattr(got[k], "unbind") else got[k])]
            for k in (
                "prompts",
                "responses",
                "input_ids",
                "position_ids",
                "response_mask",
                "loss_mask",
                "rm_scores",
                "rollout_log_probs",
                "vc_next_token",
                "vc_next_token_rollout_log_prob",
                "request_id",
            )
        }
        v1["prompts_only"]["tags"] = [listing[k] for k in po_keys]
        val = tq.kv_batch_get(keys=val_keys, partition_id="val")
        v1["prompts_only"]["validation_input_ids"] = [_plain(x) for x in val["input_ids"].unbind()]
        # the trimmed batch through verl's real old-log-prob pass: finite, and no token records
        before = (
            len((run_dir / "token_mismatch.jsonl").read_text().splitlines())
            if (run_dir / "token_mismatch.jsonl").exists()
            else 0
        )
        metrics = {}
        po_meta = KVBatchMeta(partition_id="train", keys=po_keys, tags=[listing[k] for k in po_keys])
        PPOTrainer._compute_old_log_prob(_trainer(None), po_meta, metrics)
        v1["prompts_only"]["verl_metrics"] = {k: v for k, v in metrics.items() if k.startswith("training/")}
        v1["prompts_only"]["no_rollout"] = _StandInActorWG.NO_ROLLOUT
        old = tq.kv_batch_get(keys=po_keys, partition_id="train", select_fields=["old_log_probs"])
        v1["prompts_only"]["old_log_probs"] = [_plain(x) for x in old["old_log_probs"].unbind()]
        after = (
            len((run_dir / "token_mismatch.jsonl").read_text().splitlines())
            if (run_dir / "token_mismatch.jsonl").exists()
            else 0
        )
        v1["prompts_only"]["token_records_written"] = after - before
        refusals = {}
        for name, corr, reward in (
            ("bypass", {"bypass_mode": True}, None),
            ("rollout_is", {"bypass_mode": False, "rollout_is": "token", "rollout_rs": None}, None),
            (
                "colocated_reward_model",
                None,
                {"reward_model": {"enable": True, "enable_resource_pool": False}},
            ),
            ("reward_model_own_pool", None, {"reward_model": {"enable": True, "enable_resource_pool": True}}),
        ):
            try:
                PPOTrainer._compute_old_log_prob(_trainer(corr, reward), po_meta, {})
                refusals[name] = None
            except Exception as exc:
                refusals[name] = f"{type(exc).__name__}: {exc}"
        v1["prompts_only"]["refusals"] = refusals
        os.environ.pop("PROMPTS_ONLY", None)


def _capture(report: dict[str, Any], v1: bool, server_cls: Any) -> None:
    """Capture by prompt through the real client: a listed prompt's vLLM id starts with vccap."""
    from verl_consistency.patches.hooks.rollout import request_ids

    listed = Path(tempfile.mkdtemp()) / "prompts.txt"
    listed.write_text("index:7\n")
    os.environ["VERL_CONSISTENCY_CAPTURE"] = f"prompts:{listed}"

    async def one(index: int, **cfg: Any) -> str:
        request_ids.enter_prompt({"index": index, "uid": f"u{index}"})
        res = await _generate(v1, server_cls, "hybrid", **cfg)
        return res["server_saw"][0][0]

    async def main() -> dict[str, Any]:
        got: dict[str, Any] = {
            "listed": await asyncio.create_task(one(7)),
            "unlisted": await asyncio.create_task(one(8)),
        }
        if v1:
            got["deterministic_listed"] = await asyncio.create_task(one(7, full_determinism=True))
            got["deterministic_unlisted"] = await asyncio.create_task(one(8, full_determinism=True))
        return got

    report["capture"] = asyncio.run(main())
    os.environ.pop("VERL_CONSISTENCY_CAPTURE", None)


def main() -> None:
    import ray
    import verl

    v1 = tuple(int(x) for x in verl.__version__.split(".")[:2]) >= (0, 9)
    parts = set(os.environ.get("VC_DRIVER_PARTS", "ids,tokens,prompts_only,capture").split(","))
    ray.init(
        # TransferQueue's controller and storage unit are actors of their own (verl 0.9)
        num_cpus=8 if v1 else 2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}},
    )
    server_cls = _stand_in()

    async def drive() -> dict[str, Any]:
        return {name: await _generate(v1, server_cls, name) for name in ("hybrid", "fully_async")}

    report: dict[str, Any] = asyncio.run(drive())
    report["verl"] = verl.__version__
    if v1 and parts & {"ids", "tokens", "prompts_only"}:
        _v1_batch(report, parts, Path(tempfile.mkdtemp()))
    elif not v1:
        _v0_batch(report)
    if "capture" in parts:
        _capture(report, v1, server_cls)
    for name in ("hybrid", "fully_async"):
        report[name].pop("output", None)
    ray.shutdown()
    print("VC_REPORT " + json.dumps(report, default=str))


if __name__ == "__main__":
    main()
