"""The per-step chart of ``report.html``: three small panels over the training steps, built as
inline SVG like the report's other plots (no script, no external asset: it opens offline).

From top to bottom: the pairs of each step by verdict (stacked bars), the step's worst relative
error (log scale, with the healthy and diverged bounds), and the step's mean |Δ log p| over its
response tokens (log scale, with the published bf16 reference). A fault that appears once the
weights move is a green bar turning red and the error line stepping over the red bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from verl_consistency.postprocess.compare.token_steps import PUBLISHED_MEAN_ABS
from verl_consistency.postprocess.compare.verdict import (
    DIVERGED_REL_ERR,
    DIVERGED_REL_ERR_TENSOR,
    HEALTHY_REL_ERR,
    HEALTHY_REL_ERR_TENSOR,
)
from verl_consistency.postprocess.output.per_step import StepSummary

VERDICT_COLORS = (
    ("healthy", "#16a34a"),
    ("suspicious", "#f59e0b"),
    ("diverged", "#dc2626"),
    ("failed", "#6b7280"),
)
_LEFT, _RIGHT, _TOP, _PANEL, _GAP = 64, 12, 16, 70, 24
"""Margins, the height of a panel and the gap above each (its title sits there)."""


def _fmt(v: float) -> str:
    return f"{v:.2g}" if 1e-3 <= abs(v) < 1e3 else f"{v:.1e}"


def _log_range(values: Sequence[float], marks: Sequence[float]) -> tuple[float, float]:
    """Whole decades around the values and the reference lines (``marks`` is never empty)."""
    logs = [math.log10(v) for v in [*values, *marks] if v > 0]
    lo, hi = math.floor(min(logs)), math.ceil(max(logs))
    return lo, hi if hi > lo else lo + 1


class _Panel:
    """One panel: its top, and the x of each step."""

    def __init__(self, top: float, xs: list[float], width: float) -> None:
        self.top, self.xs, self.width = top, xs, width

    def frame(self, title: str) -> str:
        return (
            f'<rect x="{_LEFT}" y="{self.top}" width="{self.width}" height="{_PANEL}" fill="#fafafa" '
            f'stroke="#d1d5db"/><text x="{_LEFT}" y="{self.top - 4}" class="ax">{title}</text>'
        )

    def log_y(self, v: float, lo: float, hi: float) -> float:
        t = (min(max(math.log10(v), lo), hi) - lo) / (hi - lo)
        return self.top + _PANEL * (1 - t)

    def hline(self, y: float, color: str, text: str) -> str:
        return (
            f'<line x1="{_LEFT}" x2="{_LEFT + self.width}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" '
            f'stroke-dasharray="4 3"/><text x="{_LEFT + self.width - 4}" y="{y - 3:.1f}" text-anchor="end" '
            f'class="ax" fill="{color}">{text}</text>'
        )

    def log_series(self, values: list[float | None], lo: float, hi: float, color: str, what: str) -> str:
        pts = [(x, self.log_y(v, lo, hi), v) for x, v in zip(self.xs, values, strict=True) if v and v > 0]
        out = [
            f'<text x="{_LEFT - 6}" y="{self.top + 10}" text-anchor="end" class="ax">1e{hi:.0f}</text>'
            f'<text x="{_LEFT - 6}" y="{self.top + _PANEL}" text-anchor="end" class="ax">1e{lo:.0f}</text>'
        ]
        if len(pts) > 1:
            line = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in pts)
            out.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}">'
            f"<title>{what} {_fmt(v)}</title></circle>"
            for x, y, v in pts
        ]
        return "".join(out)


def _bars(panel: _Panel, rows: Sequence[StepSummary], bar: float) -> str:
    peak = max((r.pairs for r in rows), default=0)
    out = [f'<text x="{_LEFT - 6}" y="{panel.top + 10}" text-anchor="end" class="ax">{peak}</text>']
    for x, r in zip(panel.xs, rows, strict=True):
        y = panel.top + _PANEL
        for name, color in VERDICT_COLORS:
            n = getattr(r.verdicts, name)
            if not n:
                continue
            h = _PANEL * 0.85 * n / peak
            y -= h
            out.append(
                f'<rect x="{x - bar / 2:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{color}">'
                f"<title>step {r.global_step}: {n} {name}</title></rect>"
            )
    return "".join(out)


def step_chart_svg(rows: Sequence[StepSummary], width: int = 640) -> str:
    """The chart of the rows with a global step; '' when there are none (nothing to draw)."""
    rows = [r for r in rows if r.global_step is not None]
    if not rows:
        return ""
    w = width - _LEFT - _RIGHT
    step_w = w / len(rows)
    xs = [_LEFT + (i + 0.5) * step_w for i in range(len(rows))]
    height = _TOP + 3 * _PANEL + 2 * _GAP + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="steps" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" '
        'aria-label="verdicts, relative error and token mismatch by step">'
    ]
    bars = _Panel(_TOP, xs, w)
    parts += [bars.frame("pairs by verdict"), _bars(bars, rows, min(28.0, step_w * 0.6))]

    err = _Panel(_TOP + _PANEL + _GAP, xs, w)
    parts.append(err.frame("worst relative error"))
    rels = [r.worst_rel_err for r in rows]
    tensor = any(r.worst_task == "tensor" for r in rows)
    healthy, diverged = (
        (HEALTHY_REL_ERR_TENSOR, DIVERGED_REL_ERR_TENSOR) if tensor else (HEALTHY_REL_ERR, DIVERGED_REL_ERR)
    )
    lo, hi = _log_range([v for v in rels if v], [healthy, diverged])
    parts.append(err.hline(err.log_y(healthy, lo, hi), "#f59e0b", f"healthy ≤ {_fmt(healthy)}"))
    parts.append(err.hline(err.log_y(diverged, lo, hi), "#dc2626", f"diverged &gt; {_fmt(diverged)}"))
    parts.append(err.log_series(rels, lo, hi, "#2563eb", "worst relative error"))

    tok = _Panel(_TOP + 2 * (_PANEL + _GAP), xs, w)
    parts.append(tok.frame("mean |Δ log p| over response tokens"))
    means = [r.mean_abs_logp_diff for r in rows]
    lo, hi = _log_range([v for v in means if v], [PUBLISHED_MEAN_ABS])
    parts.append(
        tok.hline(tok.log_y(PUBLISHED_MEAN_ABS, lo, hi), "#6b7280", f"published bf16 ≈ {PUBLISHED_MEAN_ABS}")
    )
    parts.append(tok.log_series(means, lo, hi, "#7c3aed", "mean |Δ log p|"))

    axis_y = tok.top + _PANEL + 14
    every = max(1, math.ceil(len(rows) / 20))
    for i, (x, r) in enumerate(zip(xs, rows, strict=True)):
        if i % every == 0 or i == len(rows) - 1:
            parts.append(
                f'<text x="{x:.1f}" y="{axis_y}" text-anchor="middle" class="ax">{r.global_step}</text>'
            )
    parts.append(
        f'<text x="{_LEFT + w / 2}" y="{height - 2}" text-anchor="middle" class="ax">training step</text>'
    )
    parts.append("</svg>")
    return "".join(parts)
