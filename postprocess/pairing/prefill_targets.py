"""Which requests a rollout step computed whole: one pass over vLLM's dispatch logs.

The rules are ``postprocess/pairing/pair.py``'s docstring ("Valid lines" for dispatch records,
"Steps": decode, speculative and prefill steps, a prefill step's *target* and rules 1-7); this
module applies them and nothing else. It yields every *usable prefill* as a
:class:`~.candidates.Candidate`, and for every other vLLM id where it was first seen unusable,
or that it was seen decoding, so that :mod:`.pairing` can give each request one verdict.

The pass runs once per log line (a large run has millions), so it works on plain dicts and
tuples, checks field types in C loops (``map``), and costs a decode step one set update.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.candidates import (
    Candidate,
    Progress,
    lane_ids,
    request_key,
    why,
    worker_step,
)
from verl_consistency.postprocess.pairing.discover import LogFile
from verl_consistency.postprocess.pairing.pair_types import UnpairedReason
from verl_consistency.postprocess.pairing.reasons import Reporter
from verl_consistency.postprocess.pairing.weight_versions import read_version

R = UnpairedReason

Pos = tuple[int, int, int]
"""A position: (log index, line, index in requests)."""

First = tuple[UnpairedReason, int, int, int]
"""(reason, *position) of a vLLM id's first unusable appearance."""

_TYPES = frozenset(("new", "cached"))
_STR = frozenset((str,))
_INT = frozenset((int,))
_ENTRY = (
    "each request needs a string request_id (and in a prefill step type 'new' or 'cached' and integer tokens)"
)
_get_id, _get_tokens, _get_type = itemgetter("request_id"), itemgetter("tokens"), itemgetter("type")


@dataclass
class RolloutSteps:
    """What the dispatch logs say, request by request."""

    usable: list[Candidate]
    first: dict[str, First]
    """vLLM id -> (reason, position) of its first unusable new or continuation appearance."""
    decode_vids: set[str]
    n: int
    """Dispatch records read (bad lines included)."""


def read_rollout(logs: list[LogFile], train: Container[str], rep: Reporter, tick: Progress) -> RolloutSteps:
    """One pass over every dispatch log: the usable prefills, and for every other vLLM id where
    it was first seen unusable, or that it was seen decoding. Decode steps cost one set update."""
    p = _Pass(train, rep)
    for li, log in enumerate(logs):
        tick("rollout logs", li, len(logs))
        for lineno, o in discover.iter_jsonl(log, rep):
            p.n += 1
            try:
                reqs, vids, attn, worker = _dispatch_record(o)
                if vids is not None:  # a decode step
                    p.decode += 1
                    p.decode_vids.update(vids)
                    continue
                targets = _prefill_targets(o, reqs)
                version = read_version(o)
            except (KeyError, TypeError, AttributeError) as exc:
                discover.bad_line(rep, log, lineno, f"not a dispatch_logger record: {why(exc)}")
                continue
            if attn == "SpecDecoding":
                p.spec_step(reqs, li, lineno)
                continue
            p.others(reqs, {t.index for t in targets}, worker, li, lineno)
            if not targets:
                p.bulk[R.MULTI_REQUEST_STEP] += 1
                continue
            for t in targets:
                p.target(o, log, (li, lineno, t.index), reqs, (worker, version), attn, t)
    tick("rollout logs", len(logs), len(logs))
    return p.finish()


def _dispatch_record(
    o: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[str] | None, Any, tuple[int, int, int]]:
    """Check what every dispatch record needs: ``(requests, vLLM ids if a decode step else None,
    attn_state, (step, rank, pid))``. Raises ``KeyError``/``TypeError``/``AttributeError``."""
    phase = o["phase"]
    reqs = o["requests"]
    worker = worker_step(o)
    if type(reqs) is not list:
        raise TypeError("requests must be a list")
    # Checked in C loops: most lines are decode steps of several requests.
    vids = list(map(_get_id, reqs))
    if not set(map(type, vids)) <= _STR:
        raise TypeError(_ENTRY)
    attn = o.get("attn_state")
    if phase == "decode" or attn == "DecodeOnly":
        if phase != "decode" and phase != "prefill":
            raise TypeError(f"phase {phase!r} is neither prefill nor decode")
        return reqs, vids, attn, worker
    if phase != "prefill":
        raise TypeError(f"phase {phase!r} is neither prefill nor decode")
    return reqs, None, attn, worker


