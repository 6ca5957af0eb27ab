"""Driver for verl's Megatron engine (0.8.0 or 0.9.1) on an NVIDIA GPU or the CPU (no tests; a script).

On a GPU (``VC_TEST_DEVICE=cuda``) ``bench/megatron_h200.sh`` runs it on the H200 device machine; CI
reads the dumps it wrote there. With ``VC_TEST_DEVICE=cpu`` (gloo, world size 1, TP 1) the same
engine, schedule, optimizer and dumps run on the CPU behind four thin stand-ins for megatron-core's
CUDA-only calls (:func:`_cpu_stand_ins`, below); on the next set (verl 0.9.1, torch 2.13 cpu) a tiny
run takes ~12 s and ~0.75 GB, and its log_prob dump statistics match the H200 fixture
(``tests/postprocess/fixtures/megatron-h200-next``) to bf16 rounding. megatron-core and mbridge are
not in the project's venvs: install them apart and put them on ``PYTHONPATH``::

    pip install --no-deps --target /tmp/mcore-target megatron-core==0.16.1 mbridge==0.15.1
    VERL_CONSISTENCY_PIN_SET=next PYTHONPATH=.:<patched verl root>:/tmp/mcore-target \
      CUDA_VISIBLE_DEVICES= VC_TEST_DEVICE=cpu VC_TEST_WORK=/tmp/mcore-work \
      .venv-next/bin/python tests/patches/megatron_driver.py

(``<patched verl root>``: ``bench.support.verl_support.patched_verl``; ``run_patched`` sets up the
rest when given that ``PYTHONPATH``). mbridge's other needs (transformers, safetensors, einops) and
megatron-core's (torch, numpy, packaging) are already in ``.venv-next``.

It runs inside a process whose ``sys.path`` starts with a freshly patched verl of the pin set in
force (``bench.support.verl_support.patched_verl``: 0.8.0 with ``patches/current/verl/series``, 0.9.1 with
``patches/next/verl/series``), so every verl line executed is the pinned upstream plus our series,
with real megatron-core 0.16.1 and mbridge 0.15.1 underneath (verl 0.9.1's Megatron engine imports
nothing newer from megatron-core; checked with an import on CPU):

1. builds verl's real ``MegatronEngineWithLMHead`` (``actor.strategy=megatron``, verl's own Hydra
   defaults, ``use_mbridge`` + ``vanilla_mbridge``: 0.8.0's default; 0.9.1 defaults to NVIDIA's
   Megatron-Bridge, which needs Transformer Engine, and keeps mbridge as its deprecated
   ``vanilla_mbridge=True`` flavour) over the tiny random
   Qwen2 of the FSDP driver (or Qwen2-0.5B's shape for the benchmark), world size ``WORLD_SIZE``
   (TP = ``VC_TEST_TP``, default the world size), NCCL (gloo with ``VC_TEST_DEVICE=cpu``); with
   ``VC_TEST_EXPORT=PATH`` it saves the weights as the engine exports them for vLLM;
2. makes the same rollout batch as the FSDP driver (``request_id``/``request_ids_all``), trims it
   with the PROMPTS_ONLY hook (on verl >= 0.9 the ids then move into each row's ``extra_fields``
   dict, where verl 0.9.1's V1 TransferQueue path leaves them: :func:`_ids_as_v1_extra_fields`),
   then follows ``RayPPOTrainer``: old log-probs (``infer_batch``,
   phase log_prob), GRPO advantages, one actor update (``train_batch`` with verl's ``ppo_loss``,
   phase update_actor);
3. prints one JSON line (rank 0) with what the pytest side asserts on; with ``VC_TEST_BENCH=N`` it
   also times N ``infer_batch`` calls and N ``train_batch`` calls (the dump is whatever DUMP_ON says).

Substitutions, each forced by a missing dependency and named here:

* **Transformer Engine is absent** (no wheel for CPU; none on the GPU machine either). mbridge
  0.15.1 hard-codes ``get_gpt_decoder_block_spec(config, use_transformer_engine=True)``
  (``mbridge/core/llm_bridge.py`` ``_get_transformer_layer_spec``); the stand-in
  ``bench/gpu/no_te/megatron_local_spec.py`` (shared with ``verl_gpu.sh ride`` with
  ``ENGINE=megatron``, which runs verl's whole ``main_ppo``) swaps that one method for the same call
  with ``use_transformer_engine=False``: megatron-core's own *local* layer specs
  (``ColumnParallelLinear``/``RowParallelLinear``/``DotProductAttention``/WrappedTorchNorm).
* megatron-core's local ``DotProductAttention`` refuses packed sequences, so the engine runs with
  ``use_remove_padding=False`` (verl's ``bshd`` data format, a documented engine option); its
  attention mask is converted to the local module's convention (the stand-in's ``megatron_mask``).
* flash_attn is absent (its padding helpers are all verl's batch packing uses from it): verl's
  own pure-torch copies are served in their place, as in the FSDP driver (on a GPU without the
  FSDP driver's CPU platform for verl 0.9, whose device calls must reach CUDA).
* the local spec keeps the RMSNorms as modules (TE fuses them into the next linear), so mbridge's
  Qwen2 name map gets their two local names (``input_layernorm``, ``pre_mlp_layernorm``; the stand-in).
* megatron-core's torch RMSNorm refuses sequence parallelism: ``sequence_parallel=False``.
* verl 0.9.1 only: ``pad_bshd_to_minibatch_max=False`` (:func:`_bshd_padding_overrides`).
* a tiny word-level tokenizer is written next to the model (verl reads ``pad_token_id`` from it),
  and ``optim.total_training_steps`` is set (the trainer fills it in from the data set).

CPU stand-ins (``VC_TEST_DEVICE=cpu`` only; no CUDA here; :func:`_cpu_stand_ins`). verl 0.9's own
platform layer gets the FSDP driver's CPU platform (``serve_cpu_platform``); megatron-core and mbridge
call ``torch.cuda`` directly:

1. ``torch.cuda.current_device`` answers ``"cpu"``: megatron-core allocates on it (rotary
   ``inv_freq``, tensor-parallel buffers, ``gpt_model.py``).
2. Megatron's ``CudaRNGStatesTracker`` keeps names, not CUDA generator states (``add`` records the
   seed, ``fork`` is a no-op context): verl's ``set_random_seed`` calls
   ``model_parallel_cuda_manual_seed`` (``torch.cuda.get_rng_state``, ``tensor_parallel/random.py``),
   and weight init and ``DotProductAttention`` fork the tracker. Dropout is 0 in these models.
3. a ``TorchFunctionMode`` makes tensors asked for on ``"cuda"`` on the CPU and leaves
   ``Tensor.cuda()`` where it is: the optimizer's scalars (``optimizer/optimizer.py``
   ``found_inf``/``_scale_one``, ``optimizer/clip_grads.py``) use a literal ``device='cuda'``, and
   mbridge's ``get_model`` calls ``module.cuda(...)`` (``mbridge/core/util.py``).
4. ``Tensor.type()`` (no argument) names a CPU tensor by its CUDA twin: megatron-core's
   ``DistributedOptimizer`` sorts parameters by ``param.type() in ['torch.cuda.HalfTensor',
   'torch.cuda.BFloat16Tensor']`` and raises on anything else (``optimizer/distrib_optimizer.py``).
5. ``torch.cpu.empty_cache`` is a no-op: verl's ``load_megatron_model_to_gpu`` (each weight sync's
   export) calls ``get_torch_device().empty_cache()``, and the CPU has no cache.

Environment: ``VC_TEST_WORK``, ``VC_TEST_PORT``, ``VC_TEST_DEVICE`` (cpu/cuda), ``VC_TEST_TP``,
``VC_TEST_BENCH``, ``VC_TEST_MICRO`` (samples per micro batch, both phases; default 1),
``VC_TEST_TRIM`` (``ours``, the PROMPTS_ONLY trim, default; ``none``: the ride-along forward over
prompt + response), ``VC_TEST_PAD_BSHD_MAX``, ``VC_TEST_WEIGHT_SYNCS`` (1: a weight sync's export,
fingerprinted, before and after the update: versions 0 and 1), ``VC_TEST_NEXT_TOKEN`` (1: response
token 0 and its rollout log-prob from the FSDP driver's stand-in vLLM), plus the hooks' own variables
(DUMP_ON, DUMP_PHASE, ...). Launch one process per rank with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``
set (``torchrun``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # before the verl wheel's own top-level ``tests`` package

from bench.gpu.no_te import megatron_local_spec  # noqa: E402
from bench.support.fsdp_driver import (  # noqa: E402
    BATCH,
    _rollout_batch,
    _serve_pure_torch_attention_helpers,
    _stand_in_vllm_next_token,
)

VOCAB = 128


def _device() -> str:
    return os.environ.get("VC_TEST_DEVICE", "cpu")


def _init_dist() -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", os.environ.get("VC_TEST_PORT", "29541"))
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if _device() == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl", rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)


MODELS: dict[str, dict[str, Any]] = {
    # the FSDP driver's tiny Qwen2 (head_dim 8): the functional runs and the compare fixtures
    "tiny": {"hidden_size": 32, "intermediate_size": 64},
    # Qwen2-0.5B's shape (random weights, small vocabulary): the dump-cost measurement
    "qwen2-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
}


def _tiny_qwen2(work: Path) -> Path:
    """A random Qwen2 of ``VC_TEST_MODEL``'s shape, plus a word-level tokenizer with a pad token."""
    from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2, tiny_qwen2_config

    name = os.environ.get("VC_TEST_MODEL", "tiny")
    model_dir = work / f"{name}-qwen2-mcore"
    if (model_dir / "tokenizer.json").exists():
        return model_dir
    cfg = tiny_qwen2_config(
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        **MODELS[name],
    )
    tiny_qwen2(cfg, seed=0).save_pretrained(model_dir)
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, **{f"t{i}": i for i in range(1, VOCAB)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="t1").save_pretrained(
        model_dir
    )
    return model_dir


