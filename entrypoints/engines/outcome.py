"""What a single-node run (the demo's, the check's) ends with: its verified bundle and a summary.

Both commands end the same way: the unchanged postprocess (pair → compare → report → bundle),
then ``verify`` of the bundle, then the counts a person or a test reads (:class:`RunOutcome`,
written as ``demo-summary.json`` or ``<run>-summary.json``). A bundle that does not verify is a
:class:`.stage_runner.StageError`: the run produced something the postprocess cannot stand behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_consistency.entrypoints.engines.stage_runner import StageError


@dataclass
class RunOutcome:
    """One run's verified bundle, its report, and what the pairing and the comparisons found."""

    run_dir: Path
    bundle: Path
    report: Path
    pairs: int
    verdicts: dict[str, int]
    first_divergences: list[str | None]
    timings: dict[str, float] = field(default_factory=dict)
    stage_info: dict[str, Any] = field(default_factory=dict)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    """The bundle's comparisons (one per pair: request id, verdict, first divergence), for a caller
    that groups them (``demo-weight-sync`` by phase); not in :meth:`summary`."""
    pair_versions: dict[str, int | None] = field(default_factory=dict)
    """Each paired request's weight version (``Pair.weight_version``); not in :meth:`summary`."""

    def summary(self) -> dict[str, Any]:
        """What ``demo-summary.json`` (per run) and the check's ``<run>-summary.json`` hold."""
        return {
            "run_dir": str(self.run_dir),
            "bundle": str(self.bundle),
            "report": str(self.report),
            "pairs": self.pairs,
            "verdicts": self.verdicts,
            "first_divergences": self.first_divergences,
            "timings": self.timings,
            **self.stage_info,
        }


def _postprocess(run_dir: Path, bundles: Path) -> tuple[Any, Path]:
    """The pipeline's outcome and the report's path; :class:`StageError` unless the bundle verifies."""
    from verl_consistency.postprocess import pipeline
    from verl_consistency.postprocess.output import bundle as bundle_mod

    outcome = pipeline.postprocess(run_dir, out=bundles)
    check = bundle_mod.verify(outcome.bundle)
    if not check.ok:
        raise StageError(f"{outcome.bundle} does not verify: {check}")
    report = bundles / f"work-{outcome.manifest.run_id}" / "results" / "report.html"
    return outcome, report


def run_outcome(run_dir: Path, bundles: Path, timings: dict[str, float], info: dict[str, Any]) -> RunOutcome:
    """Postprocess ``run_dir`` into ``bundles``, verify the bundle, and count what it holds.

    ``timings`` gains ``postprocess_s``; ``info`` (the stages' own outputs) is kept in the summary.
    """
    t0 = time.monotonic()
    outcome, report = _postprocess(run_dir, bundles)
    timings["postprocess_s"] = round(time.monotonic() - t0, 1)
    comparisons = outcome.manifest.comparisons
    verdicts: dict[str, int] = {}
    for c in comparisons:
        verdicts[str(c.get("verdict"))] = verdicts.get(str(c.get("verdict")), 0) + 1
    variance: dict[str, int] = {}
    for v in outcome.manifest.batch_variance:  # a check run's (vLLM batched vs alone); else empty
        variance[str(v.verdict)] = variance.get(str(v.verdict), 0) + 1
    return RunOutcome(
        run_dir=run_dir,
        bundle=outcome.bundle,
        report=report,
        pairs=len(outcome.result.pairs),
        verdicts=verdicts,
        first_divergences=[c.get("first_divergence") for c in comparisons],
        timings=timings,
        comparisons=list(comparisons),
        pair_versions={p.request_id: p.weight_version for p in outcome.result.pairs},
        stage_info={
            **info,
            "exit_code": int(outcome.code),
            "batch_variance": variance,
            "counts": outcome.result.counts,
            "paired_request_ids": sorted({p.request_id for p in outcome.result.pairs}),
            # why each request the pairing listed was left out (its manifest's `unpaired`)
            "unpaired_requests": {
                u.ref: str(u.reason) for u in outcome.result.unpaired if u.subject == "request"
            },
        },
    )
