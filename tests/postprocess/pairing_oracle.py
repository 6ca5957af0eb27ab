"""The oracle of the pairing property test: the rules of pairing.py's docstring, written plainly.

It reads the written files itself (stdlib json, no discovery code, no pairing code): every line
into a list, then one rule after the other, in the docstring's order: (1) the training side, which
requests a micro batch of one (or a lane) holds; (2) the rollout side, every line and request as
(position, what it was), a prefill of one request (or a scoped one, or a lane) a candidate;
(3) once the whole log is known, a candidate whose prefill continues later is a chunk, and one not
dumped is none; (4) the matching per request: the child kept, the weight versions, its dump
folders, the first micro batch per rank on both sides, TP ranks rank by rank, readable dumps only;
(5) one verdict for everyone else. Deliberately unlike pairing.py's structure, so that a shared
mistake is unlikely.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.postprocess.pairing_runs import LINE_CAP

Pos = tuple[int, int, int]
"""Where a request stands in the rollout logs: (log, line, place in the line's requests)."""
Line = dict[str, Any]
"""A log line as json.loads gives it, with the oracle's own ``_``-keys added to a candidate."""


@dataclass
class Verdicts:
    pairs: set[tuple[str, str, str, str]] = field(default_factory=set)
    requests: dict[str, str] = field(default_factory=dict)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    bad_lines: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Run:
    """Where the two sides were written, and in which format."""

    roll: Path
    act: Path
    recipe: bool


@dataclass
class _Training:
    """Rule 1: the training side."""

    singles: list[Line] = field(default_factory=list)
    """Micro batches of one request, and the lanes of a micro batch, one entry per request."""
    multi: set[str] = field(default_factory=set)
    """Requests seen only in micro batches of several (outside a lane)."""
    order: list[str] = field(default_factory=list)

    @property
    def train(self) -> set[str]:
        return set(self.order)


@dataclass
class _Rollout:
    """Rule 2: the rollout side, line after line."""

    appear: dict[str, list[tuple[Pos, str]]] = field(default_factory=lambda: defaultdict(list))
    """vLLM id -> [(position, the reason it was not paired there)]."""
    decodes: set[str] = field(default_factory=set)
    conts: list[tuple[int, int, str, Pos]] = field(default_factory=list)
    """Continued prefills: (pid, rank, vLLM id, position)."""
    pending: list[tuple[Line, Pos, bool]] = field(default_factory=list)
    """Candidates until the whole log is known: (candidate, position, dumped)."""
    usable: list[Line] = field(default_factory=list)


def oracle(paths: dict[str, Path], recipe: bool) -> Verdicts:
    v = Verdicts()
    run = _Run(paths["rollout"], paths["actor"], recipe)
    training, rollout = _training_side(run.act, v), _rollout_side(run.roll, v)
    rolls_by = _match_all(run, training, rollout.usable, v)
    _other_verdicts(v, training.train, rolls_by, rollout)
    for reason in v.requests.values():
        v.counts[("request", reason)] += 1
    v.counts[("log_line", "bad_log_line")] += len(v.bad_lines)
    v.counts = +v.counts
    return v


def _logs(root: Path, name: str, side: str) -> list[tuple[str, Path]]:
    return [
        (f"{side}/{d.name}/{name}", d / name)
        for d in sorted(root.iterdir(), key=lambda d: d.name)
        if (d / name).exists()
    ]


def _read_lines(path: Path, virtual: str, v: Verdicts) -> list[tuple[int, dict[str, Any]]]:
    out = []
    raw = path.read_bytes().split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    for n, line in enumerate(raw, 1):
        if len(line) > LINE_CAP:
            v.bad_lines.add(f"{virtual}:{n}")
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line.decode("utf-8"))
        except ValueError:
            v.bad_lines.add(f"{virtual}:{n}")
            continue
        if not isinstance(obj, dict):
            v.bad_lines.add(f"{virtual}:{n}")
            continue
        out.append((n, obj))
    return out


def _isint(x: Any) -> bool:
    return type(x) is int


