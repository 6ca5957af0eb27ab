"""Render the comparison as one self-contained ``report.html`` and a ``summary.md`` beside it.

The HTML has no external assets (inline CSS, hand-built SVG) so it opens from inside a downloaded
bundle, offline, and survives being mailed around. Charts are drawn here rather than with
matplotlib: they are a log-scale line and a grid of coloured cells, and building their SVG
directly keeps the postprocess image free of a plotting stack.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape

from verl_consistency.contracts.atomic import write_text_atomic
from verl_consistency.contracts.run_manifest import StepMetrics
from verl_consistency.postprocess.compare.token_steps import PUBLISHED_MEAN_ABS, TokenStep
from verl_consistency.postprocess.compare.verdict import (
    DIVERGED_COSINE,
    DIVERGED_REL_ERR,
    DIVERGED_REL_ERR_TENSOR,
    HEALTHY_COSINE,
    HEALTHY_REL_ERR,
    HEALTHY_REL_ERR_TENSOR,
    STRUCTURAL,
    PairComparison,
    judge,
    rel_bounds,
)
from verl_consistency.postprocess.output import per_step
from verl_consistency.postprocess.output.step_chart import step_chart_svg
from verl_consistency.postprocess.output.weight_rows import WeightSummary
from verl_consistency.postprocess.pairing.pair_types import Pair, Unpaired, UnpairedReason
from verl_consistency.postprocess.pairing.reasons import MEANING

REPORT_HTML = "report.html"
SUMMARY_MD = "summary.md"

_LOG_MIN, _LOG_MAX = -8.0, 1.0
"""The plots' y range: log10 relative error from 1e-8 (fp32 rounding) to 10."""

_UNPAIRED_ROWS = 200
"""Unpaired items listed one by one (all are counted)."""


@dataclass(frozen=True)
class _Cell:
    label: str
    value: float | None
    color: str
    title: str


def _fmt(v: float | None, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if v == 0:
        return "0"
    return (
        f"{v:.{digits}e}" if abs(v) < 1e-3 or abs(v) >= 1e3 else f"{v:.{digits + 2}f}".rstrip("0").rstrip(".")
    )


_STATUS_COLOR = {"no_metric": "#e5e7eb", "diverged": "#dc2626", "warn": "#f59e0b"}
"""A cell's colour is its row status (:func:`verdict.judge`, where the thresholds live)."""


def _color(rel: float | None, cos: float | None = None) -> str:
    status = judge(rel, cos)
    if status != "ok":
        return _STATUS_COLOR[status]
    if rel is not None and rel > 0:
        # Healthy: a lighter green the closer it is to the threshold.
        healthy = rel_bounds(cos)[0]
        frac = max(0.0, min(1.0, (math.log10(rel) - _LOG_MIN) / (math.log10(healthy) - _LOG_MIN)))
        g = int(0xA3 + (0xE6 - 0xA3) * frac)
        return f"#16{g:02x}4a" if frac < 0.5 else f"#4a{g:02x}80"
    return "#16a34a"


def _y(rel: float | None, height: float, top: float) -> float:
    v = _LOG_MIN if rel is None or rel <= 0 else max(_LOG_MIN, min(_LOG_MAX, math.log10(rel)))
    return top + (_LOG_MAX - v) / (_LOG_MAX - _LOG_MIN) * height


def layer_plot_svg(comp: PairComparison, width: int = 560, height: int = 220) -> str:
    """Relative error (log scale) against layer, with the healthy and diverged thresholds."""
    left, right, top, bottom = 56, 12, 12, 36
    w, h = width - left - right, height - top - bottom
    prof = comp.layer_profile
    n = max(len(prof), 1)
    xs = [left + (i + 0.5) * w / n for i in range(len(prof))]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="relative error by layer, {comp.pair_id}">',
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#d1d5db"/>',
    ]
    for e in range(int(_LOG_MIN), int(_LOG_MAX) + 1, 2):
        y = _y(10.0**e, h, top)
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="ax">1e{e}</text>')
    healthy, diverged = (
        (HEALTHY_REL_ERR_TENSOR, DIVERGED_REL_ERR_TENSOR)
        if comp.task == "tensor"
        else (HEALTHY_REL_ERR, DIVERGED_REL_ERR)
    )
    for thr, col, name in (
        (healthy, "#f59e0b", "healthy ≤"),
        (diverged, "#dc2626", "diverged >"),
    ):
        y = _y(thr, h, top)
        parts.append(
            f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="{col}" '
            'stroke-dasharray="4 3"/>'
            f'<text x="{left + w - 4}" y="{y - 3:.1f}" text-anchor="end" class="ax" fill="{col}">'
            f"{name} {_fmt(thr)}</text>"
        )
    pts = [(x, _y(p.rel_err, h, top)) for x, p in zip(xs, prof, strict=True) if p.rel_err is not None]
    if len(pts) > 1:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#2563eb" stroke-width="2"/>')
    for x, p in zip(xs, prof, strict=True):
        if p.rel_err is not None:
            y = _y(p.rel_err, h, top)
            parts.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{_color(p.rel_err, p.cosine)}" '
                'stroke="#1f2937">'
                f"<title>layer {p.label}: rel err {_fmt(p.rel_err)} at {p.module}</title></circle>"
            )
        parts.append(f'<text x="{x:.1f}" y="{top + h + 16}" text-anchor="middle" class="ax">{p.label}</text>')
    parts.append(f'<text x="{left + w / 2}" y="{height - 4}" text-anchor="middle" class="ax">layer</text>')
    parts.append("</svg>")
    return "".join(parts)


