"""The run per training step: how the pairs' verdicts, their worst relative error, the token
mismatch and verl's own metrics change as the weights move (issue 35).

Under RL the weights change every step, and a fault that only shows once they have moved (a
tensor the weight sync forgets, a lost dtype cast) looks like this: the first step healthy, every
later one diverged at the same module. One line per step makes that visible at a glance; the
report draws it (``report.html``, "Per training step") and ``summary.json`` keeps it
(:class:`RunSummary`'s ``per_step``).

Steps and versions (verl 0.9.1, ``ray_trainer.py`` ``fit``): the trainer syncs the initial
weights as version 0 (``update_weights(0)``) before its first step, then runs global step
``s = 1, 2, ...`` (rollout, log_prob, update_actor) and syncs at its end as version ``s``. So the
rollout and the log_prob forward of global step ``s`` both run version ``s - 1``
(:func:`global_step_of`). A pair's version is its records' ``weight_version``
(:attr:`Pair.weight_version`); the token records and ``run.json``'s ``steps`` carry the global
step itself.

In the async modes a step trains on requests generated with older weights, and the dumped forward
of such a request runs again at its rollout's weights (``patches/hooks/training/older_weights.py``):
the pair's ``weight_version`` is then the rollout's and its ``trainer_weight_version`` the step's. A pair is
counted in the step that trained it (:func:`training_version`), and each row says which rollout
versions its pairs came from and the staleness between them (``rollout_versions``,
``max_staleness``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from verl_consistency.contracts.run_manifest import StepMetrics
from verl_consistency.postprocess.compare.token_steps import PUBLISHED_MEAN_ABS, TokenStep
from verl_consistency.postprocess.compare.verdict import PairComparison, Verdict
from verl_consistency.postprocess.output.weight_rows import WeightSummary
from verl_consistency.postprocess.pairing.pair_types import Pair

SUMMARY_JSON = "summary.json"

NO_VERSION_NOTE = (
    "no pair's records carry a weight_version (logs written before weight versions, or the "
    "recipe's format): which weights a pair ran is unknown, so its pairs are one group"
)
"""Why a run's pairs are one group, not one per step (shown in the report and the summary)."""

_BLOCK = re.compile(r"(?:^|\.)(layers\.\d+(?:\.[A-Za-z_][A-Za-z0-9_]*)?)")


def global_step_of(version: int) -> int:
    """The global step whose rollout and log_prob forward ran weights ``version`` (see above)."""
    return version + 1


def training_version(p: Pair) -> int | None:
    """The weights of the training step a pair belongs to: the step's own, also when its forward ran
    the rollout's older ones."""
    return p.trainer_weight_version if p.trainer_weight_version is not None else p.weight_version


def block_of(module: str) -> str:
    """The decoder block a module belongs to, the unit a fault is named by: ``layers.2.mlp``
    for ``model.layers.2.mlp.down_proj``; outside the layers the module without ``model.``."""
    found = _BLOCK.search(module)
    if found:
        return found.group(1)
    return module.removeprefix("model.")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VerdictCounts(_Model):
    healthy: int = 0
    suspicious: int = 0
    diverged: int = 0
    failed: int = 0

    @classmethod
    def of(cls, comparisons: Sequence[PairComparison]) -> VerdictCounts:
        n = Counter(c.verdict for c in comparisons)
        return cls(
            healthy=n["healthy"], suspicious=n["suspicious"], diverged=n["diverged"], failed=n["failed"]
        )

    @property
    def worst(self) -> Verdict | None:
        for v in ("diverged", "suspicious", "failed", "healthy"):
            if getattr(self, v):
                return v  # type: ignore[return-value]
        return None


