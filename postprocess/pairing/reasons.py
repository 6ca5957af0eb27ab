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

R = UnpairedReason

MEANING: dict[UnpairedReason, str] = {
    R.DECODE_ONLY: "a decode step; a request seen only decoding (its prefill is in no log)",
    R.MULTI_REQUEST_STEP: "the prefill held several requests and gave this one no lane "
    "(not captured, or not computed whole there)",
    R.CHUNKED_PREFILL: "only part of the prompt was scheduled, a later chunk, "
    "or a request resumed after preemption",
    R.PREFIX_CACHE_HIT: "part of the prompt came from the prefix cache",
    R.SPEC_DECODING: "a speculative-decoding step (and a new request in it)",
    R.NOT_DUMPED: "selective mode skipped the dump",
    R.NO_TRAINING_MICRO_BATCH: "no training log line holds the request",
    R.MULTI_REQUEST_MICRO_BATCH: "the micro batch held several requests and gave this one no lane "
    "(Megatron, or a record without `lane_request_ids`)",
    R.NO_REQUEST_ID: "a micro batch with no request ids (the id did not reach the engine)",
    R.NO_ROLLOUT_PREFILL: "only the training side holds it: no dispatch log line has it at all",
    R.REPEATED_MICRO_BATCH: "a later micro batch of an already paired request",
    R.DUPLICATE_ID: "the same request prefilled twice on one rank, or an n>1 sibling's prefill",
    R.TP_SHARDING_MISMATCH: "a TP rank left out because the sharding differs",
    R.DUMP_MISSING: "the step's dump folder is not there",
    R.DUMP_UNREADABLE: "`dump.json` is truncated, corrupt, not msprobe's or not a regular file; "
    "`stack.json`/`construct.json` not a regular file",
    R.OUTSIDE_RUN: "a `dump_path` or symlink that leads outside the dump folder: not followed",
    R.BAD_LOG_LINE: "not JSON, not a record of the expected shape, or longer than 4 MiB",
    R.LOG_UNREADABLE: "a folder, fifo, socket, device, dangling link or unreadable file where a log "
    "should be; a log in a folder whose name is not UTF-8",
    R.WEIGHTS_DIFFER: "vLLM computed with other weights than the trainer's forward "
    "(`weight_version` differs: staleness in the async modes); the detail names both steps",
}
"""What each reason means, as the report's "Not paired" table says it (and postprocess/README.md's
"Reasons", word for word: ``tests/postprocess/test_weight_versions.py`` holds them together)."""


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
