"""One process, real msprobe (statistics, L0): every lane layout dumped twice, fan-out then one pass.

Run as ``python -m tests.selective.lane_stats_scenario OUT``. Each case runs the same forward on
the same inputs twice in a row, first with ``msprobe_lanes.DEFAULT_PATH = "fanout"`` (msprobe's
own collector per lane: the reference) and then ``"auto"`` (``lane_collector.LaneStats``, one pass
for all lanes), so that step ``2i`` and step ``2i + 1`` must hold the same lanes:

* ``vllm``: the vLLM-layout stand-in (``[tokens, hidden]`` rows, logits ``[requests, vocab]``),
  lanes from ``packed_lanes(..., request_rows=True)`` started by ``request_scope.start_lanes``, as
  the dispatch hook does, for a, b, c;
* ``vllm-subset``: the same batch, lanes for c and a only (b not captured), asked in that order;
* ``vllm-bf16``: the stand-in in bfloat16 (what a GPU worker runs);
* ``thd``: a transformers Qwen2 on a packed ``[1, total]`` micro batch, lanes from
  ``micro_batch_dump.PackedLayout(..., thd=True).lanes`` (cuts on dims 1 and 0), installed as the training
  hook does;
* ``padded``: the same model on a right-padded ``[batch, longest]`` micro batch with its attention
  mask, ``PackedLayout(..., thd=False)`` (row on dim 0, positions on dim 1);
* ``thd-prompt-rows``, ``padded-prompt-rows``: both training layouts over prompt + response rows
  (ride-along), each lane cut to its request's prompt rows (``PackedLayout(..., prompts=...)``);
* ``empty``: lanes started and stopped with no forward between (only msprobe's initial files);
  ``empty-training`` the same in the training hook's order.

Each training-hook case runs a third time, one pass with its lanes' files written by the helper
process (``lane_writer.LaneWriter``, as ``BatchDumper`` sets it for FSDP): ``helper_step``.

``OUT/result.json`` lists each case's two steps, the front msprobe held during each, and the lanes.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.support.vllm_qwen2 import Qwen2ForCausalLM, run_step
from tests.selective.scenario import LENGTHS, PACKING, SCHEDULER_DICT, scoped_debugger, tiny_config
from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2
from verl_consistency.patches.hooks.lanes import msprobe_lanes
from verl_consistency.patches.hooks.lanes.lane_writer import LaneWriter
from verl_consistency.patches.hooks.rollout.request_scope import start_lanes
from verl_consistency.patches.hooks.training.micro_batch_dump import PackedLayout

PATHS = ("fanout", "auto")
RESPONSES = {"a": 3, "b": 1, "c": 4}
"""Ride-along cases: each row's response tokens after its prompt (``LENGTHS``)."""


def _packed_training_batch(prompts: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    ids = torch.tensor([t for r in PACKING for t in prompts[r]]).unsqueeze(0)
    positions = torch.cat([torch.arange(len(prompts[r])) for r in PACKING]).unsqueeze(0)
    return {"input_ids": ids, "position_ids": positions}


def _padded_training_batch(prompts: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    longest = max(len(x) for x in prompts.values())
    ids = torch.zeros((len(PACKING), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, r in enumerate(PACKING):
        ids[row, : len(prompts[r])] = torch.tensor(prompts[r])
        mask[row, : len(prompts[r])] = 1
    return {"input_ids": ids, "attention_mask": mask}


def main(out: Path) -> None:
    debugger, prompts = scoped_debugger("statistics", out)
    hf = tiny_qwen2(tiny_config(), seed=0)
    stand_in = Qwen2ForCausalLM.from_hf(hf).eval()
    stand_in_bf16 = Qwen2ForCausalLM.from_hf(tiny_qwen2(tiny_config(), seed=0)).to(torch.bfloat16).eval()
    batch = [prompts[r] for r in PACKING]
    cases: list[dict[str, Any]] = []

    helper = LaneWriter()

    def twice(name: str, model: Any, lanes: list[msprobe_lanes.Lane], forward: Callable[[], Any]) -> None:
        steps, fronts, written = [], [], None
        # a training-hook case runs a third time, one pass with the files written by the helper
        for path in (*PATHS, "helper") if model is hf else PATHS:
            msprobe_lanes.DEFAULT_PATH = "auto" if path == "helper" else path  # type: ignore[assignment]
            if model is hf:  # the training hook's order: install, then start(model=...)
                front = msprobe_lanes.install(debugger.service, lanes)
                if path == "helper":
                    assert isinstance(front, msprobe_lanes.LaneStats)
                    front.writer = helper  # as micro_batch_dump.BatchDumper sets it for FSDP
                debugger.start(model=model)
            else:  # the dispatch hook's: request_scope.start_lanes
                start_lanes(debugger, model, lanes)
            step = int(debugger.service.current_iter)
            with torch.no_grad():
                forward()
            debugger.stop()
            debugger.step()
            if path == "helper":
                written = step
                helper.drain()
            else:
                fronts.append(type(debugger.service.data_collector).__name__)
                steps.append(step)
        cases.append(
            {
                "case": name,
                "steps": steps,
                "helper_step": written,
                "fronts": fronts,
                "lanes": [lane.request_id for lane in lanes],
            }
        )

    vllm_lanes = msprobe_lanes.packed_lanes(SCHEDULER_DICT, PACKING, PACKING, request_rows=True)
    twice("vllm", stand_in, vllm_lanes, lambda: run_step(stand_in, batch))
    subset = msprobe_lanes.packed_lanes(SCHEDULER_DICT, PACKING, ["c", "a"], request_rows=True)
    twice("vllm-subset", stand_in, subset, lambda: run_step(stand_in, batch))
    twice("vllm-bf16", stand_in_bf16, vllm_lanes, lambda: run_step(stand_in_bf16, batch))
    lengths = tuple(LENGTHS[r] for r in PACKING)
    thd = PackedLayout(lengths, thd=True).lanes(list(PACKING), list(PACKING))
    padded = PackedLayout(lengths, thd=False).lanes(list(PACKING), ["b", "c", "a"])
    assert thd is not None
    assert padded is not None
    twice("thd", hf, thd, lambda: hf(**_packed_training_batch(prompts)))
    twice("padded", hf, padded, lambda: hf(**_padded_training_batch(prompts)))
    rows = {r: prompts[r] + list(range(1, 1 + RESPONSES[r])) for r in PACKING}
    full = tuple(len(rows[r]) for r in PACKING)
    thd_rows = PackedLayout(full, thd=True, prompts=lengths).lanes(list(PACKING), ["c", "a", "b"])
    padded_rows = PackedLayout(full, thd=False, prompts=lengths).lanes(list(PACKING), list(PACKING))
    assert thd_rows is not None
    assert padded_rows is not None
    twice("thd-prompt-rows", hf, thd_rows, lambda: hf(**_packed_training_batch(rows)))
    twice("padded-prompt-rows", hf, padded_rows, lambda: hf(**_padded_training_batch(rows)))
    twice("empty", stand_in, vllm_lanes, lambda: None)
    twice("empty-training", hf, thd, lambda: None)
    helper.close()
    (out / "result.json").write_text(json.dumps({"cases": cases, "pid": os.getpid()}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
