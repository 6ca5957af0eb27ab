"""verl's per-step metrics, read from the driver's console output into ``run.json``'s ``steps``.

Why: a run folder should show whether the weights moved. A collection run whose reward never
varies trains with ``actor/grad_norm`` 0 at every step and compares step 0's weights over and
over (issue 35); with ``steps`` in ``run.json`` that is visible without the log, next to verl's own
mismatch figures (``training/rollout_probs_diff_mean``, ``rollout_corr/*``) for each step.

The format is verl's console logger, the same in verl 0.8.0 and 0.9.1
(``verl/utils/logger/aggregate_logger.py``, ``concat_dict_to_str``): ``step:N`` then `` - `` and
``key:value`` for every metric that is a ``numbers.Number``, each value written by
``pprint.pformat``: ``0.5``, ``nan``, ``True``, and with numpy 2 ``np.float64(0.5)``. The
trainer runs in a Ray actor, so the driver prints the line behind Ray's prefix
(``(TaskRunner pid=123)``, ``, ip=...`` from another node, colour codes unless
``RAY_COLOR_PREFIX=0``; ``ray/_private/worker.py`` ``print_worker_logs``). verl 0.8.0's fully-async
trainer logs two lines per step (timings, then the aggregated metrics): a step's lines are merged.
"""

from __future__ import annotations

import math
import re

from verl_consistency.contracts.run_manifest import StepMetrics

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LINE = re.compile(r"^(?:\([^()]*pid=[^()]*\)\s+)?step:(\d+)(?: - (.*))?$")
"""Ray's optional actor prefix, then verl's ``step:N`` and its ``key:value`` items."""
_RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]$")
_NUMPY_SCALAR = re.compile(r"^np\.\w+\((.*)\)$")
_BOOL = {"True": 1.0, "False": 0.0}

FIELDS: dict[str, tuple[str, ...]] = {
    "grad_norm": ("actor/grad_norm",),
    "reward_mean": ("critic/score/mean", "critic/rewards/mean"),
    "rollout_probs_diff_mean": ("training/rollout_probs_diff_mean",),
    "rollout_corr_kl": ("rollout_corr/kl",),
    "rollout_corr_log_ppl_abs_diff": ("rollout_corr/log_ppl_abs_diff",),
    "step_time_s": ("timing_s/step",),
}
"""Each :class:`StepMetrics` field and verl's metric keys for it, the first present wins."""


def number(text: str) -> float | None:
    """A value as ``pprint.pformat`` wrote it, or None when it is no number (a future format)."""
    text = text.strip()
    scalar = _NUMPY_SCALAR.match(text)
    if scalar:
        text = scalar.group(1)
    if text in _BOOL:
        return _BOOL[text]
    try:
        return float(text)
    except ValueError:
        return None


def parse_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {metric: value})`` from one line of the driver's output; None for any other line."""
    text = _RAY_REPEATED.sub("", _ANSI.sub("", line).strip())
    found = _LINE.match(text)
    if found is None:
        return None
    metrics: dict[str, float] = {}
    for item in (found.group(2) or "").split(" - "):
        key, colon, raw = item.rpartition(":")
        value = number(raw) if colon else None
        if key and value is not None:
            metrics[key] = value
    return int(found.group(1)), metrics


class StepLog:
    """The steps seen so far: feed it every line of the driver's output, read :meth:`records`."""

    def __init__(self) -> None:
        self._steps: dict[int, dict[str, float]] = {}
        self.last_step: int | None = None

    def feed(self, line: str) -> bool:
        """Take one line; True when it was a step line."""
        parsed = parse_line(line)
        if parsed is None:
            return False
        step, metrics = parsed
        self._steps.setdefault(step, {}).update(metrics)
        self.last_step = step
        return True

    def records(self) -> list[StepMetrics]:
        return [record(step, metrics) for step, metrics in sorted(self._steps.items())]


def record(step: int, metrics: dict[str, float]) -> StepMetrics:
    """One step's :class:`StepMetrics` from all the metrics verl logged for it."""
    values: dict[str, float | None] = {}
    not_finite = []
    for name, keys in FIELDS.items():
        value = next((metrics[k] for k in keys if k in metrics), None)
        if value is not None and not math.isfinite(value):
            not_finite.append(name)
            value = None
        values[name] = value
    return StepMetrics(step=step, not_finite=not_finite, **values)
