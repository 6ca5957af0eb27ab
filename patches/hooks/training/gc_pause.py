"""No automatic cyclic garbage collection inside a dumped step; one young collection after it (issue 43).

Why: a dumped forward allocates many short-lived Python objects per module call (msprobe's records,
its hook arguments, the lanes' queue entries), so CPython's automatic collector runs hundreds of
young collections inside every dumped micro batch, and the objects that are still alive at those
moments (the step's records) are promoted and count towards the next full collection, which walks
the whole heap of a verl worker. On an H100 the automatic collections were 19 % of what a dumped
micro batch 8 FSDP log_prob pass adds (``../shared/gpu-runs/2026-12-06-h100/fsdp-cost.txt``).
With the collector off from ``BatchDumper.start`` to the end of ``BatchDumper.stop`` (msprobe's
write included), what the step allocates is freed by reference counting as before and nothing
is promoted; the step's cyclic garbage, all of it in the youngest generation, is collected once
right after the step (``gc.collect(0)``: the young objects only, not the heap).

msprobe turns the collector on around each of its hooks (``BaseHookManager.ensure_gc_enabled``);
:func:`hold` keeps its service's hook manager from doing so while the pause holds.

Safety: the collector is turned off only where it was on, and turned back on only by the pause
that turned it off (a process that runs with ``gc.disable()`` keeps it off). A step that never
reaches its stop (its forward raised) leaves the collector off until the next dumped step starts
or the next engine call (``training.batch_dumper`` calls :func:`resume`), so an error cannot leave
a worker without its collector for good. Explicit ``gc.collect()`` calls (verl's engine makes one
every pass) still run while paused.
"""

from __future__ import annotations

import gc
from typing import Any


class GcPause:
    """The collector turned off for one dumped step; :data:`PAUSE` is the process's one."""

    def __init__(self) -> None:
        self.paused = False
        """Whether this pause turned the collector off (and so must turn it back on)."""

    def pause(self, hook_manager: Any = None) -> None:
        """Turn the automatic collector off for the step to come, if it is on and not paused yet;
        and keep msprobe's ``hook_manager`` (its service's) from turning it on in every hook
        (:func:`hold`)."""
        if hook_manager is not None:
            hold(hook_manager)
        if self.paused or not gc.isenabled():
            return
        gc.disable()
        self.paused = True

    def resume(self) -> None:
        """Turn the collector back on, if this pause turned it off, and collect the youngest
        generation once (the step's cyclic garbage). Does nothing otherwise."""
        if not self.paused:
            return
        self.paused = False
        gc.enable()
        gc.collect(0)


PAUSE = GcPause()

HELD = "_gc_pause_held"


def hold(hook_manager: Any) -> None:
    """msprobe's hook manager without its ``gc.enable()`` while :data:`PAUSE` is paused.

    Why: msprobe's ``BaseHookManager`` turns the collector on at the start of every hook it runs
    (``ensure_gc_enabled``) and back off at its end (``restore_gc_state``), so a paused collector
    would still collect inside every module call of the step, which is where the step allocates.
    Put on the manager instance over its static method, this one answers "it was not off" (nothing
    to restore) while :data:`PAUSE` holds the collector off, and is msprobe's own otherwise (a
    process that runs with the collector off, the rollout side's steps). Once per manager; a
    manager without the method is left as it is."""
    original = getattr(hook_manager, "ensure_gc_enabled", None)
    if original is None or getattr(original, HELD, False):
        return

    def ensure_gc_enabled() -> bool:
        if PAUSE.paused:
            return False
        return bool(original())

    setattr(ensure_gc_enabled, HELD, True)
    hook_manager.ensure_gc_enabled = ensure_gc_enabled


def pause(hook_manager: Any = None) -> None:
    """:meth:`GcPause.pause` of the process's pause."""
    PAUSE.pause(hook_manager)


def resume() -> None:
    """:meth:`GcPause.resume` of the process's pause."""
    PAUSE.resume()
