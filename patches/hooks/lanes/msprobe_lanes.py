"""Every captured request of a packed forward, each in its own msprobe dump ("lanes").

Why: mindstudio-probe 26.2.0 cuts **one** request's rows out of a packed step: its
``request_id`` and ``scheduled_tokens`` become a single ``slice_info`` item that
``PytorchDataProcessor._analyze_tensor`` applies to every tensor. vLLM packs a whole batch of
prefills into one step and verl's agent loop sends a training step's prompts at once, so one
dumped step yielded one pair and wasted the others (``bench/bench_pairable_vllm.py``: 7-8 pairs
per 100 prompts sent at once, where 95 were computed whole).

How, without writing our own statistics: msprobe's hook manager looks up
``service.data_collector`` at every hook call (``core/dump/hook_manager.py``), and a
``DataCollector`` owns everything that makes one dump: its config (whose ``slice_info`` the
processor applies), its ``DataProcessor`` (the statistics, the ``.pt`` files) and its
``DataWriter`` (``dump.json``, ``construct.json``, ``stack.json``). For a dumped step,
:func:`install` puts a :class:`LaneFanout` in that place. It holds one real msprobe
``DataCollector`` per *lane* (one captured request), each built by msprobe itself from a copy of
the service's config whose ``slice_info`` is that request's rows, and forwards every call the
service and the hooks make to each of them. So every lane is an ordinary msprobe dump, cut by
msprobe's own ``slice_by_config``, counted by msprobe's own statistics, written by msprobe's own
writer, and ``msprobe compare`` reads it unchanged.

Why not a diff against msprobe (as we patch verl and vLLM): the fan-out is a new object in front
of msprobe's unchanged classes, not an edit inside one of them; as a runtime install it needs no
patched msprobe in the image, the venvs or the device, and ``tests/selective`` proves it against
the pinned release on every run. What it relies on is listed in :func:`check_msprobe` and
checked at install time, so an msprobe whose internals moved fails loudly instead of dumping
whole steps.

Layout: msprobe makes ``<dump_path>/step{N}/{rank}/`` for the step; lane ``k`` writes
``<that>/req{k}/{dump.json,construct.json,stack.json[,dump_tensor_data/]}``. The caller records
which request each ``req{k}`` holds (``records.DumpedRequest``).

Two fronts, one per kind of step (:func:`one_pass`). Statistics (``task: statistics``, the
default summary, no ``tensor_list``) go through ``lane_collector.LaneStats`` (issue 32): one
msprobe collector walks each module call once, and each tensor is reduced once for every lane on
the device; each lane's files are what the fan-out writes (``tests/selective/test_lane_stats.py``).
Everything else, tensor mode and md5/xor summaries (they write or hash each lane's own rows),
keeps the fan-out, where each lane runs msprobe's per-module work: a step with N lanes costs about
N times a one-request scoped step's host work, on 1/N of the rows each. :data:`DEFAULT_PATH`
``fanout`` sends statistics through the fan-out too: the reference the one-pass path is tested
against, and the "before" of ``bench/bench_lanes.py``. Bytes per request are those of a
one-request scoped dump either way.

This module imports msprobe lazily (inside :func:`install`), never at import time.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from verl_consistency.contracts.records import lane_folder
from verl_consistency.patches.hooks.lanes import lean_hooks, lean_walk
from verl_consistency.patches.hooks.lanes.cuts import Cut, Lane
from verl_consistency.patches.hooks.lanes.lane_collector import LaneStats, lane_paths
from verl_consistency.patches.hooks.lanes.lane_writer import LaneWriteError, LaneWriter  # noqa: F401  (the way in)
from verl_consistency.patches.hooks.lanes.msprobe_shortcuts import modes_context


def packed_lanes(
    tokens: Mapping[str, int],
    order: Sequence[str],
    wanted: Sequence[str],
    dims: Sequence[int] = (0,),
    *,
    request_rows: bool = False,
) -> list[Lane]:
    """Lanes for ``wanted`` requests of a packed batch: offsets in ``order``, token counts from ``tokens``.

    ``dims`` names the token dimension(s): vLLM's activations are ``[num_tokens, ...]`` (dim 0);
    a training engine's packed (THD) activations are ``[1, total, ...]`` (dim 1) or
    ``[total, ...]`` (dim 0), so it passes ``(0, 1)``. Raises ``ValueError`` for an order that
    does not name the same requests as ``tokens``, a count that is not a positive int, or a wanted
    request that is not in the batch: a wrong offset would cut another request's rows silently.

    ``request_rows``: also cut tensors with one row per request (``[num_reqs, ...]``: vLLM's
    ``LogitsProcessor`` sees each request's last-token hidden state and logits) to the request's
    own row, so a lane's logits are the request's alone. Skipped when the batch has as many
    requests as tokens (every prompt one token long), where the two cuts could not be told apart.
    A tensor whose first dimension equals the token count, or the request count, by coincidence
    (a parameter, say) is cut too, as in msprobe's own one-request cut.
    """
    if set(order) != set(tokens) or len(order) != len(tokens):
        raise ValueError(
            f"the packing order ({len(order)} ids) and the token counts ({len(tokens)} ids) name different "
            "requests; pass the order in which the batch's rows are packed"
        )
    total, offsets = 0, {}
    for rid in order:
        n = tokens[rid]
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"token count of {rid!r} is {n!r}: expected a positive int")
        offsets[rid] = (total, total + n)
        total += n
    lanes = []
    for rid in wanted:
        if rid not in offsets:
            raise ValueError(f"request {rid!r} is not in this batch")
        begin, end = offsets[rid]
        cuts = [Cut(d, total, begin, end) for d in dims]
        if request_rows and len(order) != total:
            row = list(order).index(rid)
            cuts.append(Cut(0, len(order), row, row + 1))
        lanes.append(Lane(rid, tuple(cuts)))
    return lanes


def check_msprobe(service: Any) -> None:
    """Refuse an msprobe whose internals differ from what the fan-out relies on (checked per install)."""
    missing = [name for name in ("data_collector", "hook_manager", "config") if not hasattr(service, name)]
    hook_manager = getattr(service, "hook_manager", None)
    if hook_manager is not None and not hasattr(hook_manager, "data_collector"):
        missing.append("hook_manager.data_collector")
    collector = getattr(service, "data_collector", None)
    for name in ("data_writer", "data_processor", "update_dump_paths", "initialize_json_file", "write_json"):
        if (
            collector is not None
            and not isinstance(collector, (LaneFanout, LaneStats))
            and not hasattr(collector, name)
        ):
            missing.append(f"data_collector.{name}")
    if missing:
        raise RuntimeError(
            "this mindstudio-probe lacks what per-request lanes rely on (" + ", ".join(missing) + "); "
            "use the pinned release (patches/pins.toml upstream.mindstudio_probe)"
        )


class LaneFanout:
    """Stands where msprobe expects its ``DataCollector``; forwards each call to every lane's collector.

    Reads (``data_processor``, ``scope``, ``dump_file_path``, ...) answer from lane 0, whose
    config equals the others' but for ``slice_info``. The collectors are kept between steps and
    re-aimed, so a lane's thread pool and writer are made once per process, not once per step.
    """

    def __init__(self, original: Any) -> None:
        self.original = original
        self.collectors: list[Any] = []
        self.lanes: list[Lane] = []

    # -- set-up --------------------------------------------------------------------------------
    def aim(self, config: Any, lanes: Sequence[Lane]) -> None:
        """Use these lanes for the next dumped step; builds missing collectors with msprobe's own factory."""
        from msprobe.core.dump.data_dump.data_collector import build_data_collector

        if not lanes:
            raise ValueError("a dumped step needs at least one lane")
        while len(self.collectors) < len(lanes):
            self.collectors.append(build_data_collector(self._lane_config(config, lanes[0])))
        for collector, lane in zip(self.collectors, lanes, strict=False):
            lane_config = self._lane_config(config, lane)
            collector.config = lane_config
            collector.data_processor.config = lane_config
            collector.data_writer.config = lane_config
            tensor_handler = getattr(collector.data_processor, "tensor_handler", None)
            if tensor_handler is not None and hasattr(tensor_handler, "config"):
                tensor_handler.config = lane_config
        self.lanes = list(lanes)

    @staticmethod
    def _lane_config(config: Any, lane: Lane) -> Any:
        lane_config = copy.copy(config)
        lane_config.slice_info = [cut.as_msprobe() for cut in lane.cuts]
        # msprobe's own one-request cut must not run on top of ours
        lane_config.request_id = None
        lane_config.is_slice_info_modified = False
        return lane_config

    @property
    def active(self) -> list[Any]:
        return self.collectors[: len(self.lanes)]

    # -- what msprobe's service and hook manager call -------------------------------------------
    def update_dump_paths(self, aggregation: Any) -> None:
        for k, collector in enumerate(self.active):
            collector.update_dump_paths(lane_paths(aggregation, k))

    def replace_proc_with_rank(self, rank_path: str) -> None:
        for k, collector in enumerate(self.active):
            collector.replace_proc_with_rank(os.path.join(rank_path, lane_folder(k)))

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class does not define. Methods are broadcast to every
        # lane (msprobe's collect/flush/reset calls return None); anything else is read from lane 0.
        collectors = self.__dict__.get("collectors") or []
        lanes = self.__dict__.get("lanes") or []
        if not collectors or not lanes:
            return getattr(self.__dict__["original"], name)
        first = getattr(collectors[0], name)
        if not callable(first):
            return first

        def broadcast(*args: Any, **kwargs: Any) -> Any:
            results = [getattr(c, name)(*args, **kwargs) for c in collectors[: len(lanes)]]
            return results[0]

        return broadcast


Path = Literal["auto", "fanout"]
DEFAULT_PATH: Path = "auto"
"""What :func:`install` uses when its caller names no path: ``auto`` takes the one-pass path
(:func:`one_pass`) wherever msprobe's config allows it; ``fanout`` keeps one msprobe collector per
lane everywhere (the reference the one-pass path is tested against; benches set it to time the old
path in the same process)."""


def one_pass(config: Any) -> bool:
    """Whether a dumped step with this msprobe config writes its lanes in one pass (``LaneStats``):
    statistics (``task: statistics``, ``summary_mode: statistics``) with no ``tensor_list``. Tensor
    mode writes each lane's rows and md5/xor summaries hash each lane's bytes: those keep the
    fan-out, one msprobe collector per lane."""
    return (
        getattr(config, "task", None) == "statistics"
        and getattr(config, "summary_mode", "statistics") == "statistics"
        and not getattr(config, "tensor_list", None)
    )


FRONTS_ATTR = "_verl_consistency_lane_fronts"


def _fronts(service: Any, original: Any) -> tuple[LaneFanout, LaneStats]:
    """The service's fan-out and one-pass fronts for msprobe's collector ``original``, kept between
    steps (a config hot-reload builds a new collector, and new fronts with it)."""
    kept = getattr(service, FRONTS_ATTR, None)
    if kept is None or kept[0] is not original:
        kept = (original, LaneFanout(original), LaneStats(original))
        setattr(service, FRONTS_ATTR, kept)
    return kept[1], kept[2]


def install(service: Any, lanes: Sequence[Lane], path: Path | None = None) -> LaneFanout | LaneStats:
    """Aim msprobe's service at these lanes for its next dumped step; returns the front in place.

    Call it right before ``debugger.start(...)`` (which makes the step's folders through
    ``update_dump_paths``), after any config hot-reload (a reload builds a new collector). The
    front stays in place until :func:`uninstall`; msprobe's own collector is kept aside. ``path``
    (default :data:`DEFAULT_PATH`): ``auto`` writes statistics steps in one pass (:func:`one_pass`,
    ``lane_collector.LaneStats``) and everything else through the fan-out; ``fanout`` always fans out.
    The one-pass front engages ``lean_hooks`` (msprobe's module hook pair, lean) at the step's start;
    the fan-out and :func:`uninstall` put msprobe's own hooks back in their slots.
    """
    check_msprobe(service)
    current = service.data_collector
    original = current.original if isinstance(current, (LaneFanout, LaneStats)) else current
    fanout, stats = _fronts(service, original)
    chosen = path or DEFAULT_PATH
    if chosen not in ("auto", "fanout"):
        raise ValueError(f"lane path {chosen!r}: expected 'auto' or 'fanout'")
    front: LaneFanout | LaneStats = stats if chosen == "auto" and one_pass(service.config) else fanout
    front.aim(service.config, lanes)
    stats.writer = None  # in line unless the caller hands the step's files to a helper (lane_writer)
    if front is stats:  # msprobe's module hooks, lean, from the step's start (lean_hooks.py)
        stats.lean_hooks = lean_hooks.service_hooks(service)
    else:
        lean_hooks.disengage(service)
    service.data_collector = front
    service.hook_manager.data_collector = front
    _lean_modes(service.hook_manager)
    lean_walk.remembered_hook_sets(service.hook_manager)
    lean_walk.quick_setup_hooks()
    return front


def _lean_modes(hook_manager: Any) -> None:
    """``msprobe_shortcuts.modes_context`` on msprobe's hook manager (an instance attribute over its static
    method), once; a manager without the method is left as it is."""
    current = getattr(hook_manager, "_no_grad_context", None)
    if current is None or getattr(current, "_lane_modes", False):
        return
    hook_manager._no_grad_context = modes_context(current)


def uninstall(service: Any) -> None:
    """Put msprobe's own collector back (a whole-step or msprobe-scoped dump follows)."""
    lean_hooks.disengage(service)
    current = getattr(service, "data_collector", None)
    if isinstance(current, (LaneFanout, LaneStats)):
        service.data_collector = current.original
        service.hook_manager.data_collector = current.original
    manager = getattr(service, "hook_manager", None)
    if manager is not None and hasattr(manager, "__dict__"):
        manager.__dict__.pop("_no_grad_context", None)  # msprobe's own static method again
        lean_walk.forget_hook_sets(manager)
