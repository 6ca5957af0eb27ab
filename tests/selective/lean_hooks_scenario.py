"""One process, real msprobe (statistics, L0): the same lanes dumped with ``lean_hooks`` engaged and
with msprobe's own module hooks, on the same one-pass front, without and with gradients.

Run as ``python -m tests.selective.lean_hooks_scenario OUT``. Four steps of a transformers Qwen2
on one packed micro batch (lanes ``PackedLayout(..., thd=True)``, installed as the training hook
does):

* ``lean``: under ``no_grad``, the lean pair in msprobe's slots (what a log_prob pass runs);
* ``msprobe``: the same, msprobe's own hooks put back after ``start`` (``lean_hooks.disengage``);
* ``lean-grad``: gradients on, the lean pair in place (it must hand every call to msprobe's hooks);
* ``msprobe-grad``: gradients on, msprobe's own hooks.

``OUT/result.json`` names each step's number, how many module calls the lean pair dumped itself,
and whether ``uninstall`` left msprobe's own hooks in every slot.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tests.selective.lane_stats_scenario import _packed_training_batch
from tests.selective.scenario import LENGTHS, PACKING, scoped_debugger, tiny_config
from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2
from verl_consistency.patches.hooks.lanes import lean_hooks, msprobe_lanes
from verl_consistency.patches.hooks.training.micro_batch_dump import PackedLayout


def main(out: Path) -> None:
    debugger, prompts = scoped_debugger("statistics", out)
    model = tiny_qwen2(tiny_config(), seed=0)
    lanes = PackedLayout(tuple(LENGTHS[r] for r in PACKING), thd=True).lanes(list(PACKING), list(PACKING))
    assert lanes is not None
    lean_calls = [0]

    class Counted(set[str]):
        """The lean pair's names of calls in flight: each added one is a call it dumps itself
        (counted here, not by wrapping a function: a wrapper's frame would be in the stacks)."""

        def add(self, name: str) -> None:
            lean_calls[0] += 1
            super().add(name)

    lean_hooks.service_hooks(debugger.service).lean = Counted()
    steps: dict[str, dict[str, int]] = {}
    for name, lean, grad in (
        ("lean", True, False),
        ("msprobe", False, False),
        ("lean-grad", True, True),
        ("msprobe-grad", False, True),
    ):
        msprobe_lanes.install(debugger.service, lanes)
        debugger.start(model=model)
        if not lean:
            lean_hooks.disengage(debugger.service)
        lean_calls[0] = 0
        step = int(debugger.service.current_iter)
        with torch.set_grad_enabled(grad):
            model(**_packed_training_batch(prompts))
        debugger.stop()
        debugger.step()
        steps[name] = {"step": step, "lean_calls": lean_calls[0]}
    msprobe_lanes.uninstall(debugger.service)
    pairs = lean_hooks.service_hooks(debugger.service).pairs
    restored = all(
        p.module_ref._forward_pre_hooks.get(p.key) is p.pre
        and (p.forward_key is None or p.module_ref._forward_hooks.get(p.forward_key) is p.forward)
        for p in pairs
    )
    (out / "result.json").write_text(json.dumps({"steps": steps, "pairs": len(pairs), "restored": restored}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
