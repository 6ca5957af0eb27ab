"""The peers' figures of one training batch, from verl's ``old_log_probs`` and vLLM's
``rollout_log_probs``: over the whole batch, per response, and per position.

Kept apart from the writing (``token_mismatch``) because this is the part whose numbers must equal
verl's own: it works on the valid tokens only, packed row-major, which is exactly the vector verl's
``torch.masked_select`` builds, so the batch figures are verl's own ops on verl's own values and the
per-response figures are segment reductions over the same vector. A handful of whole-batch tensor
ops and one ``tolist()`` per array: no per-token Python loop, and never a write to its inputs.

Nothing here imports torch at import time (the hooks module is imported by every trainer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from verl_consistency.contracts.token_records import DEFAULT_THRESHOLD, Figures


@dataclass(frozen=True)
class TokenFigures:
    """What :func:`compute` returns for one batch."""

    batch: Figures
    """The figures over all the batch's valid tokens (next to what verl logged)."""
    per_response: list[Figures]
    """The same figures per response (row), in batch order."""
    first_above: list[int | None]
    """Per response, the first position whose ``|Δ log p|`` exceeds the threshold (None: none does)."""
    abs_diff: Any
    """The per-position ``|Δ log p|`` matrix (float32 tensor, NaN where masked)."""


@dataclass(frozen=True)
class _Packed:
    """The valid tokens of a batch, packed row-major (verl's ``masked_select`` order), and the
    per-token quantities every figure is made of."""

    n_rows: int
    width: int
    rows: Any
    cols: Any
    counts: Any
    """Valid tokens per row."""
    po: Any
    """exp(old), the training engine's probabilities."""
    pr: Any
    """exp(rollout), vLLM's."""
    d: Any
    """old - rollout."""
    pd: Any
    """|exp(old) - exp(rollout)|."""
    ad: Any
    """|old - rollout|."""
    mult: Any
    """exp(|old - rollout|)."""
    k3: Any
    """exp(d) - d - 1."""

    @property
    def n(self) -> int:
        return int(self.d.numel())


def compute(
    old_log_probs: Any, rollout_log_probs: Any, mask: Any, *, thresh: float = DEFAULT_THRESHOLD
) -> TokenFigures:
    """The batch figures, the per-response figures, the first position above ``thresh``, and the
    per-position ``|Δ log p|`` matrix. Pure: never writes to its inputs."""
    import torch

    p = _pack(old_log_probs, rollout_log_probs, mask)
    batch = _batch_figures(p)
    per, row_abs_diff = _response_figures(p)
    if p.n:
        batch.abs_diff = _finite(float(row_abs_diff[p.counts > 0].mean().item()))
    per_pos = torch.full((p.n_rows, p.width), float("nan"))
    per_pos[p.rows, p.cols] = p.ad
    return TokenFigures(batch, per, _first_above(p, thresh), per_pos)


def spans(mask: Any) -> list[int]:
    """Per row, the last valid position + 1: the span of ``|Δ log p|`` a record keeps."""
    import torch

    m = mask.detach().bool()
    if not m.numel():
        return [0] * int(m.shape[0])
    rows, cols = m.nonzero(as_tuple=True)
    out = torch.zeros(int(m.shape[0]), dtype=torch.long)
    out.scatter_reduce_(0, rows, cols + 1, reduce="amax")
    return [int(x) for x in out.tolist()]


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _pack(old_log_probs: Any, rollout_log_probs: Any, mask: Any) -> _Packed:
    import torch

    old = old_log_probs.detach().float()
    roll = rollout_log_probs.detach().float()
    m = mask.detach().bool()
    if not (old.shape == roll.shape == m.shape):
        raise ValueError(
            f"old_log_probs {tuple(old.shape)}, rollout_log_probs {tuple(roll.shape)} and the response "
            f"mask {tuple(m.shape)} must have one shape"
        )
    n_rows = int(m.shape[0])
    rows, cols = m.nonzero(as_tuple=True)
    counts = torch.bincount(rows, minlength=n_rows) if rows.numel() else torch.zeros(n_rows, dtype=torch.long)
    o, r = old[rows, cols], roll[rows, cols]
    po, pr, d = torch.exp(o), torch.exp(r), o - r
    ad = torch.abs(d)
    pd, mult, k3 = torch.abs(po - pr), torch.exp(ad), torch.exp(d) - d - 1
    return _Packed(n_rows, int(m.shape[1]), rows, cols, counts, po, pr, d, pd, ad, mult, k3)


