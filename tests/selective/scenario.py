"""One vLLM-worker-like process: real msprobe around packed steps of the stand-in model.

Run as ``python -m tests.selective.scenario TASK OUT``. msprobe's ``PrecisionDebugger`` is a
per-process singleton, as in a vLLM worker, so each task gets its own process. Steps:

0. packed prefill of requests a, b, c (packing order a, b, c; the scheduler's dict lists them
   c, a, b), scoped to b with ``packing_order`` given;
1. a decode step of a, b, c: not dumped (``capture_request_id=None``);
2. b alone (one request, one step): the reference;
3. the step-0 batch scoped to b, but *without* ``packing_order`` (the bug it prevents);
4. after msprobe hot-reloads the config file: the step-0 batch scoped to b again.

``OUT/result.json`` records what ``start_step`` returned for each step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config

from bench.support.vllm_qwen2 import Qwen2ForCausalLM, run_step
from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2, tiny_qwen2_config
from verl_consistency.patches.hooks.rollout.request_scope import scoped_msprobe_config, start_step

LENGTHS = {"a": 7, "b": 11, "c": 5}
PACKING = ["a", "b", "c"]
SCHEDULER_DICT = {"c": 5, "a": 7, "b": 11}
CAPTURED = "b"


def tiny_config() -> Qwen2Config:
    # hidden 48, intermediate 80, vocab 96: no width equals a step's token count (23, 11, 3),
    # so only activations are cut (see request_scope's note on coincidental first dimensions).
    return tiny_qwen2_config(vocab_size=96, hidden_size=48, intermediate_size=80, max_position_embeddings=64)


def setup(task: str, out: Path) -> tuple[Any, Any, dict[str, list[int]], list[list[int]]]:
    """A run's scoped msprobe config in ``out``, the stand-in model, the prompts and the packed batch.

    Returns ``(debugger, model, prompts by request, batch in packing order)``; the config carries
    the one-request sentinel, as a collection run's does.
    """
    model = Qwen2ForCausalLM.from_hf(tiny_qwen2(tiny_config(), seed=0)).eval()
    debugger, prompts = scoped_debugger(task, out)
    return debugger, model, prompts, [prompts[r] for r in PACKING]


def scoped_debugger(task: str, out: Path) -> tuple[Any, dict[str, list[int]]]:
    """msprobe's debugger on a run's scoped config written in ``out``, and the scenario's prompts
    (the same random ids in every scenario)."""
    from msprobe.pytorch import PrecisionDebugger

    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "msprobe.json"
    cfg_path.write_text(json.dumps(scoped_msprobe_config(base_config(task, out))))
    gen = torch.Generator().manual_seed(1)
    prompts = {r: torch.randint(0, 96, (n,), generator=gen).tolist() for r, n in LENGTHS.items()}
    return PrecisionDebugger(config_path=str(cfg_path)), prompts


def base_config(task: str, out: Path) -> dict[str, Any]:
    return {
        "task": task,
        "dump_path": str(out / "dump"),
        "rank": [],
        "step": [],
        "level": "L0",
        "dump_enable": True,
        task: {"scope": [], "list": [], "data_mode": ["all"]},
    }


def main(task: str, out: Path) -> None:
    debugger, model, prompts, batch = setup(task, out)
    cfg_path = out / "msprobe.json"
    base = base_config(task, out)
    dumped: list[bool] = []

    def step(
        requests: list[list[int]], capture: str | None, sched: dict[str, int], order: list[str] | None
    ) -> None:
        dumped.append(
            start_step(
                debugger, model, capture_request_id=capture, scheduled_tokens=sched, packing_order=order
            )
        )
        run_step(model, requests)
        debugger.stop()
        debugger.step()

    step(batch, CAPTURED, SCHEDULER_DICT, PACKING)
    step([[1], [2], [3]], None, {"c": 1, "a": 1, "b": 1}, PACKING)
    step([prompts[CAPTURED]], CAPTURED, {CAPTURED: LENGTHS[CAPTURED]}, None)
    step(batch, CAPTURED, SCHEDULER_DICT, None)
    # Hot reload: the file changes (same content, new mtime and size); msprobe re-reads it.
    time.sleep(0.6)
    cfg_path.write_text(json.dumps(scoped_msprobe_config(base), indent=1))
    step(batch, CAPTURED, SCHEDULER_DICT, PACKING)
    (out / "result.json").write_text(json.dumps({"dumped": dumped, "pid": os.getpid()}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
