"""Subprocess driver for the FSDP engine tests (no tests here; run as a script).

It runs inside a process whose ``sys.path`` starts with a freshly patched verl 0.8.0 (see
``bench.support.verl_support``), so every verl line executed is the pinned upstream plus our series:

1. builds the real ``FSDPEngineWithLMHead`` on CPU (fsdp2, eager attention, gloo world size 1)
   over a tiny randomly initialised Qwen2 written with ``save_pretrained`` (no download);
2. makes a rollout batch shaped like verl's agent loop output (left-padded prompts,
   right-padded responses, ``request_id``/``request_ids_all`` in ``non_tensor_batch``);
3. optionally trims it with the PROMPTS_ONLY hook, then follows ``RayPPOTrainer``: old
   log-probs (``infer_batch``, phase log_prob), GRPO advantages (verl's real
   ``compute_advantage``), one actor update (``train_batch`` with verl's real ``ppo_loss``,
   phase update_actor);
4. prints one JSON line with what the pytest side asserts on.

The only stand-in: flash_attn's padding helpers cannot import on CPU, so verl's own pure-torch
copies (``verl.utils.npu_flash_attn_utils``) are served in their place.

Environment: ``VC_TEST_WORK`` (scratch folder), ``VC_TEST_PORT``, ``VC_TEST_TRIM``
(``ours``/``recipe``/``none``), ``VC_TEST_BORROW`` (1: another component created msprobe's
debugger first), ``VC_TEST_TOKEN_LEVEL`` (1: after the old log-probs, verl's
``calculate_debug_metrics`` and our token records, as ``RayPPOTrainer.fit`` does),
``VC_TEST_NEXT_TOKEN`` (1: response token 0 and its rollout log-prob from a stand-in vLLM),
``VC_TEST_PERTURB`` (1: the training side's last ``down_proj`` output x1.5),
``VC_TEST_INIT_RANGE`` (the tiny model's initializer_range; peaked outputs need a large one),
``VC_TEST_IDS_FROM_AGENT_LOOP`` (1: request ids made as the patched agent loop makes them),
``VC_TEST_MICRO`` (the micro batch size, default 1), ``VC_TEST_RMPAD`` (0: the padded layout
instead of verl's packed THD one),
``VC_TEST_V1_TQ`` (1, verl 0.9 only: the V1 trainer's data path instead of steps 2-3, below),
``VC_TEST_VERSIONS`` (1: two weight versions instead of steps 3-4, see :func:`_run_versions`),
plus the hooks' own variables (DUMP_ON, DUMP_PHASE, ...).

With ``VC_TEST_V1_TQ=1`` the batch takes verl 0.9's V1 path through a real TransferQueue on a local
Ray: verl's own ``AgentLoopWorkerTQ._agent_loop_postprocess`` stores each agent-loop output (the
request ids in ``extra_fields``, as the rollout client leaves them), the trainer's
``upsample_batch_to_divisible_size`` adds a synthetic padding row, and the tqbridge's own
``_meta_to_realdata`` turns the trainer's ``KVBatchMeta`` into the TensorDict that
``TrainingWorker.infer_batch``/``train_mini_batch`` hand to the engine. Then old log-probs
(``infer_batch``) and one update (``tu.make_iterator`` mini batch, ``train_batch``) run on it.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from verl_consistency.entrypoints.engines import fsdp_stage

BATCH = 4
PROMPT_LEN = 6
RESPONSE_LEN = 4
PROMPT_VALID = [6, 4, 5, 3]
RESPONSE_VALID = [4, 2, 3, 1]


def _init_dist() -> None:
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", os.environ.get("VC_TEST_PORT", "29531"))
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    dist.init_process_group("gloo", rank=0, world_size=1)


def _serve_pure_torch_attention_helpers(cpu_platform: bool = True) -> None:
    fsdp_stage.serve_pure_torch_attention_helpers(cpu_platform=cpu_platform)


def _tiny_qwen2(work: Path) -> Path:
    from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2, tiny_qwen2_config

    init_range = os.environ.get("VC_TEST_INIT_RANGE")
    model_dir = work / ("tiny-qwen2" if init_range is None else f"tiny-qwen2-init{init_range}")
    if not (model_dir / "config.json").exists():
        extra = {} if init_range is None else {"initializer_range": float(init_range)}
        cfg = tiny_qwen2_config(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            **extra,
        )
        tiny_qwen2(cfg, seed=0).save_pretrained(model_dir)
    return model_dir


def _actor_config(model_dir: Path) -> Any:
    """verl's own Hydra defaults for the actor, as the worker builds them (the demo's, in bf16)."""
    # the versions run moves every weight visibly, also in bf16 (verl's default lr is 1e-6)
    lr = ["actor_rollout_ref.actor.optim.lr=0.01"] if os.environ.get("VC_TEST_VERSIONS") == "1" else []
    return fsdp_stage.actor_config(str(model_dir), 4, *lr)


def _rollout_batch() -> Any:
    import numpy as np
    import torch
    from verl import DataProto

    gen = torch.Generator().manual_seed(1)
    prompts = torch.zeros(BATCH, PROMPT_LEN, dtype=torch.long)
    responses = torch.zeros(BATCH, RESPONSE_LEN, dtype=torch.long)
    attn = torch.zeros(BATCH, PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
    for i in range(BATCH):
        p, r = PROMPT_VALID[i], RESPONSE_VALID[i]
        prompts[i, PROMPT_LEN - p :] = torch.randint(1, 128, (p,), generator=gen)
        responses[i, :r] = torch.randint(1, 128, (r,), generator=gen)
        attn[i, PROMPT_LEN - p : PROMPT_LEN + r] = 1
    input_ids = torch.cat([prompts, responses], dim=1)
    position_ids = torch.clamp(torch.cumsum(attn, dim=1) - 1, min=0)
    response_mask = attn[:, PROMPT_LEN:].clone()
    rm_scores = torch.zeros(BATCH, RESPONSE_LEN)
    for i in range(BATCH):
        rm_scores[i, RESPONSE_VALID[i] - 1] = float(i % 2)
    rng = random.Random(int(os.environ.get("VC_TEST_SEED", "7")))
    ids = [uuid.UUID(int=rng.getrandbits(128)).hex for _ in range(BATCH + 1)]
    if os.environ.get("VC_TEST_IDS_FROM_AGENT_LOOP") == "1":
        ids[:BATCH] = _agent_loop_ids(list(range(BATCH)))
    first = ids[:BATCH]
    every = np.empty(BATCH, dtype=object)  # sample 0 was resumed once: two vLLM ids
    every[:] = [[f, ids[BATCH]] if i == 0 else [f] for i, f in enumerate(first)]
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": input_ids,
            "attention_mask": attn,
            "position_ids": position_ids,
            "rm_scores": rm_scores,
            "rollout_log_probs": -torch.rand(BATCH, RESPONSE_LEN, generator=gen),
        },
        non_tensors={
            "request_id": np.array(first, dtype=object),
            "request_ids_all": every,
            "uid": np.array(["a", "a", "b", "b"], dtype=object),
            "index": np.array(list(range(BATCH)), dtype=object),
        },
    )


def _stand_in_vllm_next_token(batch: Any, model_dir: Path) -> None:
    """vLLM's side of the output row, from a STAND-IN (vLLM cannot run here): the same weights in
    plain transformers, fp32, eager. Each sample's response token 0 becomes the stand-in's argmax
    after the prompt, and ``rollout_log_probs[:, 0]`` its log-prob, as vLLM would report them.
    """
    import torch
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").float().eval()
    td = batch.batch
    for i in range(BATCH):
        prompt = td["prompts"][i, PROMPT_LEN - PROMPT_VALID[i] :]
        with torch.no_grad():
            logp = torch.log_softmax(ref(prompt[None]).logits[0, -1].float(), dim=-1)
        tok = int(torch.argmax(logp))
        td["responses"][i, 0] = tok
        td["input_ids"][i, PROMPT_LEN] = tok
        td["rollout_log_probs"][i, 0] = logp[tok]


def _agent_loop_ids(indices: list[int]) -> list[str]:
    """The ids verl's patched agent loop would send to vLLM: one asyncio task per sample, each
    calling ``request_ids.enter_prompt(kwargs)`` then ``request_ids.new_request_id()`` (patch 0006)."""
    import asyncio

    from verl_consistency.patches.hooks.rollout import request_ids

    async def one(index: int) -> str:
        request_ids.enter_prompt({"index": index, "uid": "u"})
        await asyncio.sleep(0)  # interleave the samples, as verl's concurrent tasks do
        return request_ids.new_request_id()

    async def all_of() -> list[str]:
        return list(await asyncio.gather(*(one(i) for i in indices)))

    return asyncio.run(all_of())


V1_SAMPLES = 3
"""Real samples of the V1 run; the trainer pads the batch to 4 (a multiple of the micro batches)."""


def _v1_transfer_queue_batch(ids: list[str]) -> Any:
    """The TensorDict the V1 worker hands the engine, made by verl 0.9's own V1 data path."""
    import asyncio

    import ray
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.experimental.agent_loop import AgentLoopOutput, AgentLoopWorker
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.utils.transferqueue_utils import _meta_to_realdata

    # TransferQueue's controller and its two storage units ask for one CPU each
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init()
    worker_cls = AgentLoopWorkerTQ.__ray_metadata__.modified_class

    class _Worker:
        """The worker state postprocess touches; reward and teacher models are not configured."""

        processor = None
        _compute_multi_modal_inputs = AgentLoopWorker._compute_multi_modal_inputs
        _compute_position_ids = AgentLoopWorker._compute_position_ids

        async def _compute_score(self, outputs: Any, kwargs: Any) -> None:
            return None

        async def _compute_teacher_logprobs(self, *args: Any, **kwargs: Any) -> None:
            return None

    gen = random.Random(3)

    async def store() -> None:
        for i in range(V1_SAMPLES):
            every = [ids[i], ids[-1]] if i == 0 else [ids[i]]  # sample 0 was resumed once
            out = AgentLoopOutput(
                prompt_ids=[gen.randrange(1, 128) for _ in range(PROMPT_VALID[i])],
                response_ids=[gen.randrange(1, 128) for _ in range(RESPONSE_VALID[i])],
                response_mask=[1] * RESPONSE_VALID[i],
                num_turns=2,
                metrics={},
                extra_fields={"request_id": ids[i], "request_ids_all": every},
            )
            await worker_cls._agent_loop_postprocess(
                _Worker(), out, False, uid=f"u{i}", session_id=0, index=i, global_steps=1
            )

    asyncio.run(store())
    tags = [{"seq_len": PROMPT_VALID[i] + RESPONSE_VALID[i]} for i in range(V1_SAMPLES)]
    meta = KVBatchMeta(partition_id="train", keys=[f"u{i}_0_0" for i in range(V1_SAMPLES)], tags=tags)
    meta = upsample_batch_to_divisible_size(meta, BATCH, eos_token_id=2)
    # PPOTrainer._compute_old_log_prob's extra_info
    meta.extra_info.update({"calculate_entropy": True, "compute_loss": False, "temperature": 1.0})
    return _meta_to_realdata(meta)


