"""State that belongs to one process: a forked child starts fresh (the hooks' per-process state).

verl's and vLLM's workers are processes, and some are forked from a parent that already ran hooks
(vLLM's engine core, Ray's workers). A hook's state (the weight label a worker loaded, the one a
trainer sent, the tensors a worker has received) describes the process that did it, never its
child, so each is kept behind :class:`ProcessLocal`, which hands a fork a new one; and
:func:`dist_rank` says which rank the process is. Used by both hook rooms, so it lives with the
contracts; nothing here imports torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ProcessLocal(Generic[T]):
    """``factory()``'s value for the current process: made again after a fork, or on :meth:`reset`."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._pid = os.getpid()
        self._value = factory()

    def get(self) -> T:
        if self._pid != os.getpid():
            self.reset()
        return self._value

    def reset(self) -> None:
        self._pid = os.getpid()
        self._value = self._factory()


def dist_rank() -> int | None:
    """This process's global rank when torch.distributed is up, else None; never imports torch
    itself (a process that has not imported it has no process group)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return None
