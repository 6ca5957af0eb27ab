"""Per step and per response, from the token records: what the report's per-step table and
``results/token/responses.csv`` show.

A step's figure is the mean |Δ log p| over all its valid response tokens, the figure published
work reports (:data:`PUBLISHED_MEAN_ABS`); a response's is its own mean and its worst token, with
the token's position (where along the response the engines parted).

In the async modes a step trains on responses generated with older weights, and a partial-rollout
resume after a weight sync generates the rest of a response with newer ones
(``rollout_weight_versions``/``rollout_version_offsets`` of the token records). verl's old log-probs
of step ``s`` ran weights ``s - 1``, so for such a response |Δ log p| holds the optimizer's steps as
well as the engines' gap. Such a response is *stale* (:func:`stale_from`): it is counted apart
(``stale_responses``, ``stale_mean_abs_diff``), and the step's mean and worst token are those of the
responses that one set of weights, the step's own, made end to end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from verl_consistency.contracts import token_records as tm
from verl_consistency.contracts.atomic import write_text_atomic

PUBLISHED_MEAN_ABS = 0.011
"""Mean |Δ log p| over response tokens that published work reports for bf16 vLLM against FSDP on
GPUs (Qwen3-4B; 0.014-0.18 on Ascend 910B depending on the weight conversion, vime #275): the
reference the report prints next to each step's mean. A reference, not a bound: it depends on the
model, the kernels and the response length."""


class TokenStep(BaseModel):
    """One training step's responses: the mean |Δ log p| over all their valid tokens (the figure
    published work reports per step, :data:`PUBLISHED_MEAN_ABS`) and the worst token."""

    model_config = ConfigDict(extra="forbid")
    global_step: int
    responses: int
    tokens: int
    mean_abs_diff: float | None
    max_abs_diff: float | None = None
    worst_request_id: str | None = None
    worst_position: int | None = None
    stale_responses: int = 0
    """Responses some of whose tokens other weights than the step's made (:func:`stale_from`)."""
    stale_mean_abs_diff: float | None = None
    """Their mean |Δ log p| over their valid tokens: the engines' gap plus the weights' change."""


def stale_from(rec: tm.TokenRecord) -> int | None:
    """The first response position another set of weights than the step's own made (None: none, or
    unknown). The step's own are ``global_step - 1``, what its old-log-prob forward ran."""
    versions, offsets = rec.rollout_weight_versions, rec.rollout_version_offsets
    if not versions or not offsets or len(versions) != len(offsets):
        return None
    own = rec.global_step - 1
    for v, off in zip(versions, offsets, strict=True):
        if v is not None and v != own:
            return off
    return None


def weights_text(rec: tm.TokenRecord) -> str:
    """A response's rollout weights in a cell: ``3``, or ``3→4@2`` (a resume at position 2 ran 4)."""
    versions, offsets = rec.rollout_weight_versions, rec.rollout_version_offsets
    if not versions or not offsets:
        return ""
    parts = [str(versions[0])]
    parts += [f"→{v}@{off}" for v, off in zip(versions[1:], offsets[1:], strict=False)]
    return "".join(parts)


def _mean(recs: Sequence[tm.TokenRecord], idx: Sequence[int]) -> tuple[float | None, int]:
    """Mean |Δ log p| over the responses' valid tokens (each response's mean weighted by its tokens)."""
    weighted = [(recs[i].abs_diff, recs[i].tokens) for i in idx if recs[i].abs_diff is not None]
    tokens = sum(n for _, n in weighted)
    return (sum(v * n for v, n in weighted) / tokens if tokens else None), tokens


def argmax(row: Sequence[float | None]) -> int | None:
    """Position of the largest |Δ log p| of one response (the first of equals); None when empty."""
    best: int | None = None
    for i, v in enumerate(row):
        if v is not None and math.isfinite(v) and (best is None or v > (row[best] or 0.0)):
            best = i
    return best


def per_step(
    recs: Sequence[tm.TokenRecord], worst_at: Sequence[int | None], steps: Sequence[tm.StepRecord] = ()
) -> list[TokenStep]:
    """Each step's mean |Δ log p| over every valid response token (each response's mean weighted by
    its valid tokens) and its worst token. A step with batch figures only (no per-response record
    of it) takes the batch's ``abs_diff``, which is the same mean over the same tokens."""
    by_step: dict[int, list[int]] = {}
    for i, r in enumerate(recs):
        by_step.setdefault(r.global_step, []).append(i)
    out: dict[int, TokenStep] = {}
    is_stale = [stale_from(r) is not None for r in recs]
    for step, every in by_step.items():
        stale = [i for i in every if is_stale[i]]
        idx = [i for i in every if not is_stale[i]]
        mean, _ = _mean(recs, idx)
        worst = (
            max(idx, key=lambda i: recs[i].max_abs_diff if recs[i].max_abs_diff is not None else -1.0)
            if idx
            else None
        )
        out[step] = TokenStep(
            global_step=step,
            responses=len(every),
            tokens=sum(recs[i].tokens for i in every),
            mean_abs_diff=mean,
            max_abs_diff=recs[worst].max_abs_diff if worst is not None else None,
            worst_request_id=recs[worst].request_id if worst is not None else None,
            worst_position=worst_at[worst] if worst is not None else None,
            stale_responses=len(stale),
            stale_mean_abs_diff=_mean(recs, stale)[0],
        )
    for s in steps:
        if s.global_step not in out:
            out[s.global_step] = TokenStep(
                global_step=s.global_step,
                responses=s.responses,
                tokens=s.tokens,
                mean_abs_diff=s.abs_diff,
                max_abs_diff=s.max_abs_diff,
            )
    return [out[k] for k in sorted(out)]


def write_responses_csv(
    path: Path, recs: Sequence[tm.TokenRecord], worst_at: Sequence[int | None], pair_of: dict[str, str]
) -> None:
    """One row per response, in step order: what the report's top table shows, for all of them."""
    import csv
    import io

    fields = (
        "global_step",
        "request_id",
        "index",
        "response_length",
        "tokens",
        "mean_abs_diff",
        "max_abs_diff",
        "worst_position",
        "first_above",
        "pair_id",
        "rollout_weights",
        "stale_from",
    )
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(fields)
    for i in sorted(range(len(recs)), key=lambda i: (recs[i].global_step, recs[i].sample)):
        r = recs[i]
        w.writerow(
            [
                r.global_step,
                r.request_id or "",
                "" if r.index is None else r.index,
                r.response_length,
                r.tokens,
                "" if r.abs_diff is None else repr(r.abs_diff),
                "" if r.max_abs_diff is None else repr(r.max_abs_diff),
                "" if worst_at[i] is None else worst_at[i],
                "" if r.first_above is None else r.first_above,
                pair_of.get(r.request_id or "", ""),
                weights_text(r),
                "" if (at := stale_from(r)) is None else at,
            ]
        )
    write_text_atomic(path, buf.getvalue())