def _ids_header(o: Line) -> bool:
    return all(_isint(o.get(k)) for k in ("step", "rank", "pid"))


def _version_ok(o: Line) -> bool:
    """``weight_version``: absent, null or an integer (a bool is none of them)."""
    return o.get("weight_version") is None or _isint(o["weight_version"])


def _key(vid: str, train: set[str]) -> tuple[str, int | None]:
    if vid in train:
        return vid, None
    if re.search(r"-[0-9a-f]{8}\Z", vid) and len(vid) > 9:
        e = vid[:-9]
        if e in train:
            return e, None
        m = re.fullmatch(r"([0-9]+)_(.+)", e, re.DOTALL)
        if m:
            return m.group(2), int(m.group(1))
        return e, None
    return vid, None


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# Rule 1: the training side
# ---------------------------------------------------------------------------------------------


def _valid_actor_line(o: Line) -> bool:
    ids = o.get("request_ids")
    lanes = o.get("lane_request_ids")
    return (
        _ids_header(o)
        and _version_ok(o)
        and isinstance(ids, list)
        and all(isinstance(i, str) for i in ids)
        and (
            lanes is None
            or (
                isinstance(lanes, list)
                and all(isinstance(i, str) for i in lanes)
                and len(set(lanes)) == len(lanes)
                and set(lanes) <= set(ids)
            )
        )
    )


def _training_side(act: Path, v: Verdicts) -> _Training:
    t = _Training()
    for virtual, path in _logs(act, "update_actor_log.jsonl", "actor"):
        for n, o in _read_lines(path, virtual, v):
            if not _valid_actor_line(o):
                v.bad_lines.add(f"{virtual}:{n}")
                continue
            ids, lanes = o["request_ids"], o.get("lane_request_ids")
            t.order += ids
            where = {"_line": n, "_log": path.parent, "_virtual": virtual}
            if lanes is not None:
                for k, rid in enumerate(lanes):
                    t.singles.append(dict(o, _id=rid, _lane=k, **where))
                rest = set(ids) - set(lanes)
                if rest:
                    v.counts[("actor_step", "multi_request_micro_batch")] += 1
                    t.multi |= rest
            elif len(ids) == 1:
                t.singles.append(dict(o, _id=ids[0], _lane=None, **where))
            elif ids:
                v.counts[("actor_step", "multi_request_micro_batch")] += 1
                t.multi |= set(ids)
            else:
                v.counts[("actor_step", "no_request_id")] += 1
    return t


# ---------------------------------------------------------------------------------------------
# Rules 2 and 3: the rollout side
# ---------------------------------------------------------------------------------------------


def _rollout_side(roll: Path, v: Verdicts) -> _Rollout:
    r = _Rollout()
    for li, (virtual, path) in enumerate(_logs(roll, "dispatch_log.jsonl", "rollout")):
        for n, o in _read_lines(path, virtual, v):
            ok, is_decode, targets = _rollout_targets(o)
            if not ok:
                v.bad_lines.add(f"{virtual}:{n}")
                continue
            if is_decode:
                v.counts[("rollout_step", "decode_only")] += 1
                r.decodes |= {q["request_id"] for q in o["requests"]}
            elif o.get("attn_state") == "SpecDecoding":
                _spec_decoding(o, (li, n), r, v)
            else:
                _prefill_line(o, (li, n, path.parent), targets, r, v)
    _settle_pending(r, v)
    return r