def _cpu_stand_ins() -> None:
    """``VC_TEST_DEVICE=cpu`` only: megatron-core's CUDA-only calls, answered for the CPU (no CUDA here).

    Everything else (model, schedule, optimizer, mbridge, verl's engine) runs as is.
    """
    import contextlib

    import torch
    from megatron.core.tensor_parallel import random as mcore_random

    # (1) megatron-core allocates on ``torch.cuda.current_device()`` (rotary inv_freq, TP buffers)
    torch.cuda.current_device = lambda: "cpu"

    # (2) Megatron's CUDA RNG tracker stores and swaps ``torch.cuda`` generator states: verl's
    # ``set_random_seed`` -> ``model_parallel_cuda_manual_seed`` -> ``add`` (torch.cuda.get_rng_state)
    # and every ``fork`` (DotProductAttention's dropout, weight init). Names are recorded, no state.
    def add(self: Any, name: str, seed: int) -> None:
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = None

    def fork(self: Any, name: str = "") -> Any:
        return contextlib.nullcontext()

    mcore_random.CudaRNGStatesTracker.add = add
    mcore_random.CudaRNGStatesTracker.fork = fork

    # (5) verl's ``load_megatron_model_to_gpu`` (every ``get_per_tensor_param``, a weight sync's
    # export) empties the device cache through ``get_torch_device()``, which is ``torch.cpu`` here:
    # there is no cache to empty, and torch.cpu has no ``empty_cache``
    if not hasattr(torch.cpu, "empty_cache"):
        torch.cpu.empty_cache = lambda: None

    # (3) tensors asked for on "cuda" are made (or stay) on the CPU: megatron-core's optimizer
    # allocates its scalars with a literal ``device='cuda'`` (``optimizer/optimizer.py``
    # ``found_inf``/``_scale_one``, ``optimizer/clip_grads.py``), and mbridge's ``get_model`` moves
    # each model chunk with ``module.cuda(...)`` (``mbridge/core/util.py``)
    from torch.overrides import TorchFunctionMode

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.Tensor.cuda:
                return args[0]
            if "cuda" in str(kwargs.get("device", "")):
                kwargs = {**kwargs, "device": "cpu"}
            return func(*args, **kwargs)

    CudaOnCpu().__enter__()

    # (4) megatron-core's optimizers sort parameters by their CUDA type name
    # (``param.type() in ['torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor']``,
    # ``optimizer/distrib_optimizer.py``, ``optimizer/clip_grads.py``) and refuse any other:
    # ``Tensor.type()`` without an argument names a CPU tensor's type as its CUDA twin
    plain_type = torch.Tensor.type

    def tensor_type(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = plain_type(self, *args, **kwargs)
        if args or kwargs or not isinstance(name, str):
            return name
        # (a Parameter comes back through this function once more via ``__torch_function__``)
        if self.device.type != "cpu" or name.startswith("torch.cuda."):
            return name
        return name.replace("torch.", "torch.cuda.", 1)

    torch.Tensor.type = tensor_type


def _micro() -> int:
    """``VC_TEST_MICRO``: samples per micro batch, in both phases (default 1)."""
    return int(os.environ.get("VC_TEST_MICRO", "1"))


def _verl_minor() -> tuple[int, int]:
    import verl
    from packaging.version import Version

    v = Version(verl.__version__)
    return v.major, v.minor


def _ids_as_v1_extra_fields(batch: Any) -> None:
    """Move the id columns into one ``extra_fields`` dict per row, as verl 0.9.1's V1 path has them.

    ``AgentLoopWorkerTQ._agent_loop_postprocess`` stores ``AgentLoopOutput.as_dict()`` unflattened,
    so the engine's micro batches carry no ``request_id`` column (patches/next/verl/README.md); the
    training hook then reads the ids from ``extra_fields``. Done after the PROMPTS_ONLY trim, which
    works on the DataProto the V0 path still hands it.
    """
    import numpy as np

    nt = batch.non_tensor_batch
    rows = np.empty(len(nt["request_id"]), dtype=object)
    rows[:] = [
        {"request_id": str(rid), "request_ids_all": [str(x) for x in every]}
        for rid, every in zip(nt.pop("request_id"), nt.pop("request_ids_all"), strict=True)
    ]
    nt["extra_fields"] = rows


def _bshd_padding_overrides() -> list[str]:
    """verl 0.9.1 pads every bshd micro batch to the mini batch's longest sequence by default
    (``pad_bshd_to_minibatch_max``, ``forward_backward_batch`` L864-871; 0.8.0 padded each micro
    batch to its own longest). The bshd format is this driver's substitution (the THD path that
    real runs use is untouched by the option), and those padding positions would enter every
    per-module statistic of a shorter request's dump, so it is off unless ``VC_TEST_PAD_BSHD_MAX=1``
    asks for verl's default (the run that shows the effect)."""
    if _verl_minor() < (0, 9):
        return []
    keep = os.environ.get("VC_TEST_PAD_BSHD_MAX") == "1"
    return [f"actor_rollout_ref.actor.megatron.pad_bshd_to_minibatch_max={keep}"]


def _actor_config(model_dir: Path, tp: int) -> Any:
    """verl's own Hydra defaults for the Megatron actor, as the worker builds them."""
    from verl_consistency.entrypoints.engines.fsdp_stage import compose_actor_config

    return compose_actor_config(
        "ppo_megatron_trainer",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={_micro()}",
            "actor_rollout_ref.actor.use_dynamic_bsz=False",
            f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}",
            "actor_rollout_ref.actor.megatron.use_remove_padding=False",
            # megatron-core's torch RMSNorm (no TE, no Apex) refuses sequence parallelism
            "actor_rollout_ref.actor.megatron.sequence_parallel=False",
            "+actor_rollout_ref.actor.megatron.override_transformer_config.sequence_parallel=False",
            # the trainer fills this in from the data set's length; the LR scheduler needs it
            "actor_rollout_ref.actor.optim.total_training_steps=10",
            "actor_rollout_ref.actor.megatron.seed=0",
            # mbridge (0.8.0's default; 0.9.1's default Megatron-Bridge needs Transformer Engine)
            "actor_rollout_ref.actor.megatron.vanilla_mbridge=True",
            *_bshd_padding_overrides(),
        ],
    )


