"""A lane and its cuts: which rows of a packed step's tensors are one request's.

Kept apart from :mod:`.msprobe_lanes` (which builds lanes and installs them) so that the parts the
way in uses, the one-pass collector and its statistics, can name these types without importing it
back: the lanes' modules form no loop, not even a type-only one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cut:
    """One request's rows: ``[begin, end)`` along ``dim`` of every tensor whose ``shape[dim] == size``."""

    dim: int
    size: int
    begin: int
    end: int

    def as_msprobe(self) -> dict[str, int]:
        return {"dim": self.dim, "size": self.size, "begin": self.begin, "end": self.end}


@dataclass(frozen=True)
class Lane:
    """One captured request of a dumped step and the cuts that select its rows."""

    request_id: str
    cuts: tuple[Cut, ...]