def _rollout_targets(o: Line) -> tuple[bool, bool, list[tuple[int, int | None]]]:
    """Is the line valid, is it a decode step, and its targets: (place in requests, lane or None)."""
    reqs = o.get("requests")
    ok = (
        _ids_header(o)
        and o.get("phase") in ("prefill", "decode")
        and isinstance(reqs, list)
        and all(isinstance(q, dict) and isinstance(q.get("request_id"), str) for q in reqs)
    )
    is_decode = ok and (o["phase"] == "decode" or o.get("attn_state") == "DecodeOnly")
    if not ok or is_decode:
        return ok, is_decode, []
    ok = (
        bool(reqs)
        and all(q.get("type") in ("new", "cached") and _isint(q.get("tokens")) for q in reqs)
        and _version_ok(o)
    )
    targets: list[tuple[int, int | None]] = []
    lanes = o.get("lane_request_ids")
    cap = o.get("scoped_request_id") or o.get("captured_request_id")
    if ok and lanes is not None:
        names = [q["request_id"] for q in reqs]
        ok = (
            isinstance(lanes, list)
            and all(isinstance(x, str) for x in lanes)
            and len(set(lanes)) == len(lanes)
            and all(x in names for x in lanes)
        )
        targets = [(names.index(x), k) for k, x in enumerate(lanes)] if ok else []
    elif ok and cap is not None:
        idx = [i for i, q in enumerate(reqs) if q["request_id"] == cap]
        ok = bool(idx)
        targets = [(idx[0], None)] if idx else []
    elif ok and len(reqs) == 1:
        targets = [(0, None)]
    if ok:
        ok = all(
            reqs[i].get(f) is None or _isint(reqs[i].get(f))
            for i, _ in targets
            for f in ("prompt_tokens", "num_computed_tokens")
        )
    return ok, False, targets


def _spec_decoding(o: Line, at: tuple[int, int], r: _Rollout, v: Verdicts) -> None:
    li, n = at
    v.counts[("rollout_step", "spec_decoding")] += 1
    for i, q in enumerate(o["requests"]):
        if q["type"] == "new":
            r.appear[q["request_id"]].append(((li, n, i), "spec_decoding"))
        else:
            r.decodes.add(q["request_id"])


def _is_dec(q: Line) -> bool:
    return q["tokens"] == 1 or (_isint(q.get("spec_tokens")) and q["tokens"] == 1 + q["spec_tokens"])


def _prefill_line(
    o: Line, at: tuple[int, int, Path], targets: list[tuple[int, int | None]], r: _Rollout, v: Verdicts
) -> None:
    """A prefill step: what its other requests were, then each target's reason or candidacy."""
    li, n, log = at
    reqs = o["requests"]
    pid, rank = o["pid"], o["rank"]
    target_set = {i for i, _ in targets}
    for i, q in enumerate(reqs):
        if i in target_set:
            continue
        if q["type"] == "new":
            r.appear[q["request_id"]].append(((li, n, i), "multi_request_step"))
        elif _is_dec(q):
            r.decodes.add(q["request_id"])
        else:
            r.conts.append((pid, rank, q["request_id"], (li, n, i)))
            r.appear[q["request_id"]].append(((li, n, i), "chunked_prefill"))
    if not targets:
        v.counts[("rollout_step", "multi_request_step")] += 1
        return
    for target, lane in targets:
        t = reqs[target]
        pos = (li, n, target)
        scoped = len(reqs) > 1
        if t["type"] == "cached" and _is_dec(t):
            v.counts[("rollout_step", "decode_only")] += 1
            r.decodes.add(t["request_id"])
            continue
        if t["type"] == "cached":
            r.conts.append((pid, rank, t["request_id"], pos))
        why = _target_reason(t, scoped, o.get("attn_state"))
        if why:
            v.counts[("rollout_step", why)] += 1
            r.appear[t["request_id"]].append((pos, why))
            continue
        cand = dict(o, _vid=t["request_id"], _lane=lane, _line=n, _log=log, _scoped=scoped, _t=t)
        r.pending.append((cand, pos, o.get("dumped", True) is not False))


def _target_reason(t: Line, scoped: bool, attn: Any) -> str | None:
    """Why a target (not a decode) is no pair by its own line; None: a candidate."""
    if t["type"] == "cached":
        return "chunked_prefill"
    if (t.get("num_computed_tokens") or 0) > 0:
        return "prefix_cache_hit"
    if t.get("prompt_tokens") is not None and t["tokens"] < t["prompt_tokens"]:
        return "chunked_prefill"
    if not scoped and attn == "ChunkedPrefill":
        return "chunked_prefill"
    if not scoped and attn == "PrefillCacheHit":
        return "prefix_cache_hit"
    return None


