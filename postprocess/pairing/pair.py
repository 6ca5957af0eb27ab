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
  ``scoped_request_id`` (or ``captured_request_id``) naming one of its requests; a
  ``lane_request_ids`` a list of distinct ids, each naming one of its requests; a
  ``weight_version`` an integer, null or absent.
* training: integer ``step``, ``rank``, ``pid``; ``request_ids`` a list of strings; a
  ``lane_request_ids`` a list of distinct ids among ``request_ids``; a ``weight_version`` an
  integer, null or absent.

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
* a *prefill step* otherwise. Its *targets* are the requests ``lane_request_ids`` names (per-request
  lanes: the k-th id's dump is the folder ``req{k}`` in the rank folder, and the pair is
  ``scoped`` when the step holds several requests); without lanes, its *target* is the request
  named by ``scoped_request_id`` (the pair is then ``scoped`` when the step holds several
  requests), else its only request; a step of several requests and neither has none and is
  counted ``multi_request_step``.

In a prefill step, a *cached* request is a *decode* when it is scheduled one token, or one
plus its ``spec_tokens`` (the speculative tokens, when the log holds them); any other cached
request is a *continuation* (a later chunk, or a request resumed after preemption). Every
request other than a target gets: ``new`` -> ``multi_request_step``; a decode -> seen
decoding; a continuation -> ``chunked_prefill``. Each target gets, first rule that applies:

1. cached: a decode -> the step counts ``decode_only``; a continuation -> ``chunked_prefill``;
2. ``num_computed_tokens > 0`` -> ``prefix_cache_hit``;
3. ``prompt_tokens`` present and ``tokens < prompt_tokens`` -> ``chunked_prefill``;
4. not scoped and ``attn_state`` ``ChunkedPrefill`` -> ``chunked_prefill``, ``PrefillCacheHit``
   -> ``prefix_cache_hit``;