def heatmap_svg(comparisons: Sequence[PairComparison]) -> str:
    """Pairs (rows) × layers (columns), each cell the layer's worst relative error."""
    ok = [c for c in comparisons if c.status == "ok" and c.layer_profile]
    if not ok:
        return "<p>No compared pair to show.</p>"
    labels: dict[str, int] = {}
    for c in ok:
        for p in c.layer_profile:
            labels.setdefault(p.label, p.order)
    cols = sorted(labels, key=lambda k: labels[k])
    cw, ch, left, top = 56, 26, 300, 28
    width, height = left + cw * len(cols) + 8, top + ch * len(ok) + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="heat" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="pairs by layers heatmap">'
    ]
    for j, lab in enumerate(cols):
        x = left + j * cw + cw / 2
        parts.append(f'<text x="{x}" y="{top - 8}" text-anchor="middle" class="ax">{lab}</text>')
    for i, c in enumerate(ok):
        y = top + i * ch
        name = c.pair_id if len(c.pair_id) <= 44 else c.pair_id[:20] + "…" + c.pair_id[-20:]
        parts.append(f'<text x="{left - 8}" y="{y + ch / 2 + 4}" text-anchor="end" class="ax">{name}</text>')
        by = {p.label: p for p in c.layer_profile}
        for j, lab in enumerate(cols):
            p = by.get(lab)
            rel, cos = (p.rel_err, p.cosine) if p else (None, None)
            x = left + j * cw
            parts.append(
                f'<rect x="{x + 1}" y="{y + 1}" width="{cw - 2}" height="{ch - 2}" fill="{_color(rel, cos)}">'
                f"<title>{c.pair_id} layer {lab}: rel err {_fmt(rel)}"
                f"{'' if cos is None else f', cosine {cos:.6f}'}</title></rect>"
                f'<text x="{x + cw / 2}" y="{y + ch / 2 + 4}" text-anchor="middle" class="cell">'
                f"{_fmt(rel, 1)}</text>"
            )
    parts.append("</svg>")
    return "".join(parts)


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("verl_consistency.postprocess.output", "templates"),
        autoescape=select_autoescape(enabled_extensions=("html.j2",), default=False),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = _fmt
    env.filters["code_spans"] = _code_spans
    env.filters["versions"] = versions_text
    return env


def versions_text(versions: list[int]) -> str:
    """A step's rollout versions in a cell: ``–``, ``3``, ``2, 3`` or ``0–3`` (a run of four or more)."""
    if not versions:
        return "–"
    if len(versions) >= 4 and versions[-1] - versions[0] == len(versions) - 1:
        return f"{versions[0]}–{versions[-1]}"
    return ", ".join(map(str, versions))


def _code_spans(text: str) -> Markup:
    """A reason's meaning in HTML: escaped, its `backticked` names as <code>."""
    return Markup(re.sub(r"`([^`]*)`", r"<code>\1</code>", str(escape(text))))