def _settle_pending(r: _Rollout, v: Verdicts) -> None:
    """Rules 5 and 6 of the docstring, once the whole log is known."""
    for cand, pos, dumped in r.pending:
        later = any(
            (p, rk, vid) == (cand["pid"], cand["rank"], cand["_vid"]) and cpos > pos
            for p, rk, vid, cpos in r.conts
        )
        if cand["_t"].get("prompt_tokens") is None and later:
            why = "chunked_prefill"
        elif not dumped:
            why = "not_dumped"
        else:
            r.usable.append(cand)
            continue
        v.counts[("rollout_step", why)] += 1
        r.appear[cand["_vid"]].append((pos, why))


# ---------------------------------------------------------------------------------------------
# Rule 4: the matching
# ---------------------------------------------------------------------------------------------


def _locate(run: _Run, c: Line, side: str, v: Verdicts) -> str | None:
    sd, rd = ("step_{}", "rank_{}") if run.recipe else ("step{}", "rank{}")
    rel = Path(sd.format(c["step"])) / rd.format(c["rank"])
    if c.get("_lane") is not None:
        rel = rel / f"req{c['_lane']}"
    base = run.act if (side == "actor" and run.recipe) else c["_log"]
    if os.path.lexists(base / rel / "dump.json"):
        root = run.roll if side == "rollout" else run.act
        return f"{side}/{(base / rel).relative_to(root).as_posix()}"
    v.counts[(f"{side}_step", "dump_missing")] += 1
    return None


def _readable(run: _Run, virtual: str) -> bool:
    side, _, rel = virtual.partition("/")
    folder = (run.roll if side == "rollout" else run.act) / rel
    if not _regular(folder / "dump.json"):
        return False
    try:
        obj = json.loads((folder / "dump.json").read_text())
    except ValueError:
        return False
    if not (isinstance(obj, dict) and isinstance(obj.get("data"), dict)):
        return False
    return all(
        not os.path.lexists(folder / f) or _regular(folder / f) for f in ("stack.json", "construct.json")
    )


def _match_all(run: _Run, training: _Training, usable: list[Line], v: Verdicts) -> dict[str, list[Line]]:
    """Every request with a usable rollout candidate, matched; returns the candidates by request."""
    train = training.train
    rolls_by: dict[str, list[Line]] = defaultdict(list)
    for c in usable:
        c["_key"], c["_child"] = _key(c["_vid"], train)
        rolls_by[c["_key"]].append(c)
    acts_by: dict[str, list[Line]] = defaultdict(list)
    for c in training.singles:
        acts_by[c["_id"]].append(c)
    checked: dict[str, bool] = {}
    for key in sorted(rolls_by):
        acts = acts_by.get(key, [])
        if not acts:
            multi = key in training.multi
            v.requests[key] = "multi_request_micro_batch" if multi else "no_training_micro_batch"
            continue
        _match_request(run, key, (rolls_by[key], acts), checked, v)
    return rolls_by


def _first_per_rank(
    cs: list[Line], order: Callable[[Line], Any], subject: str, reason: str, v: Verdicts
) -> list[Line]:
    best: dict[int, Line] = {}
    for c in sorted(cs, key=order):
        if c["rank"] in best:
            v.counts[(subject, reason)] += 1
        else:
            best[c["rank"]] = c
    return [best[r] for r in sorted(best)]


def _written_order(c: Line) -> tuple[Any, ...]:
    return (str(c.get("timestamp", "")), c["pid"], c["step"], c["_line"])


def _log_prob_first(c: Line) -> tuple[Any, ...]:
    return (c.get("phase") != "log_prob", *_written_order(c))