def _batch_figures(p: _Packed) -> Figures:
    """The batch, with the very ops verl uses on the same ``masked_select`` vector."""
    import torch

    if not p.n:
        return Figures(tokens=0)
    pd, ad = p.pd, p.ad
    stats = torch.stack(
        [
            pd.max(),
            pd.mean(),
            pd.std(),
            torch.corrcoef(torch.stack([p.po, p.pr], dim=0))[0][1],
            ad.max(),
            p.mult.mean(),
            (-p.d).mean(),
            p.k3.mean(),
        ]
    ).tolist()
    return Figures(
        tokens=p.n,
        probs_diff_max=_finite(stats[0]),
        probs_diff_mean=_finite(stats[1]),
        probs_diff_std=_finite(stats[2]),
        pearson_corr=_finite(stats[3]),
        max_abs_diff=_finite(stats[4]),
        token_mult_prob_error=_finite(stats[5]),
        kl=_finite(stats[6]),
        k3_kl=_finite(stats[7]),
    )


def _response_figures(p: _Packed) -> tuple[list[Figures], Any]:
    """Per response: segment reductions over the packed vector (a row's tokens are contiguous).
    Also the per-response mean ``|Δ log p|`` tensor, of which the batch's ``abs_diff`` is the mean."""
    import torch

    def seg(x: Any, how: str = "sum") -> Any:
        if not p.n:
            return torch.zeros(p.n_rows)
        return torch.segment_reduce(x, how, lengths=p.counts)

    rows, counts, pd, ad = p.rows, p.counts, p.pd, p.ad
    nr = counts.clamp(min=1).float()
    pd_mean = seg(pd) / nr
    xo, xr = p.po - (seg(p.po) / nr)[rows], p.pr - (seg(p.pr) / nr)[rows]
    corr = seg(xo * xr) / torch.sqrt(seg(xo * xo) * seg(xr * xr))
    pd_var = seg((pd - pd_mean[rows]) ** 2) / (counts - 1).float()
    row_ad = seg(ad) / nr
    columns = [
        counts.float(),
        seg(pd, "max"),
        pd_mean,
        torch.sqrt(pd_var),
        corr,
        row_ad,
        seg(p.mult) / nr,
        seg(-p.d) / nr,
        seg(p.k3) / nr,
        seg(ad, "max"),
    ]
    return [_row_figures(row) for row in torch.stack(columns, dim=1).tolist()], row_ad


def _row_figures(row: list[float]) -> Figures:
    """One response's figures from its row of :func:`_response_figures`' columns; std and
    correlation are undefined for a single token."""
    n = int(row[0])
    if n == 0:
        return Figures(tokens=0)
    return Figures(
        tokens=n,
        probs_diff_max=_finite(row[1]),
        probs_diff_mean=_finite(row[2]),
        probs_diff_std=_finite(row[3]) if n > 1 else None,
        pearson_corr=_finite(row[4]) if n > 1 else None,
        abs_diff=_finite(row[5]),
        token_mult_prob_error=_finite(row[6]),
        kl=_finite(row[7]),
        k3_kl=_finite(row[8]),
        max_abs_diff=_finite(row[9]),
    )


def _first_above(p: _Packed, thresh: float) -> list[int | None]:
    """Per row, the first position whose ``|Δ log p|`` exceeds ``thresh``: one scatter, no loop."""
    import torch

    above = p.ad > thresh
    first = torch.full((p.n_rows,), -1, dtype=torch.long)
    if bool(above.any()):
        big = torch.full((p.n_rows,), p.width, dtype=torch.long)
        big.scatter_reduce_(0, p.rows[above], p.cols[above], reduce="amin")
        first = torch.where(big < p.width, big, first)
    return [None if f < 0 else int(f) for f in first.tolist()]
