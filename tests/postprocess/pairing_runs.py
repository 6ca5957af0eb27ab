"""Random collection runs for the pairing property test: what really happened (the schedule,
ground truth), then written in one of the two formats (the project's and the public recipe's).

The draws happen in one fixed order from one ``random.Random``: a seed is a run, so a failing
seed replays (and a change of order here changes every example the test draws).
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LINE_CAP = 2048
"""discover.MAX_LINE during the test, so that an over-long line costs a few KiB."""

Request = tuple[str, str, int, int]
"""(verl id, vLLM id, prompt, prefix-hit tokens)."""

# ---------------------------------------------------------------------------------------------
# The schedule: what really happened (ground truth).
# ---------------------------------------------------------------------------------------------


@dataclass
class Entry:
    vid: str
    type: str
    tokens: int
    prompt: int | None = None
    computed: int | None = None
    spec: int | None = None
    truth: str = ""
    """'whole', 'chunk', 'hit' for new entries."""


@dataclass
class Step:
    replica: int
    step: int
    phase: str
    entries: list[Entry]
    attn: str | None
    dumped: bool = True
    scoped: str | None = None
    lanes: list[str] | None = None
    """Per-request lanes (``lane_request_ids``): lane k's dump is ``req{k}`` in the rank folder."""
    version: int | None = None
    """``weight_version``: the weights this replica last received (None: not logged)."""


@dataclass
class MicroBatch:
    ranks: list[int]
    ids: list[str]
    phase: str
    lanes: list[str] | None = None
    version: int | None = None
    """``weight_version``: the trainer's global step at this forward (None: not logged)."""


@dataclass
class Schedule:
    tp: int
    replicas: int
    steps: list[Step]
    batches: list[MicroBatch]
    damage: dict[tuple[str, int, int, int], str]
    """(side, replica or trainer rank, rank, step) -> 'gone' | 'truncated' | 'fifo' | 'stackfifo'."""
    junk: dict[tuple[str, int], list[tuple[int, bytes]]]
    """(side, worker) -> [(insert before record i, line)]."""
    ts_ties: bool


def schedule(rnd: random.Random) -> Schedule:
    tp = rnd.choice([1, 1, 2])
    replicas = rnd.randint(1, 3)
    train_ranks = rnd.choice([1, 2])
    reqs = _requests(rnd)
    assigned: dict[int, list[Request]] = defaultdict(list)
    for r in reqs:
        assigned[rnd.randrange(replicas)].append(r)
    steps: list[Step] = []
    orphan_keys: list[str] = []
    budget = rnd.choice([8, 16, 64])
    spec_on = rnd.random() < 0.3
    for rep in range(replicas):
        orphan_keys += _replica_steps(rnd, _Replica(rep, list(assigned[rep]), budget, spec_on), steps)
    keys = sorted({k for k, _, _, _ in reqs} | set(orphan_keys))
    batches = _micro_batches(rnd, keys, train_ranks)
    damage = _damage(rnd, steps, batches, tp)
    junk = _junk(rnd, replicas * tp, train_ranks)
    ts_ties = rnd.random() < 0.3
    _versions(rnd, steps, batches)
    return Schedule(tp, replicas, steps, batches, damage, junk, ts_ties)


def _requests(rnd: random.Random) -> list[Request]:
    """1 to 9 requests of every id shape, some sent twice, in a random order."""
    reqs: list[Request] = []
    for i in range(rnd.randint(1, 9)):
        suffix = f"{rnd.getrandbits(32):08x}"
        shape = rnd.choice(["hex", "hex", "dashy", "childy", "nchild", "plain"])
        if shape == "hex":
            key = f"{rnd.getrandbits(40):010x}{i}"
            vids = [f"{key}-{suffix}"]
        elif shape == "dashy":  # a verl id that itself ends like vLLM's suffix
            key = f"id{i}-{rnd.getrandbits(32):08x}"
            vids = [f"{key}-{suffix}"]
        elif shape == "childy":  # a verl id that looks like an n>1 child
            key = f"{rnd.randint(0, 2)}_c{i}"
            vids = [f"{key}-{suffix}"]
        elif shape == "nchild":
            key = f"p{i}"
            vids = [f"{c}_{key}-{rnd.getrandbits(32):08x}" for c in rnd.sample(range(3), rnd.randint(1, 2))]
        else:  # vLLM before 0.14: the id as sent
            key = f"q{i}"
            vids = [key]
        if rnd.random() < 0.15:  # sent twice (a retry): another vLLM id of the same request
            vids.append(f"{key}-{rnd.getrandbits(32):08x}")
        prompt = rnd.randint(2, 40)
        hit = rnd.choice([0, 0, 0, rnd.randint(1, prompt - 1)])
        reqs += [(key, v, prompt, hit) for v in vids]
    rnd.shuffle(reqs)
    return reqs