@dataclass(frozen=True, slots=True)
class Target:
    """One target of a prefill step: its index in ``requests``, its lane, and its lengths."""

    index: int
    lane: int | None
    prompt: Any
    computed: Any


def _prefill_targets(o: dict[str, Any], reqs: list[dict[str, Any]]) -> list[Target]:
    """Check a prefill step's requests and find its targets: every request named by
    ``lane_request_ids`` (lane k its k-th), else the one ``scoped_request_id`` names, else the
    only request; none for several requests and no name. Raises ``TypeError``."""
    if not (set(map(type, map(_get_tokens, reqs))) <= _INT and set(map(_get_type, reqs)) <= _TYPES):
        raise TypeError(_ENTRY)
    if not reqs:
        raise TypeError("a prefill step with no requests")
    where: dict[str, int] = {}
    for i, q in enumerate(reqs):
        where.setdefault(q["request_id"], i)  # a request listed twice: its first entry
    lanes = lane_ids(o, where, "the step's requests")
    found: list[tuple[int, int | None]] = []
    if lanes is not None:
        found = [(where[v], k) for k, v in enumerate(lanes)]
    else:
        captured = o.get("scoped_request_id") or o.get("captured_request_id")
        if captured is not None:
            if captured not in where:
                raise TypeError(f"scoped_request_id {captured!r} is not among the step's requests")
            found = [(where[captured], None)]
        elif len(reqs) == 1:
            found = [(0, None)]
    out = []
    for index, lane in found:
        t = reqs[index]
        prompt = t.get("prompt_tokens")
        computed = t.get("num_computed_tokens")
        if (prompt is not None and type(prompt) is not int) or (
            computed is not None and type(computed) is not int
        ):
            raise TypeError("prompt_tokens and num_computed_tokens must be integers")
        out.append(Target(index, lane, prompt, computed))
    return out


def _is_decode(q: dict[str, Any]) -> bool:
    """A cached request in a prefill step: one token, or one plus its logged speculative tokens."""
    tokens = q["tokens"]
    if tokens == 1:
        return True
    spec = q.get("spec_tokens")
    return type(spec) is int and tokens == 1 + spec


