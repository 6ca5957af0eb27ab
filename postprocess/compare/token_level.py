"""The token-level view of a run, next to the layer view: which requests drift, where, and how much.

Inputs (all optional; written by ``hooks/training/token_mismatch.py`` and ``hooks/training/next_token.py``):

* ``<run>/token_mismatch.jsonl`` (+ ``token_mismatch.f16``): one record per response of every
  training step where verl had both vLLM's and its own log-probs (``--token-level`` runs, or any
  run with ``VERL_CONSISTENCY_TOKEN_LEVEL=1`` and ``rollout.calculate_log_probs=true``);
* ``<run>/token_mismatch_steps.jsonl``: the batch figures next to verl's own logged values;
* ``<run>/actor/<pid>/next_token.jsonl``: in a PROMPTS_ONLY collection run, one record per dumped
  training micro batch: vLLM's sampled next token after the prompt, its log-prob there, and the
  training forward's log-prob of the same token at the same position (the one-token records).

:func:`attach_output_rows` adds the last row of every pair (the next-token prediction) and makes
a pair whose predictions differ ``diverged`` whatever its module rows say. :func:`build_section`
reads the rest, copies the files into the bundle's ``results/token/`` and writes
``results/capture-these.txt`` for ``verl-consistency run ... --capture prompts:FILE``.
:func:`token_report` does all of it for a bare run folder (a triage run has no pairs).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from verl_consistency.contracts import token_records as tm
from verl_consistency.contracts.atomic import write_text_atomic
from verl_consistency.postprocess.compare.token_steps import (
    TokenStep,
    argmax,
    per_step,
    write_responses_csv,
)
from verl_consistency.postprocess.compare.verdict import JUDGED_RANK, OutputRow, PairComparison
from verl_consistency.postprocess.pairing.pair_types import Pair

OUTPUT_HEALTHY_ABS = 0.05
"""|Δ log p| of the next token at or below which the output row is ``ok`` (bf16 engines differ by ~1e-2)."""
OUTPUT_DIVERGED_ABS = tm.DEFAULT_THRESHOLD
"""Above this the two engines predict different distributions: the pair is ``diverged``."""
HEAD_HEALTHY_ABS = OUTPUT_HEALTHY_ABS
"""The same bounds for ``topk_max_abs_diff`` (the worst |Δ log p| over vLLM's top-k), because any
token of the top-k could have been the sampled one, and then the output row would have judged it by
these bounds. So a pair whose sampled token agrees but whose distribution moved elsewhere in the
top-k is flagged as if vLLM had sampled the moved token. No separate bound for ``topk_tv``: with
every top-k |Δ log p| ≤ a, the top-k TV is at most 0.5 * (e^a - 1) (0.026 at 0.05, 0.053 at 0.1),
so a TV bound would flag nothing these do not; the TV is shown for what it says about sampling."""
HEAD_DIVERGED_ABS = OUTPUT_DIVERGED_ABS
"""See :data:`HEAD_HEALTHY_ABS`. A different top-1 is at least ``warn`` (greedy decoding would
differ; with every top-k |Δ log p| small that is a near-tie flipped), and ``diverged`` when
training's argmax is not in vLLM's top-k at all: training puts first a token vLLM ranks below k."""

TOKEN_DIR = "token"
RESPONSES_CSV = "responses.csv"
"""Every response's figures (``results/token/responses.csv``): the report lists the worst only."""
CAPTURE_THESE = "capture-these.txt"
TOP_N = 20
CAPTURE_N = 8


M = TypeVar("M", bound=BaseModel)


class BadLine(BaseModel):
    file: str
    line: int
    error: str


def read_models(path: Path, model: type[M], bad: list[BadLine]) -> list[M]:
    """Each line of the JSONL file ``path`` as a ``model``; a line that does not validate goes to
    ``bad`` (file, line, the error's first line) and is skipped; an unreadable file reads as empty."""
    out: list[M] = []
    try:
        raw = path.read_bytes()
    except OSError:
        return out
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(model.model_validate(orjson.loads(line)))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            bad.append(BadLine(file=str(path), line=n, error=str(exc).splitlines()[0]))
    return out


def next_token_records(run_dir: Path, bad: list[BadLine] | None = None) -> list[tm.NextTokenRecord]:
    bad = [] if bad is None else bad
    recs: list[tm.NextTokenRecord] = []
    for path in sorted((run_dir / "actor").glob(f"*/{tm.NEXT_TOKEN_LOG}")):
        recs += read_models(path, tm.NextTokenRecord, bad)
    return recs


def output_status(abs_diff: float, rec: tm.NextTokenRecord | None = None) -> str:
    """The sampled token's |Δ log p| against the bounds; with ``rec``'s head figures, the worst of
    that and the head's (:data:`HEAD_HEALTHY_ABS`, :data:`HEAD_DIVERGED_ABS`)."""

    def by_abs(x: float, healthy: float, diverged: float) -> str:
        if not math.isfinite(x) or x > diverged:
            return "diverged"
        return "ok" if x <= healthy else "warn"

    found = [by_abs(abs_diff, OUTPUT_HEALTHY_ABS, OUTPUT_DIVERGED_ABS)]
    if rec is not None and rec.topk_max_abs_diff is not None:
        found.append(by_abs(rec.topk_max_abs_diff, HEAD_HEALTHY_ABS, HEAD_DIVERGED_ABS))
    if rec is not None and rec.top1_same is False:
        in_topk = any(t == rec.train_argmax for t, _ in rec.rollout_topk or [])
        found.append("warn" if in_topk else "diverged")
    return max(found, key=JUDGED_RANK.__getitem__)


def output_row(rec: tm.NextTokenRecord) -> OutputRow:
    status = output_status(rec.abs_diff, rec)
    notes = []
    if rec.train_argmax != rec.token:
        notes.append(f"vLLM sampled {rec.token}; training's most likely next token is {rec.train_argmax}")
    if rec.rollout_topk and rec.top1_same is False:
        vllm_top = max(rec.rollout_topk, key=lambda x: x[1])[0]
        notes.append(f"top-1 differs: vLLM {vllm_top}, training {rec.train_argmax}")
    return OutputRow(
        token=rec.token,
        rollout_log_prob=rec.rollout_log_prob,
        train_log_prob=rec.train_log_prob,
        abs_diff=rec.abs_diff,
        train_argmax=rec.train_argmax,
        status=status,  # type: ignore[arg-type]
        note="; ".join(notes),
        topk=len(rec.rollout_topk) if rec.rollout_topk else None,
        topk_max_abs_diff=rec.topk_max_abs_diff,
        topk_tv=rec.topk_tv,
        top1_same=rec.top1_same,
    )


def attach_output_rows(
    run_dir: Path, pairs: Sequence[Pair], comparisons: Sequence[PairComparison]
) -> list[PairComparison]:
    """Each pair's output row, joined on the training side's step folder (log_prob phase first).

    A pair whose output row diverged is ``diverged``, even when every module row is green.
    """
    # a micro batch of several requests (lanes) has one record per request: key by the id too
    by_dir: dict[tuple[str, int, str], tm.NextTokenRecord] = {}
    for rec in next_token_records(run_dir):
        key = (rec.dump_path or "", rec.step, rec.request_id or "")
        if key not in by_dir or rec.phase == "log_prob":
            by_dir[key] = rec
    pair_by_id = {p.pair_id: p for p in pairs}
    out: list[PairComparison] = []
    for c in comparisons:
        p = pair_by_id.get(c.pair_id)
        rec = None
        if p is not None:
            for (dump_path, step, rid), r in by_dir.items():
                if (
                    p.actor.step == step
                    and p.actor.dir.startswith(f"{dump_path}/step{step}/")
                    and rid in ("", p.request_id)
                ):
                    rec = r
                    break
        if rec is None:
            out.append(c)
            continue
        row = output_row(rec)
        update: dict[str, object] = {"output": row}
        if c.status == "ok":
            if row.status == "diverged":
                update["verdict"] = "diverged"
            elif row.status == "warn" and c.verdict == "healthy":
                update["verdict"] = "suspicious"
        out.append(c.model_copy(update=update))
    return out


class TopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: str | None
    index: object = None
    uid: str | None = None
    global_step: int
    response_length: int
    abs_diff: float | None
    max_abs_diff: float | None
    token_mult_prob_error: float | None
    k3_kl: float | None
    first_above: int | None
    pair_id: str | None = None
    prompt: str | None = None
    """The prompt's text, from the run's prompt set (``data/train.parquet``) by its index."""
    worst_position: int | None = None
    """Response position of the worst token (``max_abs_diff``); None when the record kept no
    per-position values."""


class TokenSection(BaseModel):
    """What the report's token-level section shows (and the bundle keeps under ``results/token/``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    responses: int = 0
    steps: list[tm.StepRecord] = []
    quantiles: dict[str, float] = {}
    """Distribution of the per-response mean |Δ log p| (slime's figure per response)."""
    histogram: list[tuple[str, int]] = []
    """Per-response mean |Δ log p| in decades: (label, responses)."""
    over_threshold: int = 0
    threshold: float = tm.DEFAULT_THRESHOLD
    position_mean: list[tuple[int, float]] = []
    """(first position of the bucket, mean |Δ log p| over every valid token there)."""
    per_step: list[TokenStep] = []
    """Per training step (``global_step``), in step order."""
    top: list[TopRequest] = []
    next_tokens: list[tm.NextTokenRecord] = []
    capture_file: str | None = None
    bad_lines: list[BadLine] = []

    @property
    def empty(self) -> bool:
        return not self.responses and not self.next_tokens


def decades(values: Sequence[float], low: int = -6, high: int = 1) -> list[tuple[str, int]]:
    """Counts per decade of ``values`` (≤1e-6 and ≥10 folded into the ends)."""
    counts = [0] * (high - low)
    for v in values:
        e = math.floor(math.log10(v)) if v > 0 else low
        counts[min(max(e, low), high - 1) - low] += 1
    labels = [f"1e{low + i}" for i in range(len(counts))]
    labels[0] = f"<1e{low + 1}"
    return list(zip(labels, counts, strict=True))


def _quantile(sorted_values: list[float], q: float) -> float:
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


def build_section(
    run_dir: Path, results: Path | None = None, pairs: Sequence[Pair] = (), *, buckets: int = 40
) -> TokenSection:
    """Read the token files of ``run_dir``; with ``results``, copy them there and write the capture
    file and ``token/responses.csv``."""
    bad: list[BadLine] = []
    recs = read_models(run_dir / tm.TOKEN_LOG, tm.TokenRecord, bad)
    steps = read_models(run_dir / tm.STEP_LOG, tm.StepRecord, bad)
    nexts = next_token_records(run_dir, bad)
    section = TokenSection(responses=len(recs), steps=steps, next_tokens=nexts, bad_lines=bad)
    rows = [tm.read_side(run_dir, r) for r in recs]
    worst_at = [argmax(row) for row in rows]
    section.per_step = per_step(recs, worst_at, steps)
    pair_of = {p.request_id: p.pair_id for p in pairs}
    if recs:
        section.threshold = recs[0].threshold
        means = sorted(r.abs_diff for r in recs if r.abs_diff is not None)
        if means:
            section.quantiles = {
                q: _quantile(means, v) for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
            }
        section.histogram = decades(means)
        section.over_threshold = sum(r.first_above is not None for r in recs)
        section.position_mean = _position_profile(rows, buckets)
        texts = prompt_texts(run_dir)
        order = sorted(range(len(recs)), key=lambda i: -(recs[i].max_abs_diff or 0.0))[:TOP_N]
        section.top = [
            _top_request(recs[i], worst_at[i], pair_of, texts.get(str(recs[i].index))) for i in order
        ]
    if results is not None and not section.empty:
        _copy_records(run_dir, results / TOKEN_DIR)
        if recs:
            write_responses_csv(results / TOKEN_DIR / RESPONSES_CSV, recs, worst_at, pair_of)
        if section.top:
            write_text_atomic(results / CAPTURE_THESE, capture_these(section))
            section.capture_file = CAPTURE_THESE
    return section


def _top_request(
    r: tm.TokenRecord, worst_position: int | None, pair_of: dict[str, str], prompt: str | None
) -> TopRequest:
    return TopRequest(
        request_id=r.request_id,
        index=r.index,
        uid=r.uid,
        global_step=r.global_step,
        response_length=r.response_length,
        abs_diff=r.abs_diff,
        max_abs_diff=r.max_abs_diff,
        token_mult_prob_error=r.token_mult_prob_error,
        k3_kl=r.k3_kl,
        first_above=r.first_above,
        pair_id=pair_of.get(r.request_id or ""),
        prompt=prompt if r.index is not None else None,
        worst_position=worst_position,
    )


def _copy_records(run_dir: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in (tm.TOKEN_LOG, tm.STEP_LOG, tm.SIDE_FILE):
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, dest / name)
    for path in sorted((run_dir / "actor").glob(f"*/{tm.NEXT_TOKEN_LOG}")):
        shutil.copyfile(path, dest / f"{path.parent.name}-{tm.NEXT_TOKEN_LOG}")


def prompt_texts(run_dir: Path, limit: int = 160) -> dict[str, str]:
    """Index -> the prompt's text, when the run folder holds its prompt set (the generated one does).

    The token records carry no token ids, so no tokenizer is needed: the text is the dataset's own
    (``extra_info.question``, else the last chat message). Empty when unreadable.
    """
    path = run_dir / "data" / "train.parquet"
    if not path.is_file():
        return {}
    try:
        import pyarrow.parquet as pq

        rows = pq.read_table(str(path), columns=["prompt", "extra_info"]).to_pylist()
    except Exception:
        return {}
    out: dict[str, str] = {}
    for n, row in enumerate(rows):
        extra = row.get("extra_info") or {}
        text = extra.get("question")
        if not text and row.get("prompt"):
            text = str(row["prompt"][-1].get("content", ""))
        index = extra.get("index", n)
        if text:
            out[str(index)] = text if len(text) <= limit else text[: limit - 1] + "…"
    return out


def _position_profile(rows: Sequence[Sequence[float | None]], buckets: int) -> list[tuple[int, float]]:
    import numpy as np

    longest = max((len(x) for x in rows), default=0)
    if not longest:
        return []
    width = max(1, math.ceil(longest / buckets))
    total = np.zeros(longest)
    count = np.zeros(longest)
    for row in rows:
        arr = np.array([np.nan if v is None else v for v in row], dtype=np.float64)
        ok = ~np.isnan(arr)
        total[: len(arr)][ok] += arr[ok]
        count[: len(arr)][ok] += 1
    out = []
    for start in range(0, longest, width):
        n = count[start : start + width].sum()
        if n:
            out.append((start, float(total[start : start + width].sum() / n)))
    return out


def capture_these(section: TokenSection) -> str:
    """The file ``--capture prompts:FILE`` reads: one prompt per line, worst first.

    It lists the prompts of the responses with a token above the threshold (``first_above``), or,
    when none has one, the largest. Each line names the prompt by its dataset index
    (``index:N``, stable across runs of the same prompt set) and, after ``#``, the request that
    showed it, for people.
    """
    lines = [
        "# verl-consistency capture file: the prompts of the most drifting requests, worst first.",
        "# Use: verl-consistency run <mode> --capture prompts:<this file> ...",
        "# One prompt per line: index:<dataset index> or uid:<verl uid>; text after # is ignored.",
    ]
    drifted = [t for t in section.top if t.first_above is not None]
    if not drifted:
        lines.append(f"# no response has a token above |dlogp| {section.threshold:g}; the largest follow")
    seen: set[str] = set()
    for t in drifted or section.top:
        if t.index is not None:
            key = f"index:{t.index}"
        elif t.uid is not None:
            key = f"uid:{t.uid}"
        else:
            continue
        if key in seen:
            continue
        seen.add(key)
        lines.append(
            f"{key}  # request {t.request_id} step {t.global_step}: max |dlogp| {t.max_abs_diff:.3g}, "
            f"first above {section.threshold:g} at {t.first_above}"
        )
        if len(seen) >= CAPTURE_N:
            break
    return "\n".join(lines) + "\n"


def token_report(run_dir: Path, out_dir: Path) -> TokenSection:
    """A bare run folder's token view: ``out_dir/token/``, ``capture-these.txt`` and ``token.md``."""
    section = build_section(run_dir, out_dir)
    write_text_atomic(out_dir / "token.md", summary_md(section))
    return section


def summary_md(section: TokenSection) -> str:
    from verl_consistency.postprocess.output.report import render_token_md

    return render_token_md(section)
