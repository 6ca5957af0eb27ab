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

from bench.support.vllm_qwen2 import run_step
from tests.selective.scenario import LENGTHS, PACKING, SCHEDULER_DICT, setup
from verl_consistency.patches.hooks.lanes.msprobe_lanes import packed_lanes
from verl_consistency.patches.hooks.rollout.request_scope import start_lanes, start_step


def main(task: str, out: Path) -> None:
    debugger, model, prompts, batch = setup(task, out)
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