def _kept_child(rolls: list[Line], v: Verdicts) -> list[Line]:
    """The request itself, else its lowest n>1 child; the other children are duplicates."""
    keep = min((c["_child"] for c in rolls), key=lambda c: -1 if c is None else c)
    for c in rolls:
        if c["_child"] != keep:
            v.counts[("rollout_step", "duplicate_id")] += 1
    return [c for c in rolls if c["_child"] == keep]


def _same_weights(
    key: str, rolls: list[Line], acts: list[Line], v: Verdicts
) -> tuple[list[Line], list[Line]] | None:
    """Candidates that ran the same weights: for each known version, lowest first, those of that
    version or of none; the first version that leaves both sides something wins. A side that
    knows no version at all: everything stays."""

    def version(c: Line) -> int | None:
        return c.get("weight_version")

    if all(version(c) is None for c in rolls) or all(version(c) is None for c in acts):
        return rolls, acts
    for want in sorted({version(c) for c in rolls + acts} - {None}):
        r = [c for c in rolls if version(c) in (None, want)]
        a = [c for c in acts if version(c) in (None, want)]
        if r and a:
            v.counts[("rollout_step", "weights_differ")] += len(rolls) - len(r)
            v.counts[("actor_step", "weights_differ")] += len(acts) - len(a)
            return r, a
    v.requests[key] = "weights_differ"
    return None


def _match_request(
    run: _Run, key: str, sides: tuple[list[Line], list[Line]], checked: dict[str, bool], v: Verdicts
) -> None:
    same = _same_weights(key, _kept_child(sides[0], v), sides[1], v)
    if same is None:
        return
    rolls, acts = same
    rolls = [dict(c, _dir=d) for c in rolls if (d := _locate(run, c, "rollout", v))]
    acts = [dict(c, _dir=d) for c in acts if (d := _locate(run, c, "actor", v))]
    if not rolls or not acts:
        v.requests[key] = "dump_missing"
        return
    rg = _first_per_rank(rolls, _written_order, "rollout_step", "duplicate_id", v)
    ag = _first_per_rank(acts, _log_prob_first, "actor_step", "repeated_micro_batch", v)
    if len(rg) == len(ag):
        matched = list(zip(rg, ag, strict=True))
    else:
        v.counts[("rollout_step", "tp_sharding_mismatch")] += len(rg) - 1
        v.counts[("actor_step", "tp_sharding_mismatch")] += len(ag) - 1
        matched = [(rg[0], ag[0])]
    kept = 0
    for r, a in matched:
        if _both_readable(run, (r["_dir"], a["_dir"]), checked, v):
            v.pairs.add((key, r["_vid"], r["_dir"], a["_dir"]))
            kept += 1
    if not kept:
        v.requests[key] = "dump_unreadable"


def _both_readable(run: _Run, dirs: tuple[str, str], checked: dict[str, bool], v: Verdicts) -> bool:
    """Each dump folder is read once; an unreadable one is counted once, on its side."""
    ok = True
    for side, d in zip(("rollout", "actor"), dirs, strict=True):
        if d not in checked:
            checked[d] = _readable(run, d)
            if not checked[d]:
                v.counts[(f"{side}_step", "dump_unreadable")] += 1
        ok &= checked[d]
    return ok


# ---------------------------------------------------------------------------------------------
# Rule 5: one verdict for everyone else
# ---------------------------------------------------------------------------------------------


def _other_verdicts(v: Verdicts, train: set[str], rolls_by: dict[str, list[Line]], r: _Rollout) -> None:
    firsts: dict[str, tuple[Pos, str]] = {}
    for vid, seen in r.appear.items():
        k = _key(vid, train)[0]
        for pos, why in seen:
            if k not in firsts or pos < firsts[k][0]:
                firsts[k] = (pos, why)
    decoded = {_key(d, train)[0] for d in r.decodes}
    everyone = train | set(rolls_by) | set(firsts) | decoded
    for key in everyone:
        if key in rolls_by:
            continue
        if key in firsts:
            v.requests[key] = firsts[key][1]
        elif key in decoded:
            v.requests[key] = "decode_only"
        else:
            v.requests[key] = "no_rollout_prefill"