def _engine_keys(td: Any, **extra: Any) -> None:
    from verl.utils import tensordict_utils as tu

    tu.assign_non_tensor(
        td,
        use_remove_padding=False,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=_micro(),
        max_token_len_per_gpu=4096,
        use_fused_kernels=False,
        temperature=1.0,
        **extra,
    )


def _bench_batch(tokens: int) -> Any:
    """Four prompts of ``tokens`` tokens plus one response token each: a PROMPTS_ONLY-shaped batch."""
    import numpy as np
    import torch
    from verl import DataProto

    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1, VOCAB, (BATCH, tokens + 1), generator=gen)
    attn = torch.ones_like(ids)
    return DataProto.from_dict(
        tensors={
            "prompts": ids[:, :tokens],
            "responses": ids[:, tokens:],
            "response_mask": torch.ones(BATCH, 1, dtype=torch.long),
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": torch.arange(tokens + 1).expand(BATCH, -1).clone(),
            "rm_scores": torch.tensor([[0.0], [1.0], [0.0], [1.0]]),
            "rollout_log_probs": torch.zeros(BATCH, 1),
        },
        non_tensors={
            "request_id": np.array([f"{i:032x}" for i in range(BATCH)], dtype=object),
            "uid": np.array(["a", "a", "b", "b"], dtype=object),
        },
    )