@dataclass
class _Replica:
    """One vLLM replica while its steps are drawn: who waits, who is mid-prefill, who decodes."""

    rep: int
    waiting: list[Request]
    budget: int
    """Tokens a step may schedule (continuing chunks and new requests share it)."""
    spec_on: bool
    chunking: dict[str, int] = field(default_factory=dict)
    """vLLM id -> prompt tokens still to prefill."""
    running: list[str] = field(default_factory=list)
    prompts: dict[str, int] = field(default_factory=dict)


def _replica_steps(rnd: random.Random, r: _Replica, steps: list[Step]) -> list[str]:
    """Appends the replica's steps to ``steps`` (numbered after all steps so far where chunks are
    finished); returns the keys of its orphans."""
    # requests prefilled before the log began (a restarted logger): seen only decoding
    orphans = [
        (f"o{r.rep}{i}", f"o{r.rep}{i}-{rnd.getrandbits(32):08x}") for i in range(rnd.choice([0, 0, 1]))
    ]
    r.running = [v for _, v in orphans]
    r.prompts = {v: p for _, v, p, _ in r.waiting} | {v: 9 for v in r.running}
    for n in range(rnd.randint(3, 14)):
        step = _draw_step(rnd, r, n)
        if step is not None:
            steps.append(step)
    n = len(steps) + 100
    while r.chunking:  # every started prefill finishes, so a first chunk is always followed
        n += 1
        entries = []
        for v in list(r.chunking):
            t = min(r.chunking.pop(v), r.budget)
            entries.append(Entry(v, "cached", t))
        steps.append(Step(r.rep, n, "prefill", entries, "ChunkedPrefill"))
    return [k for k, _ in orphans]


def _draw_step(rnd: random.Random, r: _Replica, n: int) -> Step | None:
    """One model-runner step: continuing chunks, decodes, a preempted request recomputed, new
    requests (written first, as the hook does); None when it scheduled nothing."""
    room = r.budget
    mode = rnd.choice(["prefill", "prefill", "decode", "mixed"])
    entries, room = _continuing_chunks(r, room)
    for v in rnd.sample(r.running, rnd.randint(0, len(r.running)) if mode != "prefill" else 0):
        s = rnd.randint(1, 3) if r.spec_on else 0
        entries.append(Entry(v, "cached", 1 + s, spec=s or None))
    if r.running and rnd.random() < 0.1:  # resumed after preemption: recomputed whole
        v = rnd.choice(r.running)
        entries = [e for e in entries if e.vid != v]
        entries.append(Entry(v, "cached", r.prompts[v] + 3))
    new = _new_entries(rnd, r, mode, room)
    entries = new + entries  # the hook writes new requests first
    if not entries:
        return None
    if rnd.random() < 0.05:  # a request appears twice in one step (damage)
        entries.append(Entry(entries[0].vid, entries[0].type, entries[0].tokens))
    phase, attn = _phase(rnd, entries)
    scoped, lanes = None, None
    roll = rnd.random()
    if new and roll < 0.3:  # per-request lanes: any new requests of the step, in any order
        lanes = [e.vid for e in rnd.sample(new, rnd.randint(1, len(new)))]
    elif len(entries) > 1 and new and roll < 0.5:
        scoped = rnd.choice(new).vid
    dumped = rnd.random() > 0.1
    return Step(r.rep, n, phase, entries, attn, dumped, scoped, lanes)


