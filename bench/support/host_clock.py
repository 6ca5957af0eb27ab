"""Where a dumped step's host time goes, without a profiler: the lanes' methods and Python's collector.

Why: issue 32's bound is a ratio of wall times, and what a dumped step adds beyond its forward is
host Python. cProfile answers where it goes but charges every function call (on the H200 host a
builtin as cheap as ``id()`` showed 11 us a call under it), so it overstates msprobe's many small
calls; a clock around a handful of methods charges a microsecond or so a call and tells apart our
lanes' share (``_analyze_tensor``, which includes ``LaneStatQueue.add``, and ``write_json``), Python's
garbage collector and, by difference, msprobe's own hook walk. ``bench/bench_lane_host.py`` (the CPU
stand-in) and ``bench/gpu/fsdp_cost.py`` (verl's FSDP log_prob pass, on the device) print the same
split.

The clocks run only while ``on``; wrapping is for the whole process (the benches are processes of
their own).
"""

from __future__ import annotations

import gc
import importlib
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

TIMED = (
    ("lanes.lane_collector", "LaneStats", "_analyze_tensor"),
    ("lanes.lane_stats", "LaneStatQueue", "add"),
    ("lanes.lane_stats", "LaneStatQueue", "add_per_lane"),
    ("lanes.lane_collector", "LaneStats", "write_json"),
    ("lanes.lane_writer", "LaneWriter", "drain"),
    ("training.gc_pause", "GcPause", "resume"),
)
"""(module under ``verl_consistency.patches.hooks``, class, method): the lanes' host work per dumped step.

``LaneWriter.drain`` is the training thread's wait for the lane writer's helper (the files of the
steps it still writes, at the end of an engine call); ``write_json`` then holds only the hand-over.

``GcPause.resume`` ends a dumped step with one young collection (``training/gc_pause.py``): its
``gc.collect(0)``
is the step's cost, so it counts with the automatic collections (``gc``), not with the asked-for ones."""


class HostClock:
    """Seconds in the :data:`TIMED` methods and in each generation's collections while :attr:`on`.

    A collection runs inside whatever allocated last, often a timed method: its seconds count to
    ``gc`` and are taken out of each timed method it ran in (:meth:`split`), so no second is
    counted twice."""

    def __init__(self) -> None:
        self.on = False
        self.spent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.per_lane: Counter[str] = Counter()
        """What took msprobe's own per-lane path (``add_per_lane``: cut and reduced once per lane,
        each value read with ``.item()``), by kind: a tensor the one pass does not take."""
        self.gc_within: dict[str, float] = defaultdict(float)
        self._inside: list[str] = []
        self.gc_count = [0, 0, 0]
        self.gc_seconds = [0.0, 0.0, 0.0]
        self.called_seconds = 0.0
        """Collections someone asked for (``gc.collect()``: verl's engine calls it every pass, dumped
        or not), apart from the automatic ones that what a step allocates sets off."""
        self._gc_start = 0.0
        self._called = False
        self._originals: list[tuple[Any, str, Any]] = [(gc, "collect", gc.collect)]
        gc.callbacks.append(self._collected)
        gc.collect = self._timed_collect(gc.collect)
        for module, cls_name, name in TIMED:
            cls = getattr(importlib.import_module(f"verl_consistency.patches.hooks.{module}"), cls_name)
            self._originals.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, self._timed(getattr(cls, name), name))

    def close(self) -> None:
        """Put back what the clock wrapped (a test's process goes on after it)."""
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals.clear()
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)

    def reset(self) -> None:
        self.spent.clear()
        self.calls.clear()
        self.per_lane.clear()
        self.gc_within.clear()
        self.gc_count, self.gc_seconds = [0, 0, 0], [0.0, 0.0, 0.0]
        self.called_seconds = 0.0

    def split(self) -> dict[str, float]:
        """Seconds so far: each timed method's without the collections inside it, ``gc`` (the
        automatic collections, every generation's) and ``gc.collect()`` (the ones asked for)."""
        own = {name: seconds - self.gc_within[name] for name, seconds in self.spent.items()}
        return {**own, "gc": sum(self.gc_seconds), "gc.collect()": self.called_seconds}

    def _timed_collect(self, collect: Callable[..., int]) -> Callable[..., int]:
        clock = self

        def timed_collect(*args: Any, **kwargs: Any) -> int:
            if not clock.on or clock._called or "resume" in clock._inside:
                return collect(*args, **kwargs)
            clock._called = True
            start = time.perf_counter()
            try:
                return collect(*args, **kwargs)
            finally:
                clock._called = False
                clock.called_seconds += time.perf_counter() - start

        return timed_collect

    def _timed(self, original: Callable[..., Any], name: str) -> Callable[..., Any]:
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not clock.on:
                return original(*args, **kwargs)
            if name == "add_per_lane":
                clock.per_lane[_kind(args[1])] += 1
            start = time.perf_counter()
            clock.calls[name] += 1
            clock._inside.append(name)
            try:
                return original(*args, **kwargs)
            finally:
                clock._inside.pop()
                clock.spent[name] += time.perf_counter() - start

        return timed

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on or self._called:
            return
        if phase == "start":
            self._gc_start = time.perf_counter()
            return
        generation, seconds = info["generation"], time.perf_counter() - self._gc_start
        self.gc_count[generation] += 1
        self.gc_seconds[generation] += seconds
        for name in set(self._inside):
            self.gc_within[name] += seconds


