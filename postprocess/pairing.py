"""Pair vLLM prefill steps with training micro batches by request id.

This docstring is the one full statement of the rules; postprocess/README.md ("Pairing rules")
is the user's summary and links here. ``tests/postprocess/test_pairing_property.py`` checks this
module against a second, deliberately plain implementation of the same text.

**Valid lines.** A log line counts only when it is a JSON object of the expected shape (bad lines
are reported as ``bad_log_line`` ``file:line`` and their ids are not seen at all):

* dispatch: integer ``step``, ``rank``, ``pid``; ``phase`` ``prefill`` or ``decode``; ``requests``
  a list of objects, each with a string ``request_id``. A prefill step (below) also needs at
  least one request, each with ``type`` ``new`` or ``cached`` and integer ``tokens``;
  ``prompt_tokens`` and ``num_computed_tokens`` of its target integers or absent; a
  ``scoped_request_id`` (or ``captured_request_id``) naming one of its requests.
* training: integer ``step``, ``rank``, ``pid``; ``request_ids`` a list of strings.

**Request ids.** A request is named by the id verl sent. Training ids are verl's own and are
used verbatim, never cut. A vLLM id ``v`` names: ``v`` itself if the training side holds ``v``
(vLLM before 0.14 kept ids as sent); else, when ``v`` ends in ``-`` and 8 lowercase hex digits
(vLLM >= 0.14's suffix), ``v`` without them (``e``) if the training side holds ``e``; else the
parent ``p`` of an n>1 child ``e == "<i>_<p>"`` (child ``i``); else ``e``; else ``v``.

**Workers and positions.** A worker is a record's ``(pid, rank)``. A position is
``(log, line, index in requests)``, logs in discovery order (the side's root log first, then
the pid folders sorted by name); "later" and "first" mean by position.

**Steps.** Every dispatch record is one of:

* a *decode step* (``phase == "decode"`` or ``attn_state == "DecodeOnly"``): counted
  ``decode_only``; each of its requests is seen decoding;
* a *speculative step* (``attn_state == "SpecDecoding"``): counted ``spec_decoding``; a new
  request in it gets ``spec_decoding``, a cached one is seen decoding;
* a *prefill step* otherwise. Its *target* is the request named by ``scoped_request_id`` (the
  pair is then ``scoped`` when the step holds several requests), else its only request; a step
  of several requests and no scoped id has none and is counted ``multi_request_step``.

In a prefill step, a *cached* request is a *decode* when it is scheduled one token, or one
plus its ``spec_tokens`` (the speculative tokens, when the log holds them); any other cached
request is a *continuation* (a later chunk, or a request resumed after preemption). Every
request other than the target gets: ``new`` -> ``multi_request_step``; a decode -> seen
decoding; a continuation -> ``chunked_prefill``. The target gets, first rule that applies:

1. cached: a decode -> the step counts ``decode_only``; a continuation -> ``chunked_prefill``;
2. ``num_computed_tokens > 0`` -> ``prefix_cache_hit``;
3. ``prompt_tokens`` present and ``tokens < prompt_tokens`` -> ``chunked_prefill``;
4. not scoped and ``attn_state`` ``ChunkedPrefill`` -> ``chunked_prefill``, ``PrefillCacheHit``
   -> ``prefix_cache_hit``;
5. ``prompt_tokens`` absent (the recipe's format) and a continuation of the same vLLM id on the
   same worker at a later position -> ``chunked_prefill`` (the target was the first chunk);
6. ``dumped: false`` -> ``not_dumped``;
7. otherwise it is a *usable prefill* of its request (the step is not counted yet).

Each target that is not usable counts its step once under its reason.

**Training.** A micro batch of one id is a *usable micro batch* of that request; of several
ids, counted ``multi_request_micro_batch`` (each id is seen in one); of none, ``no_request_id``.

**Matching.** For each request with at least one usable prefill and one usable micro batch,
in sorted id order:

1. n>1: only the lowest child (no child before child 0) is kept; every other child's usable
   prefill is listed as a ``rollout_step`` ``duplicate_id``;
2. each step's dump folder is located (``dump_path``, then the log's folder, then the side's
   root; ``step{N}``/``step_{N}``, then the rank folder): ``dump_missing`` or ``outside_run``
   per step when that fails; nothing left on a side -> the request is ``dump_missing``;
3. per rank the first wins: rollout by ``(timestamp, pid, step, line)``; training ``log_prob``
   first, then by ``(timestamp, pid, step, line)``; the others are listed ``duplicate_id`` /
   ``repeated_micro_batch``;
4. tensor parallelism: the same number of ranks on both sides -> rank *i* with rank *i*
   (sorted); otherwise the lowest with the lowest, and every other rank is listed
   ``tp_sharding_mismatch``;
5. both ``dump.json`` of each pair must be regular files holding msprobe's JSON (bare NaN and
   Infinity allowed), and ``stack.json``/``construct.json``, if present, regular files: else
   the pair is dropped and the folder listed ``dump_unreadable``; a request whose every pair
   was dropped is ``dump_unreadable``.

**One verdict per request.** Every request seen in a valid line, on either side, ends in
exactly one place: at least one pair, or one ``request`` entry whose reason is, first rule
that applies:

* usable prefill and usable micro batch: as the matching said (``dump_missing``,
  ``dump_unreadable``), or paired;
* usable prefill, no usable micro batch: ``multi_request_micro_batch`` if a multi-request micro
  batch holds it, else ``no_training_micro_batch``;
* no usable prefill: the reason of its first unusable appearance (a new request or a
  continuation, by position); else ``decode_only`` if it was seen decoding; else
  ``no_rollout_prefill``.

``requests_seen == requests_paired + requests_unpaired`` (the manifest's pairing summary).

**Limits.** The recipe's format has no ``prompt_tokens``, ``num_computed_tokens`` nor
``attn_state``: a prefix-cache hit cannot be seen in it, and a last chunk of exactly one token
(or one plus ``spec_tokens``) is a decode by the rule above, so a first chunk followed only by
such a chunk looks whole. Our dispatch hook logs ``spec_tokens`` (vLLM's
``scheduled_spec_decode_tokens``); the recipe's log does not, and without it a speculative
decode in a mixed step counts as a continuation, which can only cost a pair (the earlier
prefill is then taken for a chunk), never make a wrong one.
Step-level entries (``rollout_step``, ``actor_step``, ``log_line``) come on top of the
request entries, and every reason is counted; each (subject, reason) is listed up to
``LIST_CAP`` entries.

The reading loop runs once per log line, so it works on plain dicts and tuples; pydantic objects
are built only for what survives (pairs, listed reasons).
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

from verl_consistency.patches.contracts import records
from verl_consistency.postprocess import discover
from verl_consistency.postprocess.discover import LogFile, Roots, Side
from verl_consistency.postprocess.model import DumpRef, Pair, Unpaired, UnpairedReason

R = UnpairedReason

LIST_CAP = 10_000
"""Reported reasons listed one by one per (subject, reason); beyond that they are only counted."""

TP_RULE = (
    "rank i <-> rank i (sorted) when both sides hold the request on the same number of ranks; "
    "otherwise lowest rank <-> lowest rank, the other ranks reported as tp_sharding_mismatch"
)

Progress = Callable[[str, int, int], None]
"""(stage, done, total) — the CLI turns it into progress bars."""

_SUFFIX_RE = re.compile(r"-[0-9a-f]{8}")
_CHILD_RE = re.compile(r"([0-9]+)_(.+)", re.DOTALL)
_TYPES = frozenset(("new", "cached"))
_STR = frozenset((str,))
_INT = frozenset((int,))
_ENTRY = (
    "each request needs a string request_id (and in a prefill step type 'new' or 'cached' and integer tokens)"
)


def request_key(vid: str, train: Container[str]) -> tuple[str, int | None]:
    """The request (verl's id) a vLLM id names, and its n>1 child index (see the rules above)."""
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


@dataclass(slots=True)
class _Cand:
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


@dataclass
class PairingResult:
    roots: Roots
    pairs: list[Pair]
    unpaired: list[Unpaired]
    counts: dict[str, dict[str, int]]
    logs: list[LogFile]
    dispatch_records: int
    actor_records: int
    requests_seen: int = 0
    requests_paired: int = 0
    tp_rule: str = TP_RULE

    @property
    def requests_unpaired(self) -> int:
        return sum(self.counts.get("request", {}).values())

    @property
    def truncated(self) -> bool:
        return any(n > LIST_CAP for by in self.counts.values() for n in by.values())


def pair_run(
    roots: Roots,
    *,
    default_backend: Literal["fsdp", "megatron"] = "fsdp",
    progress: Progress | None = None,
    check_dumps: bool = True,
) -> PairingResult:
    rep = Reporter()
    roll_logs = discover.find_logs(roots, "rollout", rep)
    act_logs = discover.find_logs(roots, "actor", rep)
    if not roll_logs and not act_logs:
        raise discover.BadInput(
            f"no {records.DISPATCH_LOG} under {roots.rollout} and no "
            f"{records.UPDATE_ACTOR_LOG} under {roots.actor}: was the run made with the patched "
            "verl/vllm-ascend and DUMP_ON=1?"
        )
    tick = progress or (lambda _s, _d, _t: None)

    singles, multi_ids, train, n_actor = _read_actor(act_logs, rep, tick)
    ro = _read_rollout(roll_logs, train, rep, tick)

    roll_by_key: dict[str, list[_Cand]] = defaultdict(list)
    for c in ro.usable:
        roll_by_key[c.key].append(c)
    act_by_key: dict[str, list[_Cand]] = defaultdict(list)
    for c in singles:
        act_by_key[c.key].append(c)

    pairs: list[Pair] = []
    pair_key: list[str] = []
    used_ids: set[str] = set()
    keys = sorted(roll_by_key)
    for i, key in enumerate(keys):
        tick("match", i + 1, len(keys))
        acts = act_by_key.get(key)
        if not acts:
            if key in multi_ids:
                rep.request(
                    key,
                    R.MULTI_REQUEST_MICRO_BATCH,
                    "its training micro batches held other requests too",
                )
            else:
                rep.request(
                    key,
                    R.NO_TRAINING_MICRO_BATCH,
                    "no update_actor_log line holds this request (not captured, or filtered out)",
                )
            continue
        rolls = _pick_child(roll_by_key[key], rep)
        rolls = [c for c in rolls if _locate(roots, c, rep)]
        acts = [c for c in acts if _locate(roots, c, rep)]
        if not rolls or not acts:
            side = "rollout" if not rolls else "actor"
            rep.request(key, R.DUMP_MISSING, "no dump folder left on the {} side", side)
            continue
        roll_group = _first_per_rank(
            rolls,
            rep,
            "rollout_step",
            R.DUPLICATE_ID,
            "the same request was prefilled again on this rank; the first is paired",
        )
        act_group = _first_per_rank(
            acts,
            rep,
            "actor_step",
            R.REPEATED_MICRO_BATCH,
            "a later micro batch of the same request (another phase, epoch or "
            "mini batch); the first log_prob one is paired",
        )
        for r, a in _match_ranks(roll_group, act_group, rep):
            pairs.append(_make_pair(r, a, default_backend, used_ids))
            pair_key.append(key)

    # Every other request seen anywhere: one verdict each.
    first_by_key: dict[str, tuple[UnpairedReason, int, int, int]] = {}
    for vid, v in ro.first.items():
        k = request_key(vid, train)[0]
        cur = first_by_key.get(k)
        if cur is None or v[1:] < cur[1:]:
            first_by_key[k] = v
    # A vid with a usable or unusable prefill already has its verdict source; only the rest
    # (whose prefill no log holds) can end as decode_only.
    usable_vids = {c.vllm_id for c in ro.usable}
    decode_keys = {
        request_key(v, train)[0] for v in ro.decode_vids if v not in ro.first and v not in usable_vids
    }
    seen: dict[str, None] = dict.fromkeys(train)
    seen.update(dict.fromkeys(roll_by_key))
    seen.update(dict.fromkeys(first_by_key))
    seen.update(dict.fromkeys(sorted(decode_keys)))
    # Grouped by reason first, so that a large run's hundreds of thousands of unpaired requests
    # cost a few list appends each; entries are built only for the listed ones.
    by_first: dict[UnpairedReason, list[str]] = defaultdict(list)
    only_decoding: list[str] = []
    nowhere: list[str] = []
    fget = first_by_key.get
    for key in seen:
        if key in roll_by_key:
            continue
        hit = fget(key)
        if hit is not None:
            by_first[hit[0]].append(key)
        elif key in decode_keys:
            only_decoding.append(key)
        else:
            nowhere.append(key)
    for why, group in by_first.items():
        for key in rep.requests(why, group):
            _, li, lineno, _ = first_by_key[key]
            rep.list_request(
                key, why, f"no usable prefill: {why.value}, e.g. {roll_logs[li].virtual}:{lineno}"
            )
    for key in rep.requests(R.DECODE_ONLY, only_decoding):
        rep.list_request(key, R.DECODE_ONLY, "seen only decoding: its prefill is in no dispatch log line")
    for key in rep.requests(R.NO_ROLLOUT_PREFILL, nowhere):
        rep.list_request(key, R.NO_ROLLOUT_PREFILL, "no dispatch_log line holds this request")

    if check_dumps:
        keep = _check_dumps(roots, pairs, rep, tick)
        dropped: dict[str, str] = {}
        for k, bad in zip(pair_key, keep, strict=True):
            if bad:
                dropped.setdefault(k, bad)
        pairs = [p for p, bad in zip(pairs, keep, strict=True) if not bad]
        pair_key = [k for k, bad in zip(pair_key, keep, strict=True) if not bad]
        kept = set(pair_key)
        for k, bad in dropped.items():
            if k not in kept:
                rep.request(k, R.DUMP_UNREADABLE, "{}", bad)
    paired = set(pair_key)

    return PairingResult(
        roots,
        pairs,
        rep.listed,
        rep.nested_counts(),
        roll_logs + act_logs,
        ro.n,
        n_actor,
        requests_seen=len(seen),
        requests_paired=len(paired),
    )


def _bad(rep: Reporter, log: LogFile, lineno: int, detail: str) -> None:
    rep(Unpaired(subject="log_line", ref=f"{log.virtual}:{lineno}", reason=R.BAD_LOG_LINE, detail=detail))


def _read_actor(
    logs: list[LogFile], rep: Reporter, tick: Progress
) -> tuple[list[_Cand], set[str], dict[str, None], int]:
    """Single-request micro batches, the ids seen in multi-request ones, and every training id
    (read first: the training logs are the smaller side, and their ids name the requests)."""
    singles: list[_Cand] = []
    multi_ids: set[str] = set()
    train_order: list[str] = []
    n = multi = empty = 0
    for li, log in enumerate(logs):
        tick("actor logs", li, len(logs))
        for lineno, o in discover.iter_jsonl(log, rep):
            n += 1
            try:
                ids = o["request_ids"]
                step, rank, pid = o["step"], o["rank"], o["pid"]
                if type(step) is not int or type(rank) is not int or type(pid) is not int:
                    raise TypeError("step, rank and pid must be integers")
                if type(ids) is not list:
                    raise TypeError("request_ids must be a list")
                if not set(map(type, ids)) <= _STR:
                    raise TypeError("request_ids must hold strings")
            except (KeyError, TypeError, AttributeError) as exc:
                _bad(rep, log, lineno, f"not an update_actor record: {_why(exc)}")
                continue
            train_order.extend(ids)
            if len(ids) == 1:
                rid = ids[0]
                dump_path = o.get("dump_path")
                phase = o.get("phase")
                ts = str(o.get("timestamp", ""))
                singles.append(
                    _Cand(
                        "actor",
                        rid,
                        rid,
                        None,
                        pid,
                        rank,
                        step,
                        ts,
                        (phase != "log_prob", ts, pid, step, lineno),
                        f"{log.virtual}:{lineno}",
                        log,
                        dump_path if isinstance(dump_path, str) else None,
                        phase=phase if isinstance(phase, str) else None,
                        backend=o.get("backend"),
                    )
                )
            elif not ids:
                empty += 1
            else:
                multi += 1
                multi_ids.update(ids)
    tick("actor logs", len(logs), len(logs))
    if multi:
        rep.bulk("actor_step", R.MULTI_REQUEST_MICRO_BATCH, multi)
    if empty:
        rep.bulk("actor_step", R.NO_REQUEST_ID, empty)
    return singles, multi_ids, dict.fromkeys(train_order), n


_Pos = tuple[int, int, int]
"""(log index, line, index in requests)."""


@dataclass
class _Rollout:
    usable: list[_Cand]
    first: dict[str, tuple[UnpairedReason, int, int, int]]
    """vLLM id -> (reason, position) of its first unusable new or continuation appearance."""
    decode_vids: set[str]
    n: int


def _earliest(
    first: dict[str, tuple[UnpairedReason, int, int, int]], vid: str, why: UnpairedReason, pos: _Pos
) -> None:
    """Keep the earliest unusable appearance: the step's other requests were noted before its
    target, and deferred targets are resolved after the whole log."""
    prev = first.get(vid)
    if prev is None or pos < prev[1:]:
        first[vid] = (why, *pos)


def _is_decode(q: dict[str, Any]) -> bool:
    """A cached request in a prefill step: one token, or one plus its logged speculative tokens."""
    tokens = q["tokens"]
    if tokens == 1:
        return True
    spec = q.get("spec_tokens")
    return type(spec) is int and tokens == 1 + spec


def _read_rollout(logs: list[LogFile], train: Container[str], rep: Reporter, tick: Progress) -> _Rollout:
    """One pass over every dispatch log: the usable prefills, and for every other vLLM id where
    it was first seen unusable, or that it was seen decoding. Decode steps cost one set update."""
    usable: list[_Cand] = []
    first: dict[str, tuple[UnpairedReason, int, int, int]] = {}
    decode_vids: set[str] = set()
    get_id, get_tokens, get_type = itemgetter("request_id"), itemgetter("tokens"), itemgetter("type")
    conts: dict[tuple[int, int, str], _Pos] = {}
    deferred: list[tuple[_Cand, bool, _Pos]] = []
    bulk: Counter[UnpairedReason] = Counter()
    n = decode = 0
    for li, log in enumerate(logs):
        tick("rollout logs", li, len(logs))
        for lineno, o in discover.iter_jsonl(log, rep):
            n += 1
            try:
                phase = o["phase"]
                reqs = o["requests"]
                step, rank, pid = o["step"], o["rank"], o["pid"]
                if type(step) is not int or type(rank) is not int or type(pid) is not int:
                    raise TypeError("step, rank and pid must be integers")
                if type(reqs) is not list:
                    raise TypeError("requests must be a list")
                # Checked in C loops: most lines are decode steps of several requests.
                vids = list(map(get_id, reqs))
                if not set(map(type, vids)) <= _STR:
                    raise TypeError(_ENTRY)
                attn = o.get("attn_state")
                if phase == "decode" or attn == "DecodeOnly":
                    if phase != "decode" and phase != "prefill":
                        raise TypeError(f"phase {phase!r} is neither prefill nor decode")
                    decode += 1
                    decode_vids.update(vids)
                    continue
                if phase != "prefill":
                    raise TypeError(f"phase {phase!r} is neither prefill nor decode")
                if not (set(map(type, map(get_tokens, reqs))) <= _INT and set(map(get_type, reqs)) <= _TYPES):
                    raise TypeError(_ENTRY)
                if not reqs:
                    raise TypeError("a prefill step with no requests")
                captured = o.get("scoped_request_id") or o.get("captured_request_id")
                target = -1
                if captured is not None:
                    target = next((i for i, q in enumerate(reqs) if q["request_id"] == captured), -1)
                    if target < 0:
                        raise TypeError(f"scoped_request_id {captured!r} is not among the step's requests")
                elif len(reqs) == 1:
                    target = 0
                if target >= 0:
                    t = reqs[target]
                    prompt = t.get("prompt_tokens")
                    computed = t.get("num_computed_tokens")
                    if (prompt is not None and type(prompt) is not int) or (
                        computed is not None and type(computed) is not int
                    ):
                        raise TypeError("prompt_tokens and num_computed_tokens must be integers")
            except (KeyError, TypeError, AttributeError) as exc:
                _bad(rep, log, lineno, f"not a dispatch_logger record: {_why(exc)}")
                continue

            if attn == "SpecDecoding":
                bulk[R.SPEC_DECODING] += 1
                for i, q in enumerate(reqs):
                    vid = q["request_id"]
                    if q["type"] == "new":
                        if vid not in first:
                            first[vid] = (R.SPEC_DECODING, li, lineno, i)
                    else:
                        decode_vids.add(vid)
                continue
            for i, q in enumerate(reqs):
                if i == target:
                    continue
                vid = q["request_id"]
                if q["type"] == "new":
                    if vid not in first:
                        first[vid] = (R.MULTI_REQUEST_STEP, li, lineno, i)
                elif _is_decode(q):
                    decode_vids.add(vid)
                else:
                    conts[(pid, rank, vid)] = (li, lineno, i)
                    if vid not in first:
                        first[vid] = (R.CHUNKED_PREFILL, li, lineno, i)
            if target < 0:
                bulk[R.MULTI_REQUEST_STEP] += 1
                continue
            vid = t["request_id"]
            pos = (li, lineno, target)
            if t["type"] == "cached":
                if _is_decode(t):
                    bulk[R.DECODE_ONLY] += 1
                    decode_vids.add(vid)
                else:
                    bulk[R.CHUNKED_PREFILL] += 1
                    conts[(pid, rank, vid)] = pos
                    _earliest(first, vid, R.CHUNKED_PREFILL, pos)
                continue
            tokens = t["tokens"]
            scoped = target >= 0 and len(reqs) > 1
            if computed is not None and computed > 0:
                why = R.PREFIX_CACHE_HIT
            elif (prompt is not None and tokens < prompt) or (not scoped and attn == "ChunkedPrefill"):
                why = R.CHUNKED_PREFILL
            elif not scoped and attn == "PrefillCacheHit":
                why = R.PREFIX_CACHE_HIT
            else:
                key, child = request_key(vid, train)
                dump_path = o.get("dump_path")
                ts = str(o.get("timestamp", ""))
                cand = _Cand(
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
                )
                dumped = o.get("dumped", True) is not False
                if prompt is None:
                    deferred.append((cand, dumped, pos))  # rule 5 needs the whole log
                    continue
                if dumped:
                    usable.append(cand)
                    continue
                why = R.NOT_DUMPED
            bulk[why] += 1
            _earliest(first, vid, why, pos)
    tick("rollout logs", len(logs), len(logs))
    for cand, dumped, pos in deferred:
        last = conts.get((cand.pid, cand.rank, cand.vllm_id))
        if last is not None and last > pos:
            why = R.CHUNKED_PREFILL
        elif not dumped:
            why = R.NOT_DUMPED
        else:
            usable.append(cand)
            continue
        bulk[why] += 1
        _earliest(first, cand.vllm_id, why, pos)
    if decode:
        bulk[R.DECODE_ONLY] += decode
    for reason, k in bulk.items():
        rep.bulk("rollout_step", reason, k)
    return _Rollout(usable, first, decode_vids, n)


def _why(exc: Exception) -> str:
    return f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)