def _v1_loss(model_output: Any, data: Any, dp_group: Any = None) -> Any:
    """A finite loss over the log-probs (the V1 run checks the dumps, not PPO's arithmetic)."""
    lp = model_output["log_probs"]
    return -(lp.values() if lp.is_nested else lp).float().mean(), {}


def _run_v1(engine: Any, report: dict[str, Any]) -> None:
    import torch
    from verl.utils import tensordict_utils as tu

    rng = random.Random(int(os.environ.get("VC_TEST_SEED", "7")))
    ids = [uuid.UUID(int=rng.getrandbits(128)).hex for _ in range(V1_SAMPLES + 1)]
    report["request_ids"] = ids[:V1_SAMPLES]
    report["resumed_id"] = ids[-1]
    td = _v1_transfer_queue_batch(ids)
    report["uids"] = [str(u) for u in tu.get(td, "uid")]
    report["has_request_id_column"] = "request_id" in list(td.keys())
    _engine_keys(td)
    with engine.eval_mode():
        engine.infer_batch(td)
    (mini,) = list(
        tu.make_iterator(td, mini_batch_size=BATCH, epochs=1, seed=1, dataloader_kwargs={"shuffle": False})
    )
    _engine_keys(mini, calculate_entropy=True, global_batch_size=BATCH)
    with engine.train_mode():
        out = engine.train_batch(mini, loss_function=_v1_loss)
    report["finite"] = bool(torch.isfinite(torch.tensor(float(out["metrics"]["grad_norm"]))))
    report["error"] = None