class _Pass:
    """The state of one pass: what :class:`RolloutSteps` returns, plus each worker's last
    continuation (rule 5) and the targets that wait for it."""

    __slots__ = ("bulk", "conts", "decode", "decode_vids", "deferred", "first", "n", "rep", "train", "usable")

    def __init__(self, train: Container[str], rep: Reporter) -> None:
        self.train = train
        self.rep = rep
        self.usable: list[Candidate] = []
        self.first: dict[str, First] = {}
        self.decode_vids: set[str] = set()
        self.conts: dict[tuple[int, int, str], Pos] = {}
        """(pid, rank, vLLM id) -> position of its latest continuation."""
        self.deferred: list[tuple[Candidate, bool, Pos]] = []
        """Targets that rule 5 decides after the whole log: (candidate, dumped, position)."""
        self.bulk: Counter[UnpairedReason] = Counter()
        self.n = 0
        self.decode = 0

    def earliest(self, vid: str, why: UnpairedReason, pos: Pos) -> None:
        """Keep the earliest unusable appearance: the step's other requests were noted before its
        target, and deferred targets are resolved after the whole log."""
        prev = self.first.get(vid)
        if prev is None or pos < prev[1:]:
            self.first[vid] = (why, *pos)

    def spec_step(self, reqs: list[dict[str, Any]], li: int, lineno: int) -> None:
        """A speculative step: a new request gets ``spec_decoding``, a cached one is decoding."""
        self.bulk[R.SPEC_DECODING] += 1
        first = self.first
        for i, q in enumerate(reqs):
            vid = q["request_id"]
            if q["type"] == "new":
                if vid not in first:
                    first[vid] = (R.SPEC_DECODING, li, lineno, i)
            else:
                self.decode_vids.add(vid)

    def others(
        self,
        reqs: list[dict[str, Any]],
        targets: set[int],
        worker: tuple[int, int, int],
        li: int,
        lineno: int,
    ) -> None:
        """A prefill step's requests other than its targets: new, decode or continuation."""
        _, rank, pid = worker
        first = self.first
        for i, q in enumerate(reqs):
            if i in targets:
                continue
            vid = q["request_id"]
            if q["type"] == "new":
                if vid not in first:
                    first[vid] = (R.MULTI_REQUEST_STEP, li, lineno, i)
            elif _is_decode(q):
                self.decode_vids.add(vid)
            else:
                self.conts[(pid, rank, vid)] = (li, lineno, i)
                if vid not in first:
                    first[vid] = (R.CHUNKED_PREFILL, li, lineno, i)

    def target(
        self,
        o: dict[str, Any],
        log: LogFile,
        pos: Pos,
        reqs: list[dict[str, Any]],
        record: tuple[tuple[int, int, int], int | None],
        attn: Any,
        tgt: Target,
    ) -> None:
        """A prefill step's target, by rules 1-7 (rule 5 waits for the whole log). ``record`` is
        the step's ``(step, rank, pid)`` and its ``weight_version``."""
        (step, rank, pid), version = record
        prompt, computed = tgt.prompt, tgt.computed
        t = reqs[pos[2]]
        vid = t["request_id"]
        if t["type"] == "cached":
            if _is_decode(t):
                self.bulk[R.DECODE_ONLY] += 1
                self.decode_vids.add(vid)
            else:
                self.bulk[R.CHUNKED_PREFILL] += 1
                self.conts[(pid, rank, vid)] = pos
                self.earliest(vid, R.CHUNKED_PREFILL, pos)
            return
        tokens = t["tokens"]
        scoped = len(reqs) > 1
        if computed is not None and computed > 0:
            why = R.PREFIX_CACHE_HIT
        elif (prompt is not None and tokens < prompt) or (not scoped and attn == "ChunkedPrefill"):
            why = R.CHUNKED_PREFILL
        elif not scoped and attn == "PrefillCacheHit":
            why = R.PREFIX_CACHE_HIT
        else:
            key, child = request_key(vid, self.train)
            dump_path = o.get("dump_path")
            ts = str(o.get("timestamp", ""))
            lineno = pos[1]
            cand = Candidate(
                "rollout",
                vid,
                key,
                child,
                pid,
                rank,
                step,
                ts,
                (ts, pid, step, lineno),
                f"{log.virtual}:{lineno}",
                log,
                dump_path if isinstance(dump_path, str) else None,
                prompt_tokens=prompt if prompt is not None else tokens,
                scoped=scoped,
                lane=tgt.lane,
                version=version,
            )
            dumped = o.get("dumped", True) is not False
            if prompt is None:
                self.deferred.append((cand, dumped, pos))  # rule 5 needs the whole log
                return
            if dumped:
                self.usable.append(cand)
                return
            why = R.NOT_DUMPED
        self.bulk[why] += 1
        self.earliest(vid, why, pos)

    def finish(self) -> RolloutSteps:
        """Rule 5 for the deferred targets, then the step counts."""
        bulk = self.bulk
        for cand, dumped, pos in self.deferred:
            last = self.conts.get((cand.pid, cand.rank, cand.vllm_id))
            if last is not None and last > pos:
                why = R.CHUNKED_PREFILL
            elif not dumped:
                why = R.NOT_DUMPED
            else:
                self.usable.append(cand)
                continue
            bulk[why] += 1
            self.earliest(cand.vllm_id, why, pos)
        if self.decode:
            bulk[R.DECODE_ONLY] += self.decode
        for reason, k in bulk.items():
            self.rep.bulk("rollout_step", reason, k)
        return RolloutSteps(self.usable, self.first, self.decode_vids, self.n)