def _meaning(reason: str) -> str:
    """What an unpaired reason means (``pairing/reasons.py``), '' for one this version does not know."""
    try:
        return MEANING[UnpairedReason(reason)]
    except ValueError:
        return ""


def _context(
    run_id: str,
    pairs: Sequence[Pair],
    unpaired: Sequence[Unpaired],
    comparisons: Sequence[PairComparison],
    unpaired_counts: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, object]:
    by_id = {p.pair_id: p for p in pairs}
    reasons: Counter[str] = Counter()
    if unpaired_counts:
        for by_reason in unpaired_counts.values():
            reasons.update(dict(by_reason))
    else:
        reasons.update(u.reason.value for u in unpaired)
    ok = [c for c in comparisons if c.status == "ok"]
    verdicts = Counter(c.verdict for c in comparisons)
    first = Counter(c.first_divergence for c in ok if c.first_divergence)
    overall = (
        "failed"
        if comparisons and not ok
        else "diverged"
        if verdicts["diverged"]
        else "suspicious"
        if verdicts["suspicious"]
        else "healthy"
        if ok
        else "nothing compared"
    )
    return {
        "run_id": run_id,
        "pairs": pairs,
        "by_id": by_id,
        "comparisons": comparisons,
        "ok": ok,
        "failed": [c for c in comparisons if c.status == "failed"],
        "verdicts": verdicts,
        "overall": overall,
        "common_first": first.most_common(1)[0] if first else None,
        "reasons": [(r, n, _meaning(r)) for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])],
        "unpaired": list(unpaired)[:_UNPAIRED_ROWS],
        "unpaired_total": max(len(unpaired), sum(reasons.values())),
        "any_statistics": any(c.task == "statistics" for c in ok),
        "any_tensor": any(c.task == "tensor" for c in ok),
        "structural": [(p.pattern, ", ".join(sorted(k)), why) for p, k, why in STRUCTURAL],
        "thr": {
            "healthy_rel": HEALTHY_REL_ERR,
            "diverged_rel": DIVERGED_REL_ERR,
            "healthy_rel_tensor": HEALTHY_REL_ERR_TENSOR,
            "diverged_rel_tensor": DIVERGED_REL_ERR_TENSOR,
            "healthy_cos": HEALTHY_COSINE,
            "diverged_cos": DIVERGED_COSINE,
        },
        "plots": {c.pair_id: layer_plot_svg(c) for c in ok},
        "heatmap": heatmap_svg(comparisons),
        "color": _color,
    }


def position_svg(points: Sequence[tuple[int, float]], width: int = 560, height: int = 180) -> str:
    """Mean |Δ log p| against response position (linear axes; mismatch often grows along a response)."""
    if not points:
        return "<p>No per-token values.</p>"
    left, top, bottom = 56, 12, 28
    xmax = max(p for p, _ in points) or 1
    ymax = max(v for _, v in points) or 1.0
    w, h = width - left - 8, height - top - bottom

    def xy(p: int, v: float) -> str:
        return f"{left + w * p / xmax:.1f},{top + h * (1 - v / ymax):.1f}"

    line = " ".join(xy(p, v) for p, v in points)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pos" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="mismatch by position">'
        f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#9ca3af"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#9ca3af"/>'
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" class="ax">{_fmt(ymax)}</text>'
        f'<text x="{left - 4}" y="{top + h}" text-anchor="end" class="ax">0</text>'
        f'<text x="{left + w}" y="{height - 8}" text-anchor="end" class="ax">position {xmax}</text>'
        f'<polyline fill="none" stroke="#2563eb" stroke-width="1.5" points="{line}"/></svg>'
    )