def _pick_child(rolls: list[_Cand], rep: Reporter) -> list[_Cand]:
    """n>1: the training side cannot tell siblings apart (same prompt), so the lowest child pairs."""
    children = sorted({c.child for c in rolls}, key=lambda c: -1 if c is None else c)
    if len(children) == 1:
        return rolls
    keep = children[0]
    for c in rolls:
        if c.child != keep:
            rep(
                Unpaired(
                    subject="rollout_step",
                    ref=c.ref,
                    reason=R.DUPLICATE_ID,
                    detail=f"n>1 sibling {c.child}_{c.key}; child {keep} of the same prompt is paired",
                )
            )
    return [c for c in rolls if c.child == keep]


def _first_per_rank(
    cands: list[_Cand],
    rep: Reporter,
    subject: Literal["rollout_step", "actor_step"],
    reason: UnpairedReason,
    detail: str,
) -> list[_Cand]:
    best: dict[int, _Cand] = {}
    for c in sorted(cands, key=lambda c: c.order):
        if c.rank in best:
            rep(Unpaired(subject=subject, ref=c.dir or c.ref, reason=reason, detail=detail))
        else:
            best[c.rank] = c
    return [best[r] for r in sorted(best)]


def _match_ranks(rolls: list[_Cand], acts: list[_Cand], rep: Reporter) -> list[tuple[_Cand, _Cand]]:
    if len(rolls) == len(acts):
        return list(zip(rolls, acts, strict=True))
    detail = (
        f"rollout holds the request on {len(rolls)} rank(s), training on {len(acts)}: sharding differs, "
        f"so only rollout rank {rolls[0].rank} <-> training rank {acts[0].rank} is paired"
    )
    for c in rolls[1:]:
        rep(
            Unpaired(subject="rollout_step", ref=c.dir or c.ref, reason=R.TP_SHARDING_MISMATCH, detail=detail)
        )
    for c in acts[1:]:
        rep(Unpaired(subject="actor_step", ref=c.dir or c.ref, reason=R.TP_SHARDING_MISMATCH, detail=detail))
    return [(rolls[0], acts[0])]


