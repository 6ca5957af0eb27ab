"""One vLLM-worker-like process: real msprobe, per-request lanes out of packed steps of the stand-in model.

Run as ``python -m tests.selective.lanes_scenario TASK OUT``. Steps:

0. packed prefill of a, b, c (packing order a, b, c), one lane per request;
1. a decode step: not dumped (no lanes);
2. a alone, 3. b alone, 4. c alone: the references, one lane each;
5. the step-0 batch, lanes for c and a only (b not captured), asked in the order c, a;
6. the step-0 batch through the one-request path (``start_step``, msprobe's own cut) for b:
   the fan-out steps aside and msprobe writes its usual ``step6/<rank>/dump.json``.

``OUT/result.json`` records what each start returned and the lane order of the lane steps.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from tests.fixtures.tiny_qwen2 import tiny_qwen2
from tests.fixtures.vllm_qwen2 import Qwen2ForCausalLM, run_step
from tests.selective.scenario import LENGTHS, PACKING, SCHEDULER_DICT, tiny_config
from verl_consistency.patches.hooks.msprobe_lanes import packed_lanes
from verl_consistency.patches.hooks.request_scope import scoped_msprobe_config, start_lanes, start_step


def main(task: str, out: Path) -> None:
    from msprobe.pytorch import PrecisionDebugger

    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "msprobe.json"
    base = {
        "task": task,
        "dump_path": str(out / "dump"),
        "rank": [],
        "step": [],
        "level": "L0",
        "dump_enable": True,
        task: {"scope": [], "list": [], "data_mode": ["all"]},
    }
    # the run's config carries the one-request sentinel; the lane path must ignore it
    cfg_path.write_text(json.dumps(scoped_msprobe_config(base)))
    model = Qwen2ForCausalLM.from_hf(tiny_qwen2(tiny_config(), seed=0)).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = {r: torch.randint(0, 96, (n,), generator=gen).tolist() for r, n in LENGTHS.items()}
    batch = [prompts[r] for r in PACKING]
    debugger = PrecisionDebugger(config_path=str(cfg_path))
    dumped: list[bool] = []

    def lanes_step(
        requests: list[list[int]], tokens: dict[str, int], order: list[str], wanted: list[str]
    ) -> None:
        lanes = packed_lanes(tokens, order, wanted, request_rows=True) if wanted else []
        dumped.append(start_lanes(debugger, model, lanes))
        run_step(model, requests)
        debugger.stop()
        debugger.step()

    lanes_step(batch, SCHEDULER_DICT, PACKING, ["a", "b", "c"])
    lanes_step([[1], [2], [3]], {"a": 1, "b": 1, "c": 1}, PACKING, [])
    for r in PACKING:
        lanes_step([prompts[r]], {r: LENGTHS[r]}, [r], [r])
    lanes_step(batch, SCHEDULER_DICT, PACKING, ["c", "a"])
    dumped.append(
        start_step(
            debugger, model, capture_request_id="b", scheduled_tokens=SCHEDULER_DICT, packing_order=PACKING
        )
    )
    run_step(model, batch)
    debugger.stop()
    debugger.step()
    (out / "result.json").write_text(json.dumps({"dumped": dumped, "pid": os.getpid()}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
