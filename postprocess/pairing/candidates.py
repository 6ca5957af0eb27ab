"""What the two log readers hand to the matching: usable steps as :class:`Candidate`, and the
request each names.

The rules these implement are stated once, in ``postprocess/pairing/pair.py``'s docstring ("Valid
lines", "Request ids", "Workers and positions"); the readers are
:mod:`.prefill_targets` (vLLM's dispatch logs) and :mod:`.micro_batches` (verl's
update_actor logs), the matching is :mod:`.request_match`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

from verl_consistency.postprocess.pairing.discover import LogFile, Side
from verl_consistency.postprocess.pairing.pair_types import DumpRef

Progress = Callable[[str, int, int], None]
"""(stage, done, total) — the CLI turns it into progress bars."""

_SUFFIX_RE = re.compile(r"-[0-9a-f]{8}")
_CHILD_RE = re.compile(r"([0-9]+)_(.+)", re.DOTALL)


def request_key(vid: str, train: Container[str]) -> tuple[str, int | None]:
    """The request (verl's id) a vLLM id names, and its n>1 child index (pairing's "Request ids")."""
    if vid in train:
        return vid, None
    n = len(vid)
    if n > 9 and vid[n - 9] == "-" and _SUFFIX_RE.fullmatch(vid, n - 9):
        e = vid[: n - 9]
        if e in train:
            return e, None
        m = _CHILD_RE.fullmatch(e) if "_" in e else None
        if m:
            return m.group(2), int(m.group(1))
        return e, None
    return vid, None


def worker_step(o: dict[str, Any]) -> tuple[int, int, int]:
    """A record's ``step``, ``rank`` and ``pid``, which both logs must hold as integers.
    Raises ``KeyError`` or ``TypeError`` (the reader reports the line as ``bad_log_line``)."""
    step, rank, pid = o["step"], o["rank"], o["pid"]
    if type(step) is not int or type(rank) is not int or type(pid) is not int:
        raise TypeError("step, rank and pid must be integers")
    return step, rank, pid


def lane_ids(o: dict[str, Any], among: Container[str], where: str) -> list[str] | None:
    """A record's ``lane_request_ids`` (lane k is its k-th id), or None when absent: both logs
    carry it. Raises ``TypeError`` (a ``bad_log_line``) unless it is a list of distinct strings,
    each ``among`` the record's ids (``where`` names them in the message)."""
    lanes = o.get("lane_request_ids")
    if lanes is None:
        return None
    if type(lanes) is not list or not all(type(v) is str for v in lanes) or len(set(lanes)) != len(lanes):
        raise TypeError("lane_request_ids must be a list of distinct strings")
    missing = [v for v in lanes if v not in among]
    if missing:
        raise TypeError(f"lane_request_ids {missing[0]!r} is not among {where}")
    return lanes


def why(exc: Exception) -> str:
    """A record check's failure as the bad line's detail."""
    return f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)


@dataclass(slots=True)
class Candidate:
    """One usable step on one rank (rollout prefill or single-request micro batch)."""

    side: Side
    vllm_id: str
    key: str
    child: int | None
    pid: int
    rank: int
    step: int
    ts: str
    order: tuple[Any, ...]
    ref: str
    log: LogFile
    dump_path: str | None
    prompt_tokens: int = 0
    scoped: bool = False
    phase: str | None = None
    backend: str | None = None
    dir: str | None = None
    lane: int | None = None
    """Per-request lanes (``lane_request_ids``): the request's dump is ``req{lane}`` in the rank folder."""
    version: int | None = None
    """The record's ``weight_version`` (:mod:`.weight_versions`); None: unknown, agrees with any."""
    unsynced: int = 0
    """A training record's ``unsynced_updates``: optimizer steps after that sync (never pairs when > 0)."""
    trainer_version: int | None = None
    """A training record's ``trainer_weight_version``: the weights verl's own computation of the call
    ran, when this forward ran the rollout's older ones (None: the same as ``version``)."""

    def dump_ref(self) -> DumpRef:
        """The step folder, once located (``request_match.locate`` sets ``dir``)."""
        assert self.dir is not None, f"{self.ref}: not located"
        return DumpRef(side=self.side, pid=self.pid, rank=self.rank, step=self.step, dir=self.dir)
