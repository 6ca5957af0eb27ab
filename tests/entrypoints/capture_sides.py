"""One side of a ``--capture fraction:F`` run, from the configs ``verl-consistency run`` wrote.

Run as ``python -m tests.entrypoints.capture_sides rollout|actor RUN_DIR CAPTURED OTHER``, one
process per side (msprobe's ``PrecisionDebugger`` is a per-process singleton, as in a vLLM worker
or a verl actor). Writes ``RUN_DIR/<side>-result.json``.

- ``rollout``: loaded the way the patched vLLM runner loads it: ``DispatchLogger.for_rollout``
  (the hook's start-up check of the config) then ``PrecisionDebugger(config, dump_path=<the
  hook's per-pid folder>)``. One packed prefill step of OTHER, CAPTURED, OTHER2 goes through the
  hook's ``start``/``finish``. The model is ``tests/standins/vllm_qwen2``, a STAND-IN for
  vLLM's Qwen2 (vLLM cannot run here); the scheduler output is a STAND-IN too (a namespace with
  the fields the hook reads).
- ``actor``: the real transformers ``Qwen2ForCausalLM`` with the same weights, one forward of
  CAPTURED alone (a training micro batch of one sample, padding removed: ``[1, tokens]``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import Qwen2ForCausalLM as HFQwen2

from bench.support.vllm_qwen2 import Qwen2ForCausalLM, run_step
from tests.selective.scenario import tiny_config
from verl_consistency.contracts.layout import RunLayout
from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2

LENGTHS = (7, 11, 5)
"""Prompt lengths of OTHER, CAPTURED, OTHER2, packed in this order."""


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 96, (n,), generator=gen).tolist() for n in LENGTHS]


def _hf_model() -> HFQwen2:
    return tiny_qwen2(tiny_config(), seed=0)


def _config_fields(debugger: object) -> dict[str, object]:
    cfg = debugger.config  # type: ignore[attr-defined]
    return {
        "task": cfg.task,
        "level": cfg.level,
        "list": list(cfg.list),
        "data_mode": list(cfg.data_mode),
        "request_id": cfg.request_id,
    }


def rollout(run_dir: Path, captured: str, other: str) -> dict[str, object]:
    from msprobe.pytorch import PrecisionDebugger

    from verl_consistency.patches.hooks.rollout.dispatch import DispatchLogger

    layout = RunLayout(run_dir.parent, run_dir.name)
    logger = DispatchLogger.for_rollout(layout.rollout_config)
    debugger = PrecisionDebugger(str(layout.rollout_config), dump_path=str(logger.dump_path))
    model = Qwen2ForCausalLM.from_hf(_hf_model()).eval()
    prompts = _prompts()
    ids = [other, captured, f"{other}-second"]
    so = SimpleNamespace(  # STAND-IN for vLLM's SchedulerOutput: only what the hook reads
        scheduled_new_reqs=[
            SimpleNamespace(req_id=rid, prompt_token_ids=p, num_computed_tokens=0)
            for rid, p in zip(ids, prompts, strict=True)
        ],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[]),
        num_scheduled_tokens={rid: len(p) for rid, p in zip(ids, prompts, strict=True)},
        total_num_scheduled_tokens=sum(LENGTHS),
    )
    started = logger.start(debugger, model, so, SimpleNamespace(name="PrefillNoCache"), ids)
    run_step(model, prompts)
    finished = logger.finish()
    if finished:
        debugger.stop()
        debugger.step()
    logger.close()
    return {
        "started": started,
        "finished": finished,
        "dump_path": str(logger.dump_path),
        "config": _config_fields(debugger),
    }


def actor(run_dir: Path, captured: str, other: str) -> dict[str, object]:
    from msprobe.pytorch import PrecisionDebugger

    layout = RunLayout(run_dir.parent, run_dir.name)
    dump_path = layout.actor_dir / str(os.getpid())
    debugger = PrecisionDebugger(str(layout.actor_config), dump_path=str(dump_path))
    model = _hf_model()
    debugger.start(model=model)
    with torch.no_grad():
        model(input_ids=torch.tensor([_prompts()[1]]))
    debugger.stop()
    debugger.step()
    return {"dump_path": str(dump_path), "config": _config_fields(debugger)}


if __name__ == "__main__":
    side, run, cap, oth = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    result = (rollout if side == "rollout" else actor)(run, cap, oth)
    (run / f"{side}-result.json").write_text(json.dumps(result))
