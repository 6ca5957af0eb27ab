"""Which training micro batches hold one request: one pass over verl's update_actor logs.

The rules are ``postprocess/pairing/pair.py``'s docstring ("Valid lines" for training records,
"Training"). The training logs are read first: they are the smaller side, and their ids name
the requests (a vLLM id is resolved against them, :func:`~.candidates.request_key`).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.candidates import Candidate, Progress, lane_ids, why, worker_step
from verl_consistency.postprocess.pairing.discover import LogFile
from verl_consistency.postprocess.pairing.pair_types import UnpairedReason
from verl_consistency.postprocess.pairing.reasons import Reporter
from verl_consistency.postprocess.pairing.weight_versions import (
    read_trainer_version,
    read_unsynced,
    read_version,
)

_STR = frozenset((str,))


@dataclass
class TrainingBatches:
    """What the update_actor logs say, request by request."""

    singles: list[Candidate]
    """Every usable micro batch: of one request, or one lane of a packed one."""
    multi_ids: set[str]
    """Ids seen in a micro batch of several requests."""
    train: dict[str, None]
    """Every training id, in the order first seen."""
    n: int
    """Training records read (bad lines included)."""


def _elsewhere(o: dict, among: set[str]) -> set[str]:
    """A record's ``lanes_elsewhere``: requests of its micro batch whose lanes another record holds
    (a forward at their rollout's weights, ``hooks/training/older_weights.py``). Raises ``TypeError`` (a
    ``bad_log_line``) unless a list of ids of the record that have no lane in it."""
    v = o.get("lanes_elsewhere")
    if v is None:
        return set()
    if type(v) is not list or not all(isinstance(x, str) for x in v):
        raise TypeError("lanes_elsewhere must be a list of strings")
    if not set(v) <= among:
        raise TypeError("lanes_elsewhere must name request_ids without a lane in this record")
    return set(v)


def read_actor(logs: list[LogFile], rep: Reporter, tick: Progress) -> TrainingBatches:
    """Single-request micro batches, the ids seen in multi-request ones, and every training id."""
    singles: list[Candidate] = []
    multi_ids: set[str] = set()
    train_order: list[str] = []
    n = multi = empty = 0
    for li, log in enumerate(logs):
        tick("actor logs", li, len(logs))
        for lineno, o in discover.iter_jsonl(log, rep):
            n += 1
            try:
                ids = o["request_ids"]
                step, rank, pid = worker_step(o)
                if type(ids) is not list:
                    raise TypeError("request_ids must be a list")
                if not set(map(type, ids)) <= _STR:
                    raise TypeError("request_ids must hold strings")
            except (KeyError, TypeError, AttributeError) as exc:
                discover.bad_line(rep, log, lineno, f"not an update_actor record: {why(exc)}")
                continue
            try:
                lanes = lane_ids(o, set(ids), "request_ids")
                elsewhere = _elsewhere(o, set(ids) - set(lanes or ()))
                version = read_version(o)
                unsynced = read_unsynced(o)
                trainer_version = read_trainer_version(o)
            except TypeError as exc:
                discover.bad_line(rep, log, lineno, f"not an update_actor record: {exc}")
                continue
            train_order.extend(ids)
            usable: list[tuple[str, int | None]] = (
                [(rid, k) for k, rid in enumerate(lanes)]
                if lanes is not None
                else ([(ids[0], None)] if len(ids) == 1 else [])
            )
            if usable:
                dump_path = o.get("dump_path")
                phase = o.get("phase")
                ts = str(o.get("timestamp", ""))
                for rid, lane in usable:
                    singles.append(
                        Candidate(
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
                            lane=lane,
                            version=version,
                            unsynced=unsynced,
                            trainer_version=trainer_version,
                        )
                    )
            if not ids:
                empty += 1
            elif len(ids) > len(usable) + len(elsewhere):
                # several requests and no lane of their own: the dump mixes them
                multi += 1
                multi_ids.update(set(ids) - {rid for rid, _ in usable} - elsewhere)
    tick("actor logs", len(logs), len(logs))
    if multi:
        rep.bulk("actor_step", UnpairedReason.MULTI_REQUEST_MICRO_BATCH, multi)
    if empty:
        rep.bulk("actor_step", UnpairedReason.NO_REQUEST_ID, empty)
    return TrainingBatches(singles, multi_ids, dict.fromkeys(train_order), n)