def _export_weights(engine: Any, path: Path) -> int:
    """The weights as verl hands them to vLLM (mbridge's Megatron -> HF export), saved for the stand-in."""
    import torch
    from safetensors.torch import save_file

    params, _ = engine.get_per_tensor_param()
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in params}
    if torch.distributed.get_rank() == 0:
        save_file(tensors, str(path))
    return len(tensors)


def _sync_export(engine: Any, version: int) -> None:
    """One weight sync's export as verl streams it to vLLM: the engine's ``get_per_tensor_param``
    (mbridge's Megatron -> HF conversion) through the trainer-side fingerprint that patch 0007
    wraps around it in ``update_weights`` (``weight_export.exporting``), consumed here."""
    from verl_consistency.patches.hooks.training import weight_export
    from verl_consistency.patches.hooks.weights import sync_log

    params, _ = engine.get_per_tensor_param()
    for _name, _tensor in weight_export.exporting(params, version, "bfloat16"):  # verl's rollout.dtype
        pass
    sync_log.drain()  # the record is written off the sync's path


def main() -> None:
    import torch

    work = Path(os.environ["VC_TEST_WORK"])
    work.mkdir(parents=True, exist_ok=True)
    tp = int(os.environ.get("VC_TEST_TP", os.environ.get("WORLD_SIZE", "1")))
    _init_dist()
    rank = torch.distributed.get_rank()
    if rank == 0:
        _tiny_qwen2(work)
    torch.distributed.barrier()
    model_dir = _tiny_qwen2(work)
    megatron_local_spec.apply()
    if _device() == "cpu":
        _cpu_stand_ins()
    _serve_pure_torch_attention_helpers(cpu_platform=_device() == "cpu")

    from verl.trainer.config import CheckpointConfig
    from verl.trainer.ppo import core_algos
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import HFModelConfig
    from verl.workers.engine.megatron.transformer_impl import MegatronEngineWithLMHead
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from verl_consistency.patches.hooks.training import prompts_only

    actor_cfg = _actor_config(model_dir, tp)
    model_config = HFModelConfig(path=str(model_dir), use_remove_padding=False)
    engine = MegatronEngineWithLMHead(
        model_config=model_config,
        engine_config=actor_cfg.engine,
        optimizer_config=actor_cfg.optim,
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()

    import megatron.core
    import verl

    report: dict[str, Any] = {
        "world_size": torch.distributed.get_world_size(),
        "tp": tp,
        "device": _device(),
        "torch": torch.__version__,
        "megatron_core": megatron.core.__version__,
        "verl": verl.__version__,
        "pad_bshd_to_minibatch_max": getattr(actor_cfg.engine, "pad_bshd_to_minibatch_max", None),
        "module_class": type(engine.module[0]).__name__,
        "model": os.environ.get("VC_TEST_MODEL", "tiny"),
    }
    export = os.environ.get("VC_TEST_EXPORT")
    if export:
        report["exported_tensors"] = _export_weights(engine, Path(export))

    def old_log_probs(b: Any) -> Any:
        td = left_right_2_no_padding(b.to_tensordict())
        _engine_keys(td, calculate_entropy=True, compute_loss=False)
        with engine.eval_mode():
            out = engine.infer_batch(td)
        return td, out

    def update(b: Any) -> Any:
        td = left_right_2_no_padding(b.to_tensordict())
        _engine_keys(td, calculate_entropy=True, global_batch_size=BATCH)
        with engine.train_mode():
            return engine.train_batch(td, loss_function=partial(ppo_loss, actor_cfg))

    def advantages(b: Any) -> None:
        # GRPO advantages: the call RayPPOTrainer's compute_advantage makes (ray_trainer.py itself
        # is not imported: it pulls the trainer's web stack, which the engine never uses)
        b.batch["token_level_rewards"] = b.batch["rm_scores"]
        adv, ret = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=b.batch["token_level_rewards"],
            response_mask=b.batch["response_mask"],
            index=b.non_tensor_batch["uid"],
            norm_adv_by_std_in_grpo=True,
        )
        b.batch["advantages"], b.batch["returns"] = adv, ret

    n = int(os.environ.get("VC_TEST_BENCH", "0"))
    if n:
        tokens = int(os.environ.get("VC_TEST_BENCH_TOKENS", "512"))
        batch = _bench_batch(tokens)
        _, out = old_log_probs(batch)
        batch.batch["old_log_probs"] = torch.zeros(BATCH, 1)
        advantages(batch)
        sync = torch.cuda.synchronize if _device() == "cuda" else (lambda: None)
        timings: dict[str, list[float]] = {}
        for dump in ("0", "1", "0", "1"):  # interleaved; the first of each is a warm-up
            os.environ["DUMP_ON"] = dump
            for phase, fn in (("log_prob", old_log_probs), ("update_actor", update)):
                per: list[float] = []
                for _ in range(n):
                    sync()
                    t0 = time.perf_counter()
                    fn(batch)
                    sync()
                    per.append((time.perf_counter() - t0) / BATCH)
                timings.setdefault(f"{phase}.dump{dump}", []).extend(per)
        report["bench"] = {"tokens": tokens, "micro_batches_per_call": BATCH, "per_micro_batch_s": timings}
    else:
        batch = _rollout_batch()
        if os.environ.get("VC_TEST_NEXT_TOKEN") == "1":
            _stand_in_vllm_next_token(batch, model_dir)
        if os.environ.get("VC_TEST_TRIM", "ours") == "ours":
            batch = prompts_only.trim(batch)
        report["request_ids"] = list(batch.non_tensor_batch["request_id"])
        if _verl_minor() >= (0, 9):
            _ids_as_v1_extra_fields(batch)
        report["ids_in"] = "extra_fields" if "extra_fields" in batch.non_tensor_batch else "request_id"
        td, out = old_log_probs(batch)
        if "model_output" in out:
            log_probs = no_padding_2_padding(tu.get(out["model_output"], "log_probs"), td)
            batch.batch["old_log_probs"] = log_probs.float().cpu()
            report["old_log_probs_finite"] = bool(torch.isfinite(log_probs).all())
        else:  # not the last pipeline stage
            batch.batch["old_log_probs"] = torch.zeros_like(batch.batch["response_mask"], dtype=torch.float32)
        advantages(batch)
        syncs = os.environ.get("VC_TEST_WEIGHT_SYNCS") == "1"
        if syncs:
            _sync_export(engine, 0)
        out = update(batch)
        if syncs:
            _sync_export(engine, 1)
        metrics = out.get("metrics", {})
        report["grad_norm"] = float(metrics["grad_norm"]) if "grad_norm" in metrics else None
        losses = [float(x) for x in torch.as_tensor(out.get("loss", [])).flatten().tolist()]
        report["loss"] = losses
        report["finite"] = all(torch.isfinite(torch.tensor(losses)).tolist()) if losses else None

    if rank == 0:
        print("VC_REPORT " + json.dumps(report), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
