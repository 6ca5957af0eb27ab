"""A check run's **batch variance**: vLLM batched against vLLM alone, per prompt, with msprobe.

``verl-consistency check`` runs every prompt twice in vLLM (all at once, then each alone) and
once in the training engine under the alone pass's request ids (``patches/contracts/check_run.py``).
The unchanged pairing pairs alone with training (the **engine gap**); the batched requests hold
no training micro batch and end unpaired. This module compares each prompt's batched dump
(msprobe's target) against its alone dump (the golden side) the same way, so the report can
show per request and per module whether a log-prob gap comes from the engines disagreeing
(engine gap) or from vLLM disagreeing with itself depending on what else is in the batch (batch
variance: kernels that are not batch-invariant).

Nothing is parsed twice: the dumps are found by the pairing's own rules on what it read
(:func:`.pairing.rollout_dump`), compared by :func:`.compare.compare_pairs` with msprobe's plain
compare (both sides have vLLM's names; see ``compare_one``'s ``consistent_check``), and judged by
:mod:`.verdict` with the engine gap's thresholds and structural rows, so the two columns of the
report read alike. Results go to ``results/batch_variance/<id>/``, as ``results/compare/<pair_id>/``;
:func:`summarise` joins both comparisons per prompt and per module into ``results/check.json``.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from verl_consistency.contracts.atomic import write_text_atomic
from verl_consistency.contracts.check_run import CheckPrompt, CheckRun
from verl_consistency.postprocess.compare.verdict import JUDGED_RANK, PairComparison, RowDiff, Verdict
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.pair import PairingResult, rollout_dump
from verl_consistency.postprocess.pairing.pair_types import DumpRef, Pair, UnpairedReason
from verl_consistency.postprocess.pairing.request_match import safe_id, unique_id

BATCH_VARIANCE_DIR = "batch_variance"
"""Per-prompt results live in ``results/batch_variance/<id>/`` (as compare's ``compare/<pair_id>/``)."""
CHECK_SUMMARY = "check.json"
"""``results/check.json``: both comparisons per prompt and per module (:class:`CheckSummary`)."""

R = UnpairedReason
Outcome = Verdict | Literal["not_compared"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptVariance(_Model):
    """One prompt's batch variance: its batched dump (target) against its alone dump (golden)."""

    id: str = Field(
        description="file-name safe: <alone request id>.r<rank> (the results folder's name) when compared"
    )
    index: int = Field(description="the prompt's position in check.json")
    prompt_tokens: int
    batched_request_id: str
    alone_request_id: str
    rank: int | None = Field(default=None, description="the rollout rank compared (the lowest both hold)")
    batched: DumpRef | None = None
    alone: DumpRef | None = None
    verdict: Outcome = "not_compared"
    reason: UnpairedReason | None = Field(
        default=None, description="why the prompt was not compared (the pairing's reason for that request)"
    )
    detail: str = ""
    first_divergence: str | None = None
    worst_row: RowDiff | None = None
    max_rel_err: float | None = None
    comparison: PairComparison | None = Field(
        default=None, description="compare's record; its file paths are relative to results_dir"
    )


def plan(result: PairingResult, check: CheckRun) -> tuple[list[PromptVariance], list[Pair]]:
    """Each prompt's two rollout dumps, found by the pairing's rules: the prompts (those that
    cannot be compared carry a ``reason``) and the pairs to compare (batched as ``actor``, the
    target; alone as ``rollout``, the golden side)."""
    out: list[PromptVariance] = []
    pairs: list[Pair] = []
    used: set[str] = set()
    for p in check.prompts:
        base = PromptVariance(
            id=safe_id(p.alone_request_id) or "prompt",
            index=p.index,
            prompt_tokens=p.prompt_tokens,
            batched_request_id=p.batched_request_id,
            alone_request_id=p.alone_request_id,
        )
        entry, pair = _plan_one(result, p, base, used)
        out.append(entry)
        if pair is not None:
            pairs.append(pair)
    return out, pairs


def _plan_one(
    result: PairingResult, p: CheckPrompt, base: PromptVariance, used: set[str]
) -> tuple[PromptVariance, Pair | None]:
    batched = rollout_dump(result, p.batched_request_id)
    alone = rollout_dump(result, p.alone_request_id)
    for side, found in (("batched", batched), ("alone", alone)):
        if found.reason is not None:
            return base.model_copy(
                update={
                    "reason": found.reason,
                    "detail": f"{side} request {found.request_id}: {found.detail}",
                }
            ), None
    common = sorted(set(batched.by_rank) & set(alone.by_rank))
    if not common:
        ranks = f"batched on rank(s) {sorted(batched.by_rank)}, alone on {sorted(alone.by_rank)}"
        detail = f"{ranks}: no rank in common"
        return base.model_copy(update={"reason": R.TP_SHARDING_MISMATCH, "detail": detail}), None
    rank = common[0]
    b, a = batched.by_rank[rank].dump_ref(), alone.by_rank[rank].dump_ref()
    id_ = unique_id(f"{base.id}.r{rank}", used)  # the rank, as in a pair id
    entry = base.model_copy(update={"id": id_, "rank": rank, "batched": b, "alone": a})
    for ref in (b, a):
        try:
            discover.read_dump_json(result.roots.to_real(ref.dir) / "dump.json")
        except discover.DumpError as exc:
            return entry.model_copy(update={"reason": R.DUMP_UNREADABLE, "detail": f"{ref.dir}: {exc}"}), None
    pair = Pair(
        pair_id=entry.id,
        request_id=p.alone_request_id,
        vllm_request_id=batched.by_rank[rank].vllm_id,
        rollout=a,
        actor=b,
        backend="fsdp",  # unused: the plain compare maps no training names
        prompt_tokens=p.prompt_tokens,
        scoped=batched.by_rank[rank].scoped,
    )
    return entry, pair


def compare(
    run_view: Path,
    entries: list[PromptVariance],
    pairs: list[Pair],
    results: Path,
    *,
    jobs: int = 2,
    on_done: Callable[[PairComparison], None] | None = None,
) -> list[PromptVariance]:
    """msprobe's plain compare of every planned pair, judged by :mod:`.verdict`; ``entries`` with
    their verdicts. Raises ``ImportError`` when compare is not installed."""
    from verl_consistency.postprocess.compare.msprobe_compare import compare_pairs

    comps = compare_pairs(
        run_view,
        pairs,
        results,
        jobs=jobs,
        on_done=on_done,
        folder=BATCH_VARIANCE_DIR,
        consistent_check=False,
    )
    by_id = {c.pair_id: c for c in comps}
    out = []
    for e in entries:
        c = by_id.get(e.id)
        if c is None:
            out.append(e)
            continue
        out.append(
            e.model_copy(
                update={
                    "verdict": c.verdict,
                    "first_divergence": c.first_divergence,
                    "worst_row": c.worst_rows[0] if c.worst_rows else None,
                    "max_rel_err": c.max_rel_err,
                    "comparison": c,
                }
            )
        )
    return out


# --- the summary: both comparisons side by side ------------------------------------------------


class Side(_Model):
    """One comparison of one prompt, as the report's per-request table shows it."""

    id: str | None = Field(default=None, description="the pair id (engine gap) or batch-variance id")
    verdict: Outcome | Literal["not_paired"] = "not_paired"
    reason: str | None = None
    max_rel_err: float | None = Field(
        default=None, description="the largest relative error of a module output"
    )
    worst_module: str | None = None
    first_divergence: str | None = None
    rows_csv: str | None = Field(default=None, description="results-relative path of the judged rows")


class CheckRequest(_Model):
    index: int
    prompt_tokens: int
    alone_request_id: str
    batched_request_id: str
    engine_gap: Side
    batch_variance: Side


class ModuleRow(_Model):
    """One vLLM module output, both comparisons' worst relative error over the prompts."""

    module: str
    layer: int | None
    engine_gap_rel_err: float | None = None
    engine_gap_status: str | None = None
    engine_gap_index: int | None = Field(default=None, description="the prompt with that error")
    batch_variance_rel_err: float | None = None
    batch_variance_status: str | None = None
    batch_variance_index: int | None = None


class CheckSummary(_Model):
    """``results/check.json``: what the report's "Engine gap and batch variance" section shows."""

    kind: Literal["check"] = "check"
    model: str
    training_model: str
    device: str
    dtype: str
    requests: list[CheckRequest]
    modules: list[ModuleRow]


def summarise(
    check: CheckRun,
    result: PairingResult,
    comparisons: Sequence[PairComparison],
    variance: Sequence[PromptVariance],
    results: Path,
) -> CheckSummary:
    """Join the engine gap (the pair of each alone id, its lowest rollout rank) and the batch
    variance per prompt, and their judged module-output rows per module (worst over prompts)."""
    comp_by_pair = {c.pair_id: c for c in comparisons}
    unpaired = {u.ref: u for u in result.unpaired if u.subject == "request"}
    pair_of: dict[str, Pair] = {}
    for pair in sorted(result.pairs, key=lambda p: p.rollout.rank):
        pair_of.setdefault(pair.request_id, pair)
    by_index = {v.index: v for v in variance}
    requests: list[CheckRequest] = []
    modules: dict[str, ModuleRow] = {}
    for p in check.prompts:
        pair = pair_of.get(p.alone_request_id)
        gap = Side(
            reason=unpaired[p.alone_request_id].reason.value if p.alone_request_id in unpaired else None
        )
        if pair is not None:
            gap = _side(pair.pair_id, comp_by_pair.get(pair.pair_id))
            _fold(modules, results, gap.rows_csv, p.index, "engine_gap")
        v = by_index.get(p.index)
        var = Side(verdict="not_compared", reason=v.reason.value if v and v.reason else None)
        if v is not None and v.reason is None:
            var = _side(v.id, v.comparison)
            _fold(modules, results, var.rows_csv, p.index, "batch_variance")
        requests.append(
            CheckRequest(
                index=p.index,
                prompt_tokens=p.prompt_tokens,
                alone_request_id=p.alone_request_id,
                batched_request_id=p.batched_request_id,
                engine_gap=gap,
                batch_variance=var,
            )
        )
    return CheckSummary(
        model=check.model,
        training_model=check.training_model,
        device=check.device,
        dtype=check.dtype,
        requests=requests,
        modules=list(modules.values()),
    )


def _side(id_: str, c: PairComparison | None) -> Side:
    if c is None:
        return Side(id=id_, verdict="not_compared")
    worst = c.worst_rows[0].module if c.worst_rows else None
    return Side(
        id=id_,
        verdict=c.verdict,
        reason=c.error if c.status == "failed" else None,
        max_rel_err=c.max_rel_err,
        worst_module=worst,
        first_divergence=c.first_divergence,
        rows_csv=c.rows_csv,
    )


def _fold(
    modules: dict[str, ModuleRow],
    results: Path,
    rows_csv: str | None,
    index: int,
    which: Literal["engine_gap", "batch_variance"],
) -> None:
    """Fold one comparison's judged module-output rows into ``modules`` (first seen, forward
    order), keeping each module's worst relative error over the prompts."""
    if rows_csv is None or not (results / rows_csv).is_file():
        return
    with (results / rows_csv).open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["kind"] != "output" or row["status"] not in JUDGED_RANK or not row["rel_err"]:
                continue
            module, rel, status = row["module"], float(row["rel_err"]), row["status"]
            m = modules.get(module)
            if m is None:
                layer = row["layer"]  # verdict's, from the module path (empty outside the layers)
                m = modules[module] = ModuleRow(module=module, layer=int(layer) if layer else None)
            cur = getattr(m, f"{which}_rel_err")
            if cur is None or rel > cur:
                setattr(m, f"{which}_rel_err", rel)
                setattr(m, f"{which}_index", index)
            if JUDGED_RANK[status] >= JUDGED_RANK[getattr(m, f"{which}_status") or "ok"]:
                setattr(m, f"{which}_status", status)


def write_summary(results: Path, summary: CheckSummary) -> Path:
    path = results / CHECK_SUMMARY
    write_text_atomic(path, summary.model_dump_json(indent=1))
    return path