def _continuing_chunks(r: _Replica, room: int) -> tuple[list[Entry], int]:
    entries: list[Entry] = []
    for v in list(r.chunking):
        t = min(r.chunking[v], room)
        if t <= 0:
            break
        entries.append(Entry(v, "cached", t))
        room -= t
        r.chunking[v] -= t
        if not r.chunking[v]:
            del r.chunking[v]
            r.running.append(v)
    return entries, room


def _new_entries(rnd: random.Random, r: _Replica, mode: str, room: int) -> list[Entry]:
    """One or two waiting requests, as far as the room goes: whole, a first chunk, or a prefix hit."""
    new: list[Entry] = []
    for _ in range(0 if mode == "decode" else rnd.choice([1, 1, 2])):
        if not r.waiting or room <= 0:
            break
        _key, v, p, hit = r.waiting.pop(0)
        need = p - hit
        t = min(need, room)
        room -= t
        truth = "hit" if hit else ("whole" if t == need else "chunk")
        new.append(Entry(v, "new", t, prompt=p, computed=hit, truth=truth))
        if t < need:
            r.chunking[v] = need - t
        else:
            r.running.append(v)
    return new


def _phase(rnd: random.Random, entries: list[Entry]) -> tuple[str, str]:
    """The step's phase and attention state, as vLLM-Ascend names them."""
    if all(e.type == "cached" and e.tokens == 1 for e in entries):
        return "decode", "DecodeOnly"
    if all(e.type == "cached" and e.spec for e in entries):
        return "prefill", "SpecDecoding"
    if all(e.type == "new" and not e.computed for e in entries):
        return "prefill", "PrefillNoCache"
    return "prefill", rnd.choice(["ChunkedPrefill", "ChunkedPrefill", "PrefillCacheHit"])


def _micro_batches(rnd: random.Random, keys: list[str], train_ranks: int) -> list[MicroBatch]:
    """Most requests trained (and a few never generated), in micro batches of one to three, on one
    or all trainer ranks, some repeated, maybe an empty one."""
    train = [k for k in keys if rnd.random() < 0.85] + [f"t{i}" for i in range(rnd.randint(0, 2))]
    batches: list[MicroBatch] = []
    pool = list(train)
    rnd.shuffle(pool)
    while pool:
        size = rnd.choice([1, 1, 1, 2, 3])
        ids, pool = pool[:size], pool[size:]
        ranks = list(range(train_ranks)) if rnd.random() < 0.5 else [rnd.randrange(train_ranks)]
        lanes = rnd.sample(ids, rnd.randint(1, len(ids))) if len(ids) > 1 and rnd.random() < 0.5 else None
        batches.append(MicroBatch(ranks, ids, rnd.choice(["log_prob", "log_prob", "update_actor"]), lanes))
        if rnd.random() < 0.15:  # the same request again (update_actor pass, another epoch)
            batches.append(MicroBatch(ranks, list(ids), rnd.choice(["log_prob", "update_actor"])))
    if rnd.random() < 0.1:
        batches.append(MicroBatch([0], [], "log_prob"))
    rnd.shuffle(batches)
    return batches


def _versions(rnd: random.Random, steps: list[Step], batches: list[MicroBatch]) -> None:
    """Weight versions, drawn last (a seed's run is otherwise the one it was before versions):
    none at all (an older run), on every record, or on some. A replica's version only grows (a
    sync now and then); a micro batch's is drawn from the same few steps, so that versions agree
    as often as they differ (staleness), and some requests are trained again with other weights
    (so that a side holds several versions, and which one pairs matters)."""
    mode = rnd.choice(["none", "all", "all", "some"])
    if mode == "none":
        return
    current: dict[int, int] = {}
    for s in steps:
        if s.replica not in current:
            current[s.replica] = rnd.randint(0, 1)
        elif rnd.random() < 0.25:
            current[s.replica] += 1
        v = current[s.replica]
        s.version = None if mode == "some" and rnd.random() < 0.3 else v
    for b in batches:
        v = rnd.randint(0, 2)
        b.version = None if mode == "some" and rnd.random() < 0.3 else v
    for b in list(batches):
        if len(b.ids) == 1 and rnd.random() < 0.3:  # the same request trained again, other weights
            phase = rnd.choice(["log_prob", "update_actor"])
            batches.append(MicroBatch(b.ranks, list(b.ids), phase, version=rnd.randint(0, 3)))


