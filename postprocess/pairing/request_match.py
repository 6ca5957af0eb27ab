"""Which training record matches which request: usable prefills and usable micro batches in,
pairs out.

The rules are ``postprocess/pairing/pair.py``'s docstring ("Matching", steps 1-6, and the verdict of
a request with a usable prefill). The inputs are what :mod:`.prefill_targets` and
:mod:`.micro_batches` found usable; every request that reaches here leaves with at least one
pair or one ``request`` verdict, and every step set aside on the way is reported.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from verl_consistency.contracts import records
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.candidates import Candidate, Progress
from verl_consistency.postprocess.pairing.discover import Roots
from verl_consistency.postprocess.pairing.pair_types import Pair, Unpaired, UnpairedReason
from verl_consistency.postprocess.pairing.reasons import Reporter
from verl_consistency.postprocess.pairing.weight_versions import same_weights

R = UnpairedReason

StepSubject = Literal["rollout_step", "actor_step"]


@dataclass
class Matched:
    pairs: list[Pair]
    keys: list[str]
    """The request of each pair."""
    prefilled: dict[str, list[Candidate]]
    """Every request with a usable prefill: each has had its verdict here."""


def by_request(cands: Iterable[Candidate]) -> dict[str, list[Candidate]]:
    out: dict[str, list[Candidate]] = defaultdict(list)
    for c in cands:
        out[c.key].append(c)
    return out


def match_requests(
    roots: Roots,
    rolls: Iterable[Candidate],
    acts: Iterable[Candidate],
    multi_ids: set[str],
    rep: Reporter,
    tick: Progress,
    default_backend: str,
) -> Matched:
    """Pair each request that has a usable prefill, in sorted id order (Matching, steps 1-5)."""
    roll_by_key, act_by_key = by_request(rolls), by_request(acts)
    pairs: list[Pair] = []
    pair_key: list[str] = []
    used_ids: set[str] = set()
    keys = sorted(roll_by_key)
    for i, key in enumerate(keys):
        tick("match", i + 1, len(keys))
        found = act_by_key.get(key)
        if not found:
            if key in multi_ids:
                rep.request(
                    key, R.MULTI_REQUEST_MICRO_BATCH, "its training micro batches held other requests too"
                )
            else:
                rep.request(
                    key,
                    R.NO_TRAINING_MICRO_BATCH,
                    "no update_actor_log line holds this request (not captured, or filtered out)",
                )
            continue
        for r, a in _match_one(roots, key, roll_by_key[key], found, rep):
            pairs.append(_make_pair(r, a, default_backend, used_ids))
            pair_key.append(key)
    return Matched(pairs, pair_key, roll_by_key)


def _match_one(
    roots: Roots, key: str, rolls: list[Candidate], acts: list[Candidate], rep: Reporter
) -> list[tuple[Candidate, Candidate]]:
    """One request's (rollout, training) steps to pair: steps 1-5, or its ``weights_differ`` or
    ``dump_missing`` verdict."""
    same = same_weights(key, pick_child(rolls, rep), acts, rep)
    if same is None:
        return []
    rolls, acts = same
    rolls = [c for c in rolls if locate(roots, c, rep)]
    acts = [c for c in acts if locate(roots, c, rep)]
    if not rolls or not acts:
        side = "rollout" if not rolls else "actor"
        rep.request(key, R.DUMP_MISSING, "no dump folder left on the {} side", side)
        return []
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
    return _match_ranks(roll_group, act_group, rep)


def pick_child(rolls: list[Candidate], rep: Reporter) -> list[Candidate]:
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
    cands: list[Candidate],
    rep: Reporter,
    subject: StepSubject,
    reason: UnpairedReason,
    detail: str,
) -> list[Candidate]:
    best: dict[int, Candidate] = {}
    for c in sorted(cands, key=lambda c: c.order):
        if c.rank in best:
            rep(Unpaired(subject=subject, ref=c.dir or c.ref, reason=reason, detail=detail))
        else:
            best[c.rank] = c
    return [best[r] for r in sorted(best)]


def _match_ranks(
    rolls: list[Candidate], acts: list[Candidate], rep: Reporter
) -> list[tuple[Candidate, Candidate]]:
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


def locate(roots: Roots, c: Candidate, rep: Reporter) -> bool:
    """Find the step's dump folder: the record's ``dump_path`` first, then the log's own folder,
    then (recipe-style actor dumps) the side's root. Sets ``c.dir`` (virtual) on success."""
    subject: StepSubject = "rollout_step" if c.side == "rollout" else "actor_step"
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
        lane = records.lane_folder(c.lane) if c.lane is not None else ""
        rd = discover.rank_dir(sd, c.rank, c.pid, lane)
        if rd is None:
            tried.append(f"{sd}/rank{c.rank}" + (f"/{lane}" if lane else ""))
            continue
        rd = rd / lane
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


def safe_id(text: str) -> str:
    """``text`` as a file-name-safe id (a pair's, a batch-variance prompt's results folder)."""
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)


def unique_id(name: str, used: set[str]) -> str:
    """``name``, or ``name.2``, ``name.3``, ... the first not in ``used`` (which it joins)."""
    k, candidate = 1, name
    while candidate in used:
        k += 1
        candidate = f"{name}.{k}"
    used.add(candidate)
    return candidate


def _make_pair(r: Candidate, a: Candidate, default_backend: str, used: set[str]) -> Pair:
    child = f".c{r.child}" if r.child is not None else ""
    backend = a.backend if a.backend in ("fsdp", "megatron") else default_backend
    return Pair(
        pair_id=unique_id(f"{safe_id(r.key)}{child}.r{r.rank}.a{a.rank}", used),
        request_id=r.key,
        vllm_request_id=r.vllm_id,
        rollout=r.dump_ref(),
        actor=a.dump_ref(),
        backend=backend,  # type: ignore[arg-type]
        prompt_tokens=r.prompt_tokens,
        scoped=r.scoped,
        weight_version=r.version if r.version is not None else a.version,
        trainer_weight_version=a.trainer_version,
    )


def drop_unreadable(roots: Roots, m: Matched, rep: Reporter, tick: Progress) -> Matched:
    """Step 6: drop every pair with an unreadable dump; a request left with no pair is
    ``dump_unreadable``."""
    keep = _check_dumps(roots, m.pairs, rep, tick)
    dropped: dict[str, str] = {}
    for k, bad in zip(m.keys, keep, strict=True):
        if bad:
            dropped.setdefault(k, bad)
    pairs = [p for p, bad in zip(m.pairs, keep, strict=True) if not bad]
    keys = [k for k, bad in zip(m.keys, keep, strict=True) if not bad]
    kept = set(keys)
    for k, bad in dropped.items():
        if k not in kept:
            rep.request(k, R.DUMP_UNREADABLE, "{}", bad)
    return Matched(pairs, keys, m.prefilled)


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