def histogram_svg(bins: Sequence[tuple[str, int]], width: int = 560, height: int = 150) -> str:
    """Responses per decade of their mean |Δ log p| (a bar per decade, labelled by its lower edge)."""
    if not bins or not any(n for _, n in bins):
        return ""
    top, bottom = 14, 24
    peak = max(n for _, n in bins)
    bw = (width - 16) / len(bins)
    h = height - top - bottom
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="hist" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="per-request mismatch histogram">'
    ]
    for i, (label, n) in enumerate(bins):
        bh = h * n / peak
        x = 8 + i * bw
        parts.append(
            f'<rect x="{x + 2:.1f}" y="{top + h - bh:.1f}" width="{bw - 4:.1f}" height="{bh:.1f}" '
            f'fill="#60a5fa"><title>{n} responses with mean |Δ log p| in [{label}, ×10)</title></rect>'
            f'<text x="{x + bw / 2:.1f}" y="{height - 8}" text-anchor="middle" class="ax">{label}</text>'
            f'<text x="{x + bw / 2:.1f}" y="{top + h - bh - 2:.1f}" text-anchor="middle" '
            f'class="cell">{n}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def render_token_md(section: object) -> str:
    """The token-level section as Markdown (also ``token.md`` of a bare triage run)."""
    return (
        _env().get_template("token.md.j2").render(token=section, fmt=_fmt, published_mean=PUBLISHED_MEAN_ABS)
    )


@dataclass(frozen=True)
class Sections:
    """The report's optional sections, each shown only when its run wrote it.

    ``token``: the token-level view (``token_level.TokenSection``), "Token-level view" and the
    output rows; ``check``: a check run's ``batch_variance.CheckSummary``, "Engine gap and batch
    variance"; ``run_steps``: ``run.json``'s ``steps`` (verl's metrics per step), in "Per training
    step"; ``weights``: the per-tensor weight check per sync (``weight_section``), "Weight syncs".
    Kept apart from the pairing and its comparisons, which every report has."""

    token: object | None = None
    check: object | None = None
    run_steps: Sequence[StepMetrics] = ()
    weights: WeightSummary | None = None


def write_report(
    out_dir: Path,
    *,
    run_id: str,
    pairs: Sequence[Pair],
    unpaired: Sequence[Unpaired],
    comparisons: Sequence[PairComparison],
    unpaired_counts: Mapping[str, Mapping[str, int]] | None = None,
    sections: Sections | None = None,
) -> tuple[Path, Path]:
    """Write ``report.html``, ``summary.md`` and ``summary.json`` into ``out_dir`` (atomically;
    reruns overwrite).

    ``unpaired`` is the listed detail; ``unpaired_counts`` (subject → reason → n), when given, is
    the full tally, which also holds the reasons counted in bulk (decode steps, multi-request steps).
    """
    sections = sections or Sections()
    token, check = sections.token, sections.check
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = _env()
    ctx = _context(run_id, pairs, unpaired, comparisons, unpaired_counts)
    ctx["token"] = token if token is not None and not getattr(token, "empty", True) else None
    ctx["position_svg"] = position_svg(getattr(token, "position_mean", [])) if ctx["token"] else ""
    ctx["histogram_svg"] = histogram_svg(getattr(token, "histogram", [])) if ctx["token"] else ""
    ctx["check"] = check
    summary = _run_summary(ctx, pairs, comparisons, getattr(ctx["token"], "per_step", []), sections.run_steps)
    summary.weights = sections.weights
    ctx["summary"] = summary
    ctx["step_chart"] = step_chart_svg(summary.per_step)
    ctx["step_label"] = per_step.label
    ctx["published_mean"] = PUBLISHED_MEAN_ABS
    html, md = out_dir / REPORT_HTML, out_dir / SUMMARY_MD
    write_text_atomic(html, env.get_template("report.html.j2").render(**ctx))
    write_text_atomic(md, env.get_template("summary.md.j2").render(**ctx))
    write_text_atomic(out_dir / per_step.SUMMARY_JSON, summary.model_dump_json(indent=1) + "\n")
    return html, md


def _run_summary(
    ctx: Mapping[str, object],
    pairs: Sequence[Pair],
    comparisons: Sequence[PairComparison],
    token_steps: Sequence[TokenStep],
    run_steps: Sequence[StepMetrics],
) -> per_step.RunSummary:
    """``summary.json``: the headline figures and the per-step rows the report shows."""
    rows, note = per_step.build(pairs, comparisons, token_steps, run_steps)
    return per_step.RunSummary(
        run_id=str(ctx["run_id"]),
        overall=str(ctx["overall"]),
        pairs=len(pairs),
        compared=sum(c.status == "ok" for c in comparisons),
        verdicts=per_step.VerdictCounts.of(comparisons),
        per_step=rows,
        per_step_note=note,
        drift=per_step.drift_line(rows),
    )
