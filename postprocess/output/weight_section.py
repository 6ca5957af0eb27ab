"""The weight check beside the layer view, per sync version (issue 42): report, summary and CSV.

A row per version says what the tensors showed (``compare/weight_check.py``) and what the
activations of the pairs computed at those weights showed (their verdicts and first divergent
block), because each view catches what the other cannot:

* a tensor that differs while the layer view stays healthy: an error the next layers hide (a
  small scale, a rarely used row), or a version no dumped request ran;
* a diverged layer view with every tensor identical: the kernels differ, not the weights.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from verl_consistency.contracts.atomic import write_text_atomic
from verl_consistency.postprocess.compare.verdict import PairComparison
from verl_consistency.postprocess.compare.weight_check import WeightCheck
from verl_consistency.postprocess.output import per_step
from verl_consistency.postprocess.output.weight_rows import TensorRow, WeightSummary, WeightVersionRow
from verl_consistency.postprocess.pairing.pair_types import Pair

WEIGHTS_CSV = "weights.csv"


def build(
    check: WeightCheck, pairs: Sequence[Pair], comparisons: Sequence[PairComparison]
) -> WeightSummary | None:
    """The rows, or None when the run wrote no weight records."""
    if not check.present:
        return None
    by_pair = {c.pair_id: c for c in comparisons}
    rows: list[WeightVersionRow] = []
    for v in check.versions:
        mine = [by_pair[p.pair_id] for p in pairs if p.weight_version == v.version and p.pair_id in by_pair]
        diverged = [c for c in mine if c.verdict == "diverged"]
        block, _module, _n = per_step.first_divergence(diverged)
        rows.append(
            WeightVersionRow(
                version=v.version,
                exported=v.exported,
                compared=v.compared,
                not_checked=len(v.not_checked),
                differing=[
                    TensorRow(
                        tensor=d.tensor,
                        kind=d.kind,
                        detail=d.detail,
                        worker=d.worker,
                        first_version=check.first_version.get(d.tensor),
                    )
                    for d in v.diffs
                ],
                pairs=len(mine),
                diverged_pairs=len(diverged),
                first_divergence=block,
                fingerprint_s=v.fingerprint_s,
            )
        )
    names = list(dict.fromkeys(d.tensor for d in check.differing))
    return WeightSummary(versions=rows, differing_tensors=names, verdict=_verdict(rows, names, check))


def _verdict(rows: list[WeightVersionRow], names: list[str], check: WeightCheck) -> str:
    if not rows:
        return "no sync had both a trainer export and a vLLM record"
    if not names:
        return f"all {len(rows)} syncs exact: vLLM holds every tensor as the trainer sent it"
    first = names[0]
    kinds = sorted({t.kind for r in rows for t in r.differing if t.tensor == first})
    more = f" (+{len(names) - 1} more tensors)" if len(names) > 1 else ""
    return f"{first} {'/'.join(kinds)} from version {check.first_version.get(first)}{more}"


def csv_text(summary: WeightSummary) -> str:
    """``weights.csv``: one row per differing tensor per version and worker."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["version", "tensor", "kind", "first_version", "worker", "detail"])
    for r in summary.versions:
        for t in r.differing:
            w.writerow([r.version, t.tensor, t.kind, t.first_version, t.worker, t.detail])
    return out.getvalue()


def write(results: Path, summary: WeightSummary) -> None:
    write_text_atomic(results / WEIGHTS_CSV, csv_text(summary))