def _damage(
    rnd: random.Random, steps: list[Step], batches: list[MicroBatch], tp: int
) -> dict[tuple[str, int, int, int], str]:
    damage: dict[tuple[str, int, int, int], str] = {}
    for s in steps:
        for rank in range(tp):
            if rnd.random() < 0.12:
                damage[("rollout", s.replica, rank, s.step)] = rnd.choice(
                    ["gone", "truncated", "fifo", "stackfifo"]
                )
    per_rank: Counter[int] = Counter()
    for b in batches:
        for rank in b.ranks:
            if rnd.random() < 0.12:
                damage[("actor", rank, rank, per_rank[rank])] = rnd.choice(["gone", "truncated", "fifo"])
            per_rank[rank] += 1
    return damage


BAD_LINES = [
    b"this is not json",
    b'{"pid": 1, "rank": 0, "step": "3", "phase": "prefill", "requests": []}',
    b"[1, 2]",
    b'{"phase": "prefill", "pid": 1, "rank": 0, "step": 0, "requests": [{"request_id": 5}]}',
    b'{"request_ids": [7], "pid": 1, "rank": 0, "step": 0}',
    b'{"pad": "' + b"x" * (LINE_CAP + 100) + b'"}',
    b"",
    b'{"truncated": ',
    b'{"pid": 1, "rank": 0, "step": 0, "request_ids": ["x"], "num_requests": 1, "weight_version": "3"}',
    b'{"pid": 1, "rank": 0, "step": 0, "phase": "prefill", "weight_version": true, '
    b'"requests": [{"request_id": "w", "type": "new", "tokens": 2}]}',
]
"""Malformed, ill-typed, empty and over-long lines, slipped into the logs."""


def _junk(
    rnd: random.Random, rollout_workers: int, train_ranks: int
) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    junk: dict[tuple[str, int], list[tuple[int, bytes]]] = defaultdict(list)
    for side, workers in (("rollout", rollout_workers), ("actor", train_ranks)):
        for w in range(workers):
            for _ in range(rnd.choice([0, 0, 1, 2])):
                junk[(side, w)].append((rnd.randint(0, 12), rnd.choice(BAD_LINES)))
    return junk


# ---------------------------------------------------------------------------------------------
# Writing it in one of the two formats.
# ---------------------------------------------------------------------------------------------

DUMP = {"task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": None, "data": {}}


def _write_dump(folder: Path, damage: str | None) -> None:
    if damage == "gone":
        return
    folder.mkdir(parents=True, exist_ok=True)
    dump = folder / "dump.json"
    if damage == "fifo":
        os.mkfifo(dump)
    else:
        text = json.dumps(DUMP)
        dump.write_text(text[:20] if damage == "truncated" else text)
    if damage == "stackfifo":
        os.mkfifo(folder / "stack.json")
    else:
        (folder / "stack.json").write_text("{}")


def _write_log(path: Path, records: list[dict[str, Any]], junk: list[tuple[int, bytes]]) -> None:
    lines = [json.dumps(r).encode() for r in records]
    for at, line in sorted(junk, key=lambda j: -j[0]):
        lines.insert(min(at, len(lines)), line)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(line + b"\n" for line in lines))


@dataclass
class _Writing:
    """One format's folders and folder names, and the clock both sides' timestamps share."""

    s: Schedule
    roll: Path
    act: Path
    recipe: bool
    tick: int = 0

    @property
    def step_rank(self) -> tuple[str, str]:
        return ("step_{}", "rank_{}") if self.recipe else ("step{}", "rank{}")

    def advance(self) -> int:
        self.tick += 0 if self.s.ts_ties else 1
        return self.tick


def write_run(s: Schedule, root: Path, recipe: bool) -> dict[str, Path]:
    run = root / "run"
    roll = root / "gen" if recipe else run / "rollout"
    act = root / "act" if recipe else run / "actor"
    for d in (run, roll, act):
        d.mkdir(parents=True, exist_ok=True)
    w = _Writing(s, roll, act, recipe)
    for rep in range(s.replicas):
        for rank in range(s.tp):
            _write_rollout_worker(w, rep, rank)
    _write_actor(w)
    return {"run": run, "rollout": roll, "actor": act}