def _log_probs(engine: Any, batch: Any) -> Any:
    """verl's old log-probs of ``batch``, as ``RayPPOTrainer._compute_old_log_prob`` computes them."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    td = left_right_2_no_padding(batch.to_tensordict())
    _engine_keys(td, calculate_entropy=True, compute_loss=False)
    with engine.eval_mode():
        out = engine.infer_batch(td)
    return no_padding_2_padding(tu.get(out["model_output"], "log_probs"), td).float()


def _run_versions(engine: Any, actor_cfg: Any, report: dict[str, Any]) -> None:
    """Two weight versions, as an async trainer meets them (issue 41: the forward at the rollout's weights).

    Sync 0; old log-probs of the batch, every request rolled out at version 0 (``min_global_steps``,
    verl's own label); one actor update (verl's GRPO advantages and ``ppo_loss``); sync 1; old
    log-probs of the same batch again, requests 0-1 now stale (rolled out at 0), 2-3 at 1. The
    report holds verl's log-probs of the second pass as exact hex floats, so that a run with the dump
    and one without can be compared bit for bit, and the update's grad norm.
    """
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    from verl_consistency.patches.hooks.training import weight_sync

    batch = _rollout_batch()
    report["request_ids"] = list(batch.non_tensor_batch["request_id"])
    weight_sync.weights_sent(0)
    batch.non_tensor_batch["min_global_steps"] = np.array([0, 0, 0, 0], dtype=object)
    batch.batch["old_log_probs"] = _log_probs(engine, batch)
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    batch = compute_advantage(batch, adv_estimator=AdvantageEstimator.GRPO, num_repeat=2)
    td = left_right_2_no_padding(batch.to_tensordict())
    _engine_keys(td, calculate_entropy=True, global_batch_size=BATCH)
    with engine.train_mode():
        out = engine.train_batch(td, loss_function=partial(ppo_loss, actor_cfg))
    report["grad_norm"] = float(out["metrics"]["grad_norm"])
    weight_sync.weights_sent(1)
    batch.non_tensor_batch["min_global_steps"] = np.array([0, 0, 1, 1], dtype=object)
    second = _log_probs(engine, batch)
    report["second_log_probs"] = [float(x).hex() for x in second.flatten().tolist()]
    # a second update at version 1: with DUMP_PHASE=all its stale requests are dumped after verl's
    # backward, before its optimizer step, which must see the same gradients
    batch.batch["old_log_probs"] = second
    td = left_right_2_no_padding(batch.to_tensordict())
    _engine_keys(td, calculate_entropy=True, global_batch_size=BATCH)
    with engine.train_mode():
        out = engine.train_batch(td, loss_function=partial(ppo_loss, actor_cfg))
    report["second_grad_norm"] = float(out["metrics"]["grad_norm"]).hex()
    report["after_log_probs"] = [float(x).hex() for x in _log_probs(engine, batch).flatten().tolist()]
    report["finite"] = bool(torch.isfinite(second).all()) and bool(
        torch.isfinite(torch.tensor(report["grad_norm"]))
    )
    report["error"] = None


def _recipe_trim(data: Any) -> Any:
    """The public recipe's get_prompts_only_batch, verbatim in effect: zero response tokens."""
    r = data.batch["responses"].size(1)
    for key in ("input_ids", "attention_mask"):
        data.batch[key] = data.batch[key][:, :-r]
    data.batch["position_ids"] = data.batch["position_ids"][:, :-r]
    for key in ("responses", "rollout_log_probs", "response_mask", "rm_scores"):
        data.batch[key] = data.batch[key][:, :0]
    return data


def _owner_model() -> Any:
    """The other owner's model. msprobe skips the first and last layer once verl is imported."""
    import torch

    return torch.nn.Sequential(*(torch.nn.Linear(3, 3) for _ in range(4)))


def _engine_keys(td: Any, **extra: Any) -> None:
    from verl.utils import tensordict_utils as tu

    tu.assign_non_tensor(
        td,
        use_remove_padding=os.environ.get("VC_TEST_RMPAD", "1") == "1",
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=int(os.environ.get("VC_TEST_MICRO", "1")),
        max_token_len_per_gpu=4096,
        use_fused_kernels=False,
        temperature=1.0,
        **extra,
    )


def main() -> None:
    import torch

    work = Path(os.environ["VC_TEST_WORK"])
    work.mkdir(parents=True, exist_ok=True)
    _init_dist()
    _serve_pure_torch_attention_helpers()
    model_dir = _tiny_qwen2(work)

    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from verl_consistency.patches.hooks.training import prompts_only

    borrowed_dir = None
    if os.environ.get("VC_TEST_BORROW") == "1":
        # Another component of the process (a stand-in for vLLM's own dump) created msprobe's
        # singleton first, with its own config and folder, and has dumped one step already.
        from msprobe.pytorch import PrecisionDebugger

        borrowed_dir = work / "other-owner"
        other = PrecisionDebugger(config_path=os.environ["VC_TEST_OTHER_CONFIG"], dump_path=str(borrowed_dir))
        probe = _owner_model()
        other.start(model=probe)
        probe(torch.ones(1, 3))
        other.stop()
        other.step()

    actor_cfg = _actor_config(model_dir)
    engine = fsdp_stage.fsdp_engine(str(model_dir), actor_cfg)

    if os.environ.get("VC_TEST_V1_TQ") == "1":
        v1_report: dict[str, Any] = {}
        _run_v1(engine, v1_report)
        print("VC_REPORT " + json.dumps(v1_report))
        return

    if os.environ.get("VC_TEST_VERSIONS") == "1":
        versions_report: dict[str, Any] = {}
        _run_versions(engine, actor_cfg, versions_report)
        print("VC_REPORT " + json.dumps(versions_report))
        return

    batch = _rollout_batch()
    if os.environ.get("VC_TEST_NEXT_TOKEN") == "1":
        _stand_in_vllm_next_token(batch, model_dir)
    if os.environ.get("VC_TEST_PERTURB") == "1":
        # training side only: the last layer's MLP output x1.5, i.e. only the scale of what the
        # final RMSNorm's input receives from it (the planted change, on the other side)
        target = engine.module.model.layers[-1].mlp.down_proj
        target.register_forward_hook(lambda _m, _i, out: out * 1.5)
    request_ids = list(batch.non_tensor_batch["request_id"])
    trim = os.environ.get("VC_TEST_TRIM", "ours")
    if trim == "ours":
        batch = prompts_only.trim(batch)
    elif trim == "recipe":
        batch = _recipe_trim(batch)

    report: dict[str, Any] = {"request_ids": request_ids, "trim": trim}
    try:
        # old log-probs, as RayPPOTrainer._compute_old_log_prob does
        td = left_right_2_no_padding(batch.to_tensordict())
        _engine_keys(td, calculate_entropy=True, compute_loss=False)
        with engine.eval_mode():
            out = engine.infer_batch(td)
        log_probs = no_padding_2_padding(tu.get(out["model_output"], "log_probs"), td)
        batch.batch["old_log_probs"] = log_probs.float()
        report["old_log_probs_finite"] = bool(torch.isfinite(log_probs).all())
        if os.environ.get("VC_TEST_TOKEN_LEVEL") == "1":
            # as RayPPOTrainer.fit does next: verl's own debug metrics, then our token records.
            # vLLM's log-probs are a STAND-IN here (no vLLM): the engine's own, one token drifted.
            from verl.utils.debug.metrics import calculate_debug_metrics

            from verl_consistency.patches.hooks.training import token_mismatch

            rollout = batch.batch["old_log_probs"].clone()
            rollout[2, 1] += 0.5
            batch.batch["rollout_log_probs"] = rollout
            verl_metrics = calculate_debug_metrics(batch)
            token_mismatch.record(batch, global_step=1, verl_metrics=verl_metrics)
            report["verl_metrics"] = verl_metrics

        # advantages: verl's real GRPO estimator over the (possibly zeroed) rewards
        batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
        batch = compute_advantage(batch, adv_estimator=AdvantageEstimator.GRPO, num_repeat=2)
        report["advantages_abs_max"] = (
            float(batch.batch["advantages"].abs().max()) if batch.batch["advantages"].numel() else None
        )

        # actor update, as RayPPOTrainer._update_actor -> TrainingWorker.train_batch does
        td = left_right_2_no_padding(batch.to_tensordict())
        _engine_keys(td, calculate_entropy=True, global_batch_size=BATCH)
        with engine.train_mode():
            out = engine.train_batch(td, loss_function=partial(ppo_loss, actor_cfg))
        losses = [float(x) for x in torch.as_tensor(out["loss"]).flatten().tolist()] if "loss" in out else []
        pg = out["metrics"].get("actor/pg_loss")
        report["loss"] = losses
        report["pg_loss"] = str(pg)
        report["grad_norm"] = float(out["metrics"]["grad_norm"])
        report["finite"] = all(torch.isfinite(torch.tensor(losses)).tolist()) and bool(
            torch.isfinite(torch.tensor(report["grad_norm"]))
        )
        report["error"] = None
    except Exception as exc:  # the recipe trim is expected to end here
        report["error"] = f"{type(exc).__name__}: {exc}"

    if borrowed_dir is not None:
        from msprobe.pytorch import PrecisionDebugger

        other = PrecisionDebugger()
        probe = _owner_model()
        other.start(model=probe)
        probe(torch.ones(1, 3))
        other.stop()
        other.step()
        report["other_config_dump_path"] = other.service.config.dump_path

    print("VC_REPORT " + json.dumps(report))


if __name__ == "__main__":
    main()
