"""Pair vLLM prefill steps with training micro batches by request id.

Rules (the README's "Pairing rules" section is the user-facing copy):

* **Usable inference step**: a dumped prefill that holds exactly one request, of type ``new``,
  scheduled for its whole prompt (``tokens == prompt_tokens``: no chunked prefill) with nothing
  computed before (``num_computed_tokens == 0``: no prefix-cache hit). In request-scoped mode
  (``scoped_request_id`` on the record) a multi-request step is usable for the captured request
  alone, when that request meets the same test; the pair is marked ``scoped``. (The field is read
  from the raw record, so ``captured_request_id``, another spelling, is accepted too.)
* **Usable training step**: a micro batch holding exactly one request id.
* **Ids**: vLLM's trailing ``-[0-9a-f]{8}`` is stripped (``records.split_vllm_request_id``); n>1
  children ``{i}_{id}-{8hex}`` share their parent's id, and the lowest child is paired (its
  siblings are the same prompt and usually prefix-cache hits).
* **Repeats**: per rank the first occurrence wins — on the training side the ``log_prob`` phase
  first (same weights as the rollout), then the earliest; later ones are reported.
* **Tensor parallel**: every TP rank logs the same step. When both sides hold the request on the
  same number of ranks (vLLM TP = Megatron TP), rank *i* of the rollout group is paired with
  rank *i* of the training group (sorted by rank), since the shards match. When the counts differ
  (vLLM TP > 1 against unsharded FSDP), only the lowest rank of each side is paired — rollout
  rank 0's replicated modules (norms, all-reduced outputs) compare meaningfully, its shards do
  not — and every other rank is reported as ``tp_sharding_mismatch``; no rank goes unmentioned.

The reading loop runs once per log line, so it works on plain dicts and tuples; pydantic objects
are built only for what survives (pairs, reported reasons).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from verl_consistency.patches.contracts import records
from verl_consistency.patches.contracts.records import split_vllm_request_id
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

_NOT_WHOLE_STATES = {"ChunkedPrefill": R.CHUNKED_PREFILL, "PrefillCacheHit": R.PREFIX_CACHE_HIT}

Progress = Callable[[str, int, int], None]
"""(stage, done, total) — the CLI turns it into progress bars."""


@dataclass(slots=True)
class _Cand:
    """One usable step on one rank (rollout prefill or single-request micro batch)."""

    side: Side
    vllm_id: str
    base: str
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

    def bulk(self, subject: str, reason: UnpairedReason, n: int = 1) -> None:
        self.counts[(subject, reason.value)] += n

    def nested_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for (subject, reason), n in sorted(self.counts.items()):
            out[subject][reason] = n
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
    tp_rule: str = TP_RULE

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

    singles, multi_ids, n_actor = _read_actor(act_logs, rep, tick)
    usable, seen, n_dispatch = _read_rollout(roll_logs, {c.base for c in singles}, rep, tick)
    in_multi = {c.base for c in usable if c.base in multi_ids or c.vllm_id in multi_ids}

    roll_by_base: dict[str, list[_Cand]] = defaultdict(list)
    for c in usable:
        roll_by_base[c.base].append(c)
    act_by_base: dict[str, list[_Cand]] = defaultdict(list)
    for c in singles:
        act_by_base[c.base].append(c)

    pairs: list[Pair] = []
    used_ids: set[str] = set()
    bases = sorted(roll_by_base)
    for i, base in enumerate(bases):
        tick("match", i + 1, len(bases))
        acts = act_by_base.pop(base, [])
        if not acts:
            reason = R.MULTI_REQUEST_MICRO_BATCH if base in in_multi else R.NO_TRAINING_MICRO_BATCH
            detail = (
                "its training micro batches held other requests too"
                if base in in_multi
                else "no update_actor_log line holds this request (not captured, or filtered out)"
            )
            rep(Unpaired(subject="request", ref=base, reason=reason, detail=detail))
            continue
        rolls = _pick_child(base, roll_by_base[base], acts, rep)
        rolls = [c for c in rolls if _locate(roots, c, rep)]
        acts = [c for c in acts if _locate(roots, c, rep)]
        if not rolls or not acts:
            rep(
                Unpaired(
                    subject="request",
                    ref=base,
                    reason=R.DUMP_MISSING,
                    detail="no dump folder left on the " + ("rollout" if not rolls else "actor") + " side",
                )
            )
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

    for base in sorted(act_by_base):
        reason, li, lineno = seen.get(base, (R.NO_ROLLOUT_PREFILL, -1, 0))
        where = f"{roll_logs[li].virtual}:{lineno}" if li >= 0 else ""
        detail = (
            f"its prefill was unusable ({reason.value}), e.g. {where}"
            if where
            else "no dispatch_log line holds this request as a usable prefill"
        )
        rep(Unpaired(subject="request", ref=base, reason=reason, detail=detail))

    if check_dumps:
        pairs = _check_dumps(roots, pairs, rep, tick)
    return PairingResult(
        roots, pairs, rep.listed, rep.nested_counts(), roll_logs + act_logs, n_dispatch, n_actor
    )


def _bad(rep: Reporter, log: LogFile, lineno: int, detail: str) -> None:
    rep(Unpaired(subject="log_line", ref=f"{log.virtual}:{lineno}", reason=R.BAD_LOG_LINE, detail=detail))


def _read_actor(logs: list[LogFile], rep: Reporter, tick: Progress) -> tuple[list[_Cand], set[Any], int]:
    """Single-request micro batches, and every id seen in a multi-request one (read first: the
    training logs are the smaller side, and their ids tell the rollout pass what to explain)."""
    singles: list[_Cand] = []
    multi_ids: set[Any] = set()
    n = multi = empty = 0
    split = split_vllm_request_id
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
                if len(ids) == 1:
                    rid = ids[0]
                    if type(rid) is not str:
                        raise TypeError("request_ids must hold strings")
                    base, child = split(rid)
                    dump_path = o.get("dump_path")
                    phase = o.get("phase")
                    ts = str(o.get("timestamp", ""))
                    singles.append(
                        _Cand(
                            "actor",
                            rid,
                            base,
                            child,
                            pid,
                            rank,
                            step,
                            ts,
                            (phase not in (None, "log_prob"), ts, pid, step, lineno),
                            f"{log.virtual}:{lineno}",
                            log,
                            dump_path if isinstance(dump_path, str) else None,
                            phase=phase,
                            backend=o.get("backend"),
                        )
                    )
                elif not ids:
                    empty += 1
                else:
                    multi += 1
                    multi_ids.update(ids)
            except (KeyError, TypeError, AttributeError) as exc:
                _bad(rep, log, lineno, f"not an update_actor record: {_why(exc)}")
    tick("actor logs", len(logs), len(logs))
    if multi:
        rep.bulk("actor_step", R.MULTI_REQUEST_MICRO_BATCH, multi)
    if empty:
        rep.bulk("actor_step", R.NO_REQUEST_ID, empty)
    return singles, multi_ids, n


_Seen = dict[str, tuple[UnpairedReason, int, int]]
"""base id -> (why its prefill was unusable, log index, line): only for ids the training side has."""


def _note(seen: _Seen, wanted: set[str], vid: str, why: UnpairedReason, li: int, lineno: int) -> None:
    """Remember why ``vid``'s prefill was unusable, if the training side holds it alone. The
    slice test is a cheap pre-filter; the real suffix rule then confirms."""
    if vid[:-9] in wanted or vid in wanted or "_" in vid[:8]:
        base = split_vllm_request_id(vid)[0]
        if base in wanted and base not in seen:
            seen[base] = (why, li, lineno)


def _read_rollout(
    logs: list[LogFile], wanted: set[str], rep: Reporter, tick: Progress
) -> tuple[list[_Cand], _Seen, int]:
    """One pass over every dispatch log: the usable prefills, and why the prefills of requests
    that the training side holds alone were not usable. Decode steps cost one dict lookup."""
    usable: list[_Cand] = []
    seen: _Seen = {}
    bulk: Counter[UnpairedReason] = Counter()
    n = decode = 0
    split = split_vllm_request_id
    for li, log in enumerate(logs):
        tick("rollout logs", li, len(logs))
        for lineno, o in discover.iter_jsonl(log, rep):
            n += 1
            try:
                phase = o["phase"]
                reqs = o["requests"]
                if type(reqs) is not list:
                    raise TypeError("requests must be a list")
                attn = o.get("attn_state")
                if phase == "decode" or attn == "DecodeOnly":
                    decode += 1
                    continue
                step, rank, pid = o["step"], o["rank"], o["pid"]
                if type(step) is not int or type(rank) is not int or type(pid) is not int:
                    raise TypeError("step, rank and pid must be integers")
                if phase != "prefill":
                    raise TypeError(f"phase {phase!r} is neither prefill nor decode")
                if attn == "SpecDecoding":
                    bulk[R.SPEC_DECODING] += 1
                    continue
                captured = o.get("scoped_request_id") or o.get("captured_request_id")
                scoped = False
                if len(reqs) == 1:
                    req = reqs[0]
                elif captured is not None and len(reqs) > 1:
                    req = next((q for q in reqs if q["request_id"] == captured), None)
                    if req is None:
                        _bad(
                            rep,
                            log,
                            lineno,
                            f"scoped_request_id {captured!r} is not among the step's requests",
                        )
                        continue
                    scoped = True
                    for q in reqs:
                        if q is not req and q.get("type") == "new":
                            _note(seen, wanted, q["request_id"], R.MULTI_REQUEST_STEP, li, lineno)
                elif not reqs:
                    _bad(rep, log, lineno, "a prefill step with no requests")
                    continue
                else:
                    bulk[R.MULTI_REQUEST_STEP] += 1
                    for q in reqs:
                        if q["type"] == "new":
                            _note(seen, wanted, q["request_id"], R.MULTI_REQUEST_STEP, li, lineno)
                    continue
                vid, tokens = req["request_id"], req["tokens"]
                if type(vid) is not str or type(tokens) is not int:
                    raise TypeError("request_id must be a string and tokens an integer")
                prompt = req.get("prompt_tokens")
                computed = req.get("num_computed_tokens") or 0
                # A prefix-cache hit also schedules fewer tokens than the prompt: test it first.
                if computed > 0 and req.get("type") == "new":
                    why = R.PREFIX_CACHE_HIT
                elif req.get("type") != "new" or (prompt is not None and tokens < prompt):
                    why = R.CHUNKED_PREFILL
                elif not scoped and attn in _NOT_WHOLE_STATES:
                    why = _NOT_WHOLE_STATES[attn]
                elif o.get("dumped", True) is False:
                    why = R.NOT_DUMPED
                else:
                    base, child = split(vid)
                    dump_path = o.get("dump_path")
                    ts = str(o.get("timestamp", ""))
                    usable.append(
                        _Cand(
                            "rollout",
                            vid,
                            base,
                            child,
                            pid,
                            rank,
                            step,
                            ts,
                            (ts, pid, step, lineno),
                            f"{log.virtual}:{lineno}",
                            log,
                            dump_path if isinstance(dump_path, str) else None,
                            prompt_tokens=prompt if isinstance(prompt, int) else tokens,
                            scoped=scoped,
                        )
                    )
                    continue
                bulk[why] += 1
                if req.get("type") == "new":
                    _note(seen, wanted, vid, why, li, lineno)
            except (KeyError, TypeError, AttributeError) as exc:
                _bad(rep, log, lineno, f"not a dispatch_logger record: {_why(exc)}")
    tick("rollout logs", len(logs), len(logs))
    if decode:
        bulk[R.DECODE_ONLY] += decode
    for reason, k in bulk.items():
        rep.bulk("rollout_step", reason, k)
    return usable, seen, n


def _why(exc: Exception) -> str:
    return f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)


def _pick_child(base: str, rolls: list[_Cand], acts: list[_Cand], rep: Reporter) -> list[_Cand]:
    """n>1: the training side cannot tell siblings apart (same prompt), so the lowest child pairs."""
    children = sorted({c.child for c in rolls}, key=lambda c: -1 if c is None else c)
    if len(children) == 1:
        return rolls
    wanted = {a.child for a in acts if a.child is not None}
    keep = next((c for c in children if c in wanted), children[0])
    for c in children:
        if c != keep:
            rep(
                Unpaired(
                    subject="request",
                    ref=f"{c}_{base}",
                    reason=R.DUPLICATE_ID,
                    detail=f"n>1 sibling; child {keep} of the same prompt is paired",
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
            rep(
                Unpaired(
                    subject=subject,
                    ref=c.ref,
                    reason=R.OUTSIDE_RUN,
                    detail=f"{rd}/dump.json leads outside the {c.side} dump folder (or dangles)",
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
    pid = f"{_safe(r.base)}{child}.r{r.rank}.a{a.rank}"
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
        request_id=r.base,
        vllm_request_id=r.vllm_id,
        rollout=DumpRef(side="rollout", pid=r.pid, rank=r.rank, step=r.step, dir=r.dir),
        actor=DumpRef(side="actor", pid=a.pid, rank=a.rank, step=a.step, dir=a.dir),
        backend=backend,  # type: ignore[arg-type]
        prompt_tokens=r.prompt_tokens,
        scoped=r.scoped,
    )


def _check_dumps(roots: Roots, pairs: list[Pair], rep: Reporter, tick: Progress) -> list[Pair]:
    """Parse both dump.json files of every pair: a truncated or corrupt one drops the pair with
    ``dump_unreadable`` instead of failing compare later. Also learns the dump task."""
    ok: list[Pair] = []
    tasks: dict[str, str | None] = {}
    for i, p in enumerate(pairs):
        tick("check dumps", i, len(pairs))
        bad = ""
        for ref in (p.rollout, p.actor):
            if ref.dir in tasks:
                if tasks[ref.dir] is None:
                    bad = f"{ref.dir}/dump.json is unreadable"
                continue
            try:
                obj = discover.read_dump_json(roots.to_real(ref.dir) / "dump.json")
                tasks[ref.dir] = str(obj.get("task", "statistics"))
            except discover.DumpError as exc:
                tasks[ref.dir] = None
                bad = f"{ref.dir}/dump.json: {exc}"
                rep(
                    Unpaired(
                        subject=f"{ref.side}_step",
                        ref=ref.dir,
                        reason=R.DUMP_UNREADABLE,  # type: ignore[arg-type]
                        detail=str(exc),
                    )
                )
        if bad:
            rep(Unpaired(subject="request", ref=p.request_id, reason=R.DUMP_UNREADABLE, detail=bad))
            continue
        tensor = tasks[p.rollout.dir] == "tensor" and tasks[p.actor.dir] == "tensor"
        ok.append(p.model_copy(update={"task": "tensor"}) if tensor else p)
    tick("check dumps", len(pairs), len(pairs))
    return ok