def _locate(roots: Roots, c: _Cand, rep: Reporter) -> bool:
    """Find the step's dump folder: the record's ``dump_path`` first, then the log's own folder,
    then (recipe-style actor dumps) the side's root. Sets ``c.dir`` (virtual) on success."""
    subject: Literal["rollout_step", "actor_step"] = "rollout_step" if c.side == "rollout" else "actor_step"
    bases: list[Path] = []
    if c.dump_path:
        p = roots.resolve_dump_path(c.side, c.dump_path)
        if p is None:
            rep(
                Unpaired(
                    subject=subject,
                    ref=c.ref,
                    reason=R.OUTSIDE_RUN,
                    detail=f"dump_path {c.dump_path!r} is outside the {c.side} dump folder; not followed",
                )
            )
            return False
        bases.append(p)
    bases += [c.log.dir, roots.root(c.side)]
    tried: list[str] = []
    for base in dict.fromkeys(bases):
        sd = discover.step_dir(base, c.step)
        if sd is None:
            tried.append(f"{base}/step{c.step}")
            continue
        rd = discover.rank_dir(sd, c.rank, c.pid)
        if rd is None:
            tried.append(f"{sd}/rank{c.rank}")
            continue
        real = roots.contain(c.side, rd / "dump.json")
        if real is None:
            dangling = not os.path.exists(rd / "dump.json")
            rep(
                Unpaired(
                    subject=subject,
                    ref=c.ref,
                    reason=R.DUMP_MISSING if dangling else R.OUTSIDE_RUN,
                    detail=f"{rd}/dump.json is a dangling symlink"
                    if dangling
                    else f"{rd}/dump.json leads outside the {c.side} dump folder",
                )
            )
            return False
        c.dir = roots.to_virtual(c.side, real.parent)
        return True
    rep(
        Unpaired(
            subject=subject,
            ref=c.ref,
            reason=R.DUMP_MISSING,
            detail="no dump folder; looked at " + ", ".join(tried),
        )
    )
    return False


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)