5. ``prompt_tokens`` absent (the recipe's format) and a continuation of the same vLLM id on the
   same worker at a later position -> ``chunked_prefill`` (the target was the first chunk);
6. ``dumped: false`` -> ``not_dumped``;
7. otherwise it is a *usable prefill* of its request (the step is not counted yet).

Each target that is not usable counts its step once under its reason (a step of several lanes
counts once per such target).

**Training.** A micro batch of one id is a *usable micro batch* of that request; each id of
``lane_request_ids`` has a usable micro batch of its own (lane k: the folder ``req{k}``); of
several ids and no lanes (or ids beside the lanes), counted ``multi_request_micro_batch`` (each
such id is seen in one); of none, ``no_request_id``.

**Matching.** For each request with at least one usable prefill and one usable micro batch,
in sorted id order:

1. n>1: only the lowest child (no child before child 0) is kept; every other child's usable
   prefill is listed as a ``rollout_step`` ``duplicate_id``;
2. weights (``weight_versions.py``): a step's *version* is its record's ``weight_version``, or
   none. When both sides hold at least one version, the request's version is the lowest ``v``
   for which each side has a step of version ``v`` or of none; every step of another version
   is listed as a ``rollout_step`` / ``actor_step`` ``weights_differ``. No such ``v`` -> the
   request is ``weights_differ`` (its detail names both sides' versions). A side with no
   version at all (older logs, the recipe's format) sets nothing aside;
3. each step's dump folder is located (``dump_path``, then the log's folder, then the side's
   root; ``step{N}``/``step_{N}``, then the rank folder, then a lane's ``req{k}``):
   ``dump_missing`` or ``outside_run``
   per step when that fails; nothing left on a side -> the request is ``dump_missing``;
4. per rank the first wins: rollout by ``(timestamp, pid, step, line)``; training ``log_prob``
   first, then by ``(timestamp, pid, step, line)``; the others are listed ``duplicate_id`` /
   ``repeated_micro_batch``;
5. tensor parallelism: the same number of ranks on both sides -> rank *i* with rank *i*
   (sorted); otherwise the lowest with the lowest, and every other rank is listed
   ``tp_sharding_mismatch``;
6. both ``dump.json`` of each pair must be regular files holding msprobe's JSON (bare NaN and
   Infinity allowed), and ``stack.json``/``construct.json``, if present, regular files: else
   the pair is dropped and the folder listed ``dump_unreadable``; a request whose every pair
   was dropped is ``dump_unreadable``.

**One verdict per request.** Every request seen in a valid line, on either side, ends in
exactly one place: at least one pair, or one ``request`` entry whose reason is, first rule
that applies:

* usable prefill and usable micro batch: as the matching said (``weights_differ``,
  ``dump_missing``, ``dump_unreadable``), or paired;
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

from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from verl_consistency.contracts import records
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.candidates import Candidate, Progress, request_key
from verl_consistency.postprocess.pairing.discover import LogFile, Roots
from verl_consistency.postprocess.pairing.micro_batches import read_actor
from verl_consistency.postprocess.pairing.pair_types import Pair, Unpaired, UnpairedReason
from verl_consistency.postprocess.pairing.prefill_targets import First, RolloutSteps, read_rollout
from verl_consistency.postprocess.pairing.reasons import LIST_CAP, Reporter
from verl_consistency.postprocess.pairing.request_match import (
    Matched,
    drop_unreadable,
    locate,
    match_requests,
    pick_child,
)

R = UnpairedReason

TP_RULE = (
    "rank i <-> rank i (sorted) when both sides hold the request on the same number of ranks; "
    "otherwise lowest rank <-> lowest rank, the other ranks reported as tp_sharding_mismatch"
)


@dataclass
class RolloutIndex:
    """The rollout side by request (verl's id), as the pairing read it. Kept so that a request
    no training micro batch holds (a check run's batched-pass id, ``postprocess/compare/batch_variance.py``)
    can still be found, with the same rules and no second pass over the logs."""

    prefills: dict[str, list[Candidate]]
    """Every request with a usable prefill (the matching's ``prefilled``)."""
    first: dict[str, First]
    """Requests with no usable prefill: the reason and position of their first unusable appearance."""
    decoding: set[str]
    """Requests seen only decoding."""
    logs: list[LogFile]
    """The rollout logs, in the order ``first``'s positions index."""


@dataclass(frozen=True)
class RolloutDump:
    """Where one request's rollout prefill was dumped (:func:`rollout_dump`), or why it cannot be used."""

    request_id: str
    by_rank: dict[int, Candidate]
    """Rank -> its first usable, located prefill (``Candidate.dir`` set). Empty when ``reason``."""
    reason: UnpairedReason | None = None
    detail: str = ""


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
    rollout: RolloutIndex | None = None
    """The rollout side by request (None when no log was read)."""

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
    """The rules above, on one run: read both sides, match, then one verdict per request."""
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

    tb = read_actor(act_logs, rep, tick)
    ro = read_rollout(roll_logs, tb.train, rep, tick)
    matched = match_requests(roots, ro.usable, tb.singles, tb.multi_ids, rep, tick, default_backend)
    first_by_key, decode_keys = _by_key(ro, tb.train)
    seen = _verdicts(tb.train, matched, first_by_key, decode_keys, roll_logs, rep)
    if check_dumps:
        matched = drop_unreadable(roots, matched, rep, tick)

    return PairingResult(
        roots,
        matched.pairs,
        rep.listed,
        rep.nested_counts(),
        roll_logs + act_logs,
        ro.n,
        tb.n,
        requests_seen=seen,
        requests_paired=len(set(matched.keys)),
        rollout=RolloutIndex(matched.prefilled, first_by_key, decode_keys, roll_logs),
    )


def rollout_dump(result: PairingResult, request_id: str) -> RolloutDump:
    """The rollout dumps of one request (verl's id) by rank, by the rules above, whether or not a
    training micro batch holds it: Matching step 1 (lowest n>1 child) and steps 3-4 (locate; the
    first prefill per rank), or the request's verdict when it has no usable prefill (the
    reasons of "One verdict per request" that do not need the training side)."""
    index = result.rollout
    if index is None:
        return RolloutDump(request_id, {}, R.NO_ROLLOUT_PREFILL, "no dispatch log was read")
    rep = Reporter()  # what this finds was reported by pair_run already
    cands = index.prefills.get(request_id)
    if cands:
        located = [c for c in pick_child(cands, rep) if locate(result.roots, c, rep)]
        if not located:
            why = rep.listed[-1].detail if rep.listed else "no dump folder left"
            return RolloutDump(request_id, {}, R.DUMP_MISSING, why)
        by_rank: dict[int, Candidate] = {}
        for c in sorted(located, key=lambda c: c.order):
            by_rank.setdefault(c.rank, c)
        return RolloutDump(request_id, dict(sorted(by_rank.items())))
    hit = index.first.get(request_id)
    if hit is not None:
        why, li, lineno, _ = hit
        return RolloutDump(
            request_id, {}, why, f"no usable prefill: {why.value}, e.g. {index.logs[li].virtual}:{lineno}"
        )
    if request_id in index.decoding:
        return RolloutDump(
            request_id, {}, R.DECODE_ONLY, "seen only decoding: its prefill is in no dispatch log line"
        )
    return RolloutDump(request_id, {}, R.NO_ROLLOUT_PREFILL, "no dispatch_log line holds this request")


def _by_key(ro: RolloutSteps, train: dict[str, None]) -> tuple[dict[str, First], set[str]]:
    """By request: the first unusable appearance, and the requests seen only decoding."""
    first_by_key: dict[str, First] = {}
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
    return first_by_key, decode_keys


def _verdicts(
    train: dict[str, None],
    matched: Matched,
    first_by_key: dict[str, First],
    decode_keys: set[str],
    roll_logs: list[LogFile],
    rep: Reporter,
) -> int:
    """One verdict for every request seen that has no usable prefill (the matching gave the
    others theirs); returns how many requests were seen in all."""
    prefilled = matched.prefilled
    seen: dict[str, None] = dict.fromkeys(train)
    seen.update(dict.fromkeys(prefilled))
    seen.update(dict.fromkeys(first_by_key))
    seen.update(dict.fromkeys(sorted(decode_keys)))
    # Grouped by reason first, so that a large run's hundreds of thousands of unpaired requests
    # cost a few list appends each; entries are built only for the listed ones.
    by_first: dict[UnpairedReason, list[str]] = defaultdict(list)
    only_decoding: list[str] = []
    nowhere: list[str] = []
    fget = first_by_key.get
    for key in seen:
        if key in prefilled:
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
    return len(seen)