class StepSummary(_Model):
    """One training step (or, in a run without weight versions, all its pairs)."""

    global_step: int | None = Field(
        description="verl's global step; None for the pairs whose weights are unknown (no weight_version)"
    )
    weight_version: int | None = Field(
        default=None, description="the weights the step's log_prob forward ran (global_step - 1)"
    )
    rollout_versions: list[int] = Field(
        default_factory=list,
        description="the weight versions the step's paired requests were generated with (== weight_version "
        "in hybrid; older in the async modes, where each pair's forward ran its rollout's weights)",
    )
    max_staleness: int | None = Field(
        default=None, description="weight_version minus the oldest of rollout_versions (None without pairs)"
    )
    pairs: int = 0
    verdicts: VerdictCounts = Field(default_factory=VerdictCounts)
    worst_rel_err: float | None = Field(
        default=None, description="the largest of the step's pairs' max_rel_err (module outputs)"
    )
    worst_rel_err_pair: str | None = None
    worst_task: Literal["statistics", "tensor"] | None = Field(
        default=None, description="the task of that pair: its thresholds apply to worst_rel_err"
    )
    first_divergence: str | None = Field(
        default=None,
        description="the block (layers.N.mlp, layers.N.self_attn, embed_tokens, ...) most of the step's "
        "diverged pairs first diverge in; 'output' when they diverged at the output row only",
    )
    first_divergence_module: str | None = Field(
        default=None, description="the module most of those pairs name, within that block"
    )
    first_divergence_pairs: int = Field(default=0, description="how many diverged pairs name that block")
    responses: int = 0
    tokens: int = 0
    mean_abs_logp_diff: float | None = Field(
        default=None, description="mean |Δ log p| over the step's valid response tokens (token records)"
    )
    max_abs_logp_diff: float | None = Field(default=None, description="the step's worst token")
    stale_responses: int = Field(
        default=0,
        description="responses of the step some of whose tokens older weights made (async modes): kept out "
        "of mean_abs_logp_diff and max_abs_logp_diff (compare/token_steps.py)",
    )
    stale_mean_abs_logp_diff: float | None = Field(
        default=None, description="their mean |Δ log p|: the engines' gap plus the weights' change"
    )
    worst_token_request_id: str | None = None
    worst_token_position: int | None = None
    grad_norm: float | None = Field(default=None, description="run.json steps: actor/grad_norm")
    reward_mean: float | None = Field(default=None, description="run.json steps: reward mean")
    not_finite: list[str] = Field(default_factory=list, description="run.json: metrics logged NaN or inf")


class RunSummary(_Model):
    """``results/summary.json``: the report's verdicts and its per-step table, for machines."""

    summary_version: Literal[1] = 1
    run_id: str
    overall: str
    pairs: int
    compared: int
    verdicts: VerdictCounts
    per_step: list[StepSummary]
    per_step_note: str | None = Field(default=None, description="why the pairs are not grouped by step")
    drift: str = Field(
        description="the per-step verdicts in one line, e.g. "
        "'step 1: healthy · step 2+: diverged at layers.2.mlp'"
    )
    published_mean_abs_logp_diff: float = PUBLISHED_MEAN_ABS
    weights: WeightSummary | None = Field(
        default=None,
        description="the per-tensor weight check per sync version (absent without weight records)",
    )


def read_steps(run_json: Mapping[str, Any] | None, warnings: list[str] | None = None) -> list[StepMetrics]:
    """``run.json``'s ``steps``; an entry that does not read is left out with a warning naming it."""
    raw = (run_json or {}).get("steps") or []
    out: list[StepMetrics] = []
    if not isinstance(raw, list):
        if warnings is not None:
            warnings.append("run.json: 'steps' is not a list; the per-step table shows no verl metrics")
        return out
    for n, item in enumerate(raw):
        try:
            out.append(StepMetrics.model_validate(item))
        except ValidationError as exc:
            if warnings is not None:
                warnings.append(f"run.json: steps[{n}] unreadable, left out ({str(exc).splitlines()[0]})")
    return out


def first_divergence(diverged: Sequence[PairComparison]) -> tuple[str | None, str | None, int]:
    """(block, module, pairs naming that block) most of ``diverged`` name first; Nones for none."""
    names: list[tuple[str, str]] = []
    for c in diverged:
        if c.first_divergence:
            names.append((block_of(c.first_divergence), c.first_divergence))
        elif c.output is not None and c.output.status == "diverged":
            names.append(("output", "output"))
    if not names:
        return None, None, 0
    block, n = Counter(b for b, _ in names).most_common(1)[0]
    module = Counter(m for b, m in names if b == block).most_common(1)[0][0]
    return block, module, n