def _make_pair(r: _Cand, a: _Cand, default_backend: str, used: set[str]) -> Pair:
    child = f".c{r.child}" if r.child is not None else ""
    pid = f"{_safe(r.key)}{child}.r{r.rank}.a{a.rank}"
    k, candidate = 1, pid
    while candidate in used:
        k += 1
        candidate = f"{pid}.{k}"
    used.add(candidate)
    backend = a.backend if a.backend in ("fsdp", "megatron") else default_backend
    assert r.dir is not None
    assert a.dir is not None
    return Pair(
        pair_id=candidate,
        request_id=r.key,
        vllm_request_id=r.vllm_id,
        rollout=DumpRef(side="rollout", pid=r.pid, rank=r.rank, step=r.step, dir=r.dir),
        actor=DumpRef(side="actor", pid=a.pid, rank=a.rank, step=a.step, dir=a.dir),
        backend=backend,  # type: ignore[arg-type]
        prompt_tokens=r.prompt_tokens,
        scoped=r.scoped,
    )


def _check_dumps(roots: Roots, pairs: list[Pair], rep: Reporter, tick: Progress) -> list[str]:
    """Parse both dump.json files of every pair: a truncated or corrupt one drops the pair with
    ``dump_unreadable`` instead of failing compare later, and so does a stack.json or
    construct.json that is a fifo, socket, device or folder (compare would hang or fail on it).
    Also learns the dump task. Returns, per pair, '' (kept) or why it was dropped; kept pairs
    are updated in place with their task."""
    out: list[str] = []
    tasks: dict[str, str | None] = {}
    for i, p in enumerate(pairs):
        tick("check dumps", i, len(pairs))
        bad = ""
        for ref in (p.rollout, p.actor):
            if ref.dir in tasks:
                if tasks[ref.dir] is None:
                    bad = f"{ref.dir}/dump.json is unreadable"
                continue
            folder = roots.to_real(ref.dir)
            try:
                obj = discover.read_dump_json(folder / "dump.json")
                for name in discover.DUMP_FILES[1:]:
                    kind = discover.not_regular(folder / name)
                    if kind and kind != "missing":
                        raise discover.DumpError(f"{name} is not a regular file ({kind})")
                tasks[ref.dir] = str(obj.get("task", "statistics"))
            except discover.DumpError as exc:
                tasks[ref.dir] = None
                bad = f"{ref.dir}: {exc}"
                rep(
                    Unpaired(
                        subject=f"{ref.side}_step",
                        ref=ref.dir,
                        reason=R.DUMP_UNREADABLE,  # type: ignore[arg-type]
                        detail=str(exc),
                    )
                )
        out.append(bad)
        if not bad and tasks[p.rollout.dir] == "tensor" and tasks[p.actor.dir] == "tensor":
            pairs[i] = p.model_copy(update={"task": "tensor"})
    tick("check dumps", len(pairs), len(pairs))
    return out
