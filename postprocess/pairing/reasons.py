"""The tally of why things were not paired: every reason counted, each listed up to a cap.

A large run has hundreds of thousands of unpaired requests and decode steps; the manifest
counts them all but lists only the first :data:`LIST_CAP` of each (subject, reason), so the
bundle stays small and the counts stay exact (``postprocess/pairing/pair.py``, "Limits").
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from verl_consistency.postprocess.pairing.pair_types import Unpaired, UnpairedReason

LIST_CAP = 10_000
"""Reported reasons listed one by one per (subject, reason); beyond that they are only counted."""


@dataclass
class Reporter:
    """Counts every reason; lists each (subject, reason) up to ``LIST_CAP`` entries."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    listed: list[Unpaired] = field(default_factory=list)

    def __call__(self, item: Unpaired) -> None:
        key = (item.subject, item.reason.value)
        self.counts[key] += 1
        if self.counts[key] <= LIST_CAP:
            self.listed.append(item)

    def request(self, ref: str, reason: UnpairedReason, detail: str, *args: object) -> None:
        """A request's verdict; the entry (and ``detail.format(*args)``) is built only while it
        is listed: a large run has hundreds of thousands of unpaired requests."""
        key = ("request", reason)  # a StrEnum member hashes and compares as its value
        self.counts[key] += 1
        if self.counts[key] <= LIST_CAP:
            text = detail.format(*args) if args else detail
            self.listed.append(Unpaired(subject="request", ref=ref, reason=reason, detail=text))

    def requests(self, reason: UnpairedReason, keys: list[str]) -> list[str]:
        """Count the verdicts of ``keys``; return those still to be listed (up to the cap)."""
        key = ("request", reason)
        before = self.counts[key]
        self.counts[key] = before + len(keys)
        return keys[: max(0, LIST_CAP - before)]

    def list_request(self, ref: str, reason: UnpairedReason, detail: str) -> None:
        self.listed.append(Unpaired(subject="request", ref=ref, reason=reason, detail=detail))

    def bulk(self, subject: str, reason: UnpairedReason, n: int = 1) -> None:
        self.counts[(subject, reason.value)] += n

    def nested_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for (subject, reason), n in sorted(self.counts.items()):
            out[subject][str(reason)] = n
        return dict(out)