def _write_rollout_worker(w: _Writing, rep: int, rank: int) -> None:
    """One vLLM worker (one TP rank of one replica): its dispatch log and its prefill dumps."""
    s, recipe = w.s, w.recipe
    sd, rd = w.step_rank
    pid = 1000 + 10 * rep + rank
    recs = []
    for st_ in (x for x in s.steps if x.replica == rep):
        tick = w.advance()
        recs.append(_dispatch_record(st_, pid, rank, tick, recipe))
        if st_.phase == "prefill" and (st_.dumped or recipe):
            folder = w.roll / str(pid) / sd.format(st_.step) / rd.format(rank)
            damage = s.damage.get(("rollout", rep, rank, st_.step))
            if st_.lanes and not recipe:
                for k in range(len(st_.lanes)):
                    _write_dump(folder / f"req{k}", damage)
            else:
                _write_dump(folder, damage)
    _write_log(w.roll / str(pid) / "dispatch_log.jsonl", recs, s.junk.get(("rollout", rep * s.tp + rank), []))


def _dispatch_record(st_: Step, pid: int, rank: int, tick: int, recipe: bool) -> dict[str, Any]:
    """A dispatch_log.jsonl line; the recipe's has none of the project's fields."""
    rec: dict[str, Any] = {
        "source": "dispatch_logger",
        "timestamp": f"2026-01-01T00:{tick // 60:02d}:{tick % 60:02d}",
        "pid": pid,
        "rank": rank,
        "step": st_.step,
        "phase": st_.phase,
        "total_num_scheduled_tokens": sum(e.tokens for e in st_.entries),
        "requests": [],
    }
    for e in st_.entries:
        q: dict[str, Any] = {"request_id": e.vid, "type": e.type, "tokens": e.tokens}
        if not recipe:
            if e.type == "new":
                q["prompt_tokens"] = e.prompt
                q["num_computed_tokens"] = e.computed
            if e.spec:
                q["spec_tokens"] = e.spec
        rec["requests"].append(q)
    if not recipe:
        rec.update(schema_version=1, attn_state=st_.attn, dump_path=f"rollout/{pid}")
        if not st_.dumped:
            rec["dumped"] = False
        if st_.scoped:
            rec["scoped_request_id"] = st_.scoped
        if st_.lanes:
            rec["lane_request_ids"] = st_.lanes
        if st_.version is not None:
            rec["weight_version"] = st_.version
    return rec


def _write_actor(w: _Writing) -> None:
    """Every trainer rank's update_actor_log.jsonl and the dumps of its micro batches of one (or lanes)."""
    s, recipe = w.s, w.recipe
    sd, rd = w.step_rank
    per_rank: Counter[int] = Counter()
    recs_by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for b in s.batches:
        tick = w.advance()
        for rank in b.ranks:
            pid = 2000 + rank
            step = per_rank[rank]
            per_rank[rank] += 1
            rec = {
                "source": "update_actor",
                "timestamp": f"2026-01-01T01:{tick // 60:02d}:{tick % 60:02d}",
                "pid": pid,
                "rank": rank,
                "step": step,
                "request_ids": b.ids,
                "num_requests": len(b.ids),
            }
            if not recipe:
                rec.update(phase=b.phase, backend="fsdp", dump_path=f"actor/{pid}")
                if b.lanes:
                    rec["lane_request_ids"] = b.lanes
                if b.version is not None:
                    rec["weight_version"] = b.version
            recs_by_rank[rank].append(rec)
            base = w.act if recipe else w.act / str(pid)
            damage = s.damage.get(("actor", rank, rank, step))
            if b.lanes and not recipe:
                for k in range(len(b.lanes)):
                    _write_dump(base / sd.format(step) / rd.format(rank) / f"req{k}", damage)
            elif len(b.ids) == 1:
                _write_dump(base / sd.format(step) / rd.format(rank), damage)
    for rank, recs in recs_by_rank.items():
        _write_log(w.act / str(2000 + rank) / "update_actor_log.jsonl", recs, s.junk.get(("actor", rank), []))