def _kind(tensor: Any) -> str:
    """A tensor's type, dtype and shape, as one short text (what took the per-lane path)."""
    shape = "x".join(str(n) for n in getattr(tensor, "shape", ()))
    return f"{type(tensor).__name__} {getattr(tensor, 'dtype', '?')} [{shape}]"


def per_lane_line(per_lane: Counter[str], passes: int) -> str:
    """The tensors that took msprobe's own per-lane path, per pass (or step), the most frequent first."""
    if not per_lane:
        return "msprobe's per-lane path: none (every tensor took the one pass)"
    total = sum(per_lane.values()) / passes
    kinds = ", ".join(f"{kind} x{n / passes:g}" for kind, n in per_lane.most_common(3))
    return f"msprobe's per-lane path: {total:g} tensors ({kinds})"


def split_line(split: dict[str, float], extra_s: float | None, steps: int) -> str:
    """One line: each part's seconds and share of what the dumped pass added (``extra_s``), the rest
    (msprobe's hook walk, the forward's own variation), and any ``gc.collect()`` calls apart."""
    if extra_s is not None and extra_s <= 0:  # the pass was no slower than the undumped median: noise
        extra_s = None
    parts = [("_analyze_tensor", "lanes' per-tensor step (add included)"), ("write_json", "lanes' write")]
    if split.get("drain"):
        parts.append(("drain", "the wait for the lane writer's helper"))
    parts.append(("gc", "collections (automatic, and the one after a step)"))
    words = []
    for key, what in parts:
        seconds = split.get(key, 0.0)
        share = f", {seconds / extra_s:.0%}" if extra_s else ""
        words.append(f"{what} {seconds:.3f} s{share}")
    if split.get("add_per_lane"):
        words[0] += f" (msprobe's per-lane path {split['add_per_lane']:.3f} s of it)"
    if extra_s:
        rest = extra_s - sum(split.get(key, 0.0) for key, _ in parts)
        words.append(
            f"the rest (msprobe's hook walk) {rest:.3f} s, {rest / extra_s:.0%}, of {extra_s:.3f} s added"
        )
    if steps:
        words.append(f"{steps} steps")
    if split.get("gc.collect()"):
        words.append(
            f"besides: gc.collect() calls {split['gc.collect()']:.3f} s (undumped passes make them too)"
        )
    return "; ".join(words)