def _pairs_row(
    step: int | None, version: int | None, comps: Sequence[PairComparison], rollout: Sequence[int] = ()
) -> StepSummary:
    ok = [c for c in comps if c.status == "ok" and c.max_rel_err is not None]
    worst = max(ok, key=lambda c: c.max_rel_err or 0.0) if ok else None
    block, module, n = first_divergence([c for c in comps if c.verdict == "diverged"])
    rollout_versions = sorted(set(rollout))
    stale = version - rollout_versions[0] if version is not None and rollout_versions else None
    return StepSummary(
        global_step=step,
        weight_version=version,
        rollout_versions=rollout_versions,
        max_staleness=stale,
        pairs=len(comps),
        verdicts=VerdictCounts.of(comps),
        worst_rel_err=worst.max_rel_err if worst else None,
        worst_rel_err_pair=worst.pair_id if worst else None,
        worst_task=worst.task if worst else None,  # type: ignore[arg-type]
        first_divergence=block,
        first_divergence_module=module,
        first_divergence_pairs=n,
    )


def build(
    pairs: Sequence[Pair],
    comparisons: Sequence[PairComparison],
    token_steps: Sequence[TokenStep] = (),
    run_steps: Sequence[StepMetrics] = (),
) -> tuple[list[StepSummary], str | None]:
    """One row per global step seen anywhere (a pair's version, a token record, ``run.json``),
    in step order; first, when some pairs carry no version, one row of those (``global_step``
    None). Returns the rows and, when no pair carries a version, why they are one group."""
    pair_of = {p.pair_id: p for p in pairs}
    by_step: dict[int | None, list[PairComparison]] = {}
    rollout_of: dict[int | None, list[int]] = {}
    for c in comparisons:
        p = pair_of.get(c.pair_id)
        v = training_version(p) if p is not None else None
        s = None if v is None else global_step_of(v)
        by_step.setdefault(s, []).append(c)
        if p is not None and p.weight_version is not None:
            rollout_of.setdefault(s, []).append(p.weight_version)
    steps = {s for s in by_step if s is not None}
    steps |= {t.global_step for t in token_steps} | {m.step for m in run_steps}
    rows: dict[int | None, StepSummary] = {}
    if None in by_step:
        rows[None] = _pairs_row(None, None, by_step[None])
    for s in sorted(steps):
        rows[s] = _pairs_row(s, s - 1, by_step.get(s, []), rollout_of.get(s, ()))
    for t in token_steps:
        rows[t.global_step] = rows[t.global_step].model_copy(
            update={
                "responses": t.responses,
                "tokens": t.tokens,
                "mean_abs_logp_diff": t.mean_abs_diff,
                "max_abs_logp_diff": t.max_abs_diff,
                "worst_token_request_id": t.worst_request_id,
                "worst_token_position": t.worst_position,
                "stale_responses": t.stale_responses,
                "stale_mean_abs_logp_diff": t.stale_mean_abs_diff,
            }
        )
    for m in run_steps:
        rows[m.step] = rows[m.step].model_copy(
            update={"grad_norm": m.grad_norm, "reward_mean": m.reward_mean, "not_finite": list(m.not_finite)}
        )
    note = NO_VERSION_NOTE if comparisons and None in by_step and len(by_step) == 1 else None
    return list(rows.values()), note


def label(row: StepSummary) -> str | None:
    """A step's verdict in words (None for a step without pairs)."""
    worst = row.verdicts.worst
    if worst == "diverged" and row.first_divergence:
        return f"diverged at {row.first_divergence}"
    return worst


def drift_line(rows: Sequence[StepSummary]) -> str:
    """The steps' verdicts, equal neighbours merged: ``step 1: healthy · step 2+: diverged at
    layers.2.mlp`` (``+``: to the last step with pairs)."""
    stepped = [(r.global_step, label(r)) for r in rows if r.global_step is not None and label(r)]
    unknown = "pairs of unknown weights" if stepped else "all pairs"
    parts = [f"{unknown}: {label(r)}" for r in rows if r.global_step is None and label(r)]
    if not stepped:
        return " · ".join(parts) or "no pair compared"
    runs: list[list[Any]] = []
    for step, text in stepped:
        if runs and runs[-1][2] == text:
            runs[-1][1] = step
        else:
            runs.append([step, step, text])
    last = stepped[-1][0]
    for i, (a, b, text) in enumerate(runs):
        if a == b:
            where = f"step {a}"
        elif b == last and i == len(runs) - 1:
            where = f"step {a}+"
        else:
            where = f"steps {a}–{b}"
        parts.append(f"{where}: {text}")
    return " · ".join(parts)
