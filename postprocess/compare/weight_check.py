"""The weight check: every tensor of every sync, as the trainer sent it and as vLLM holds it (issue 42).

Reads ``<run>/weights/`` (``contracts/weight_records.py``: each trainer rank's ``export`` record
and each vLLM worker's ``held`` record per sync version) and names, per version and worker, each
tensor whose held fingerprint is not the exported one. What kind of difference it is decides
where to look next:

* ``stale``: vLLM holds what it loaded at an *earlier* version (a sync that left the tensor out
  while the trainer's copy moved, or a load that did not take it): the sync path;
* ``wrong_values``: vLLM holds values no version had. If what *arrived* already differs from what
  was sent, the transport changed it; if it arrived intact, vLLM's loading did (a fused shard
  written to the wrong rows, a cast);
* ``missing``: the trainer exports it and vLLM never received it and has no place for it;
* ``wrong_shape`` / ``wrong_dtype``: it arrived in another shape or dtype than it left.

Tensors vLLM's worker could not map to its parameters are counted as not checked, with the
worker's reason, never compared by guess. Every comparison is exact and in one dtype: the arrival
against what was sent, the model against the arrival cast as vLLM's loader casts it (verl's FSDP
engine sends its fp32 master weights; vLLM holds bf16), a tensor a sync left out against that
worker's last load of it. The first version at which each tensor differs is kept,
so a fault that starts at one sync and stays is named once with its start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from verl_consistency.contracts import env
from verl_consistency.contracts.weight_records import (
    EXPORT_PREFIX,
    HELD_PREFIX,
    WEIGHTS_DIR,
    TensorPrint,
    WeightSyncRecord,
)
from verl_consistency.postprocess.compare.token_level import BadLine, read_models

Kind = Literal["stale", "wrong_values", "missing", "wrong_shape", "wrong_dtype"]


@dataclass(frozen=True)
class TensorDiff:
    """One tensor that vLLM does not hold as the trainer sent it, at one version, in one worker."""

    version: int | None
    tensor: str
    kind: Kind
    detail: str
    worker: int


@dataclass
class VersionCheck:
    """One sync version: how many tensors were sent and compared, and those that differ."""

    version: int | None
    exported: int = 0
    workers: list[int] = field(default_factory=list)
    compared: int = 0
    not_checked: dict[str, str] = field(default_factory=dict)
    diffs: list[TensorDiff] = field(default_factory=list)
    fingerprint_s: float = 0.0
    """Seconds spent fingerprinting this sync: the slowest trainer rank plus the slowest worker."""


@dataclass
class WeightCheck:
    """The whole run's check; ``present`` is False when the run wrote no weight records."""

    versions: list[VersionCheck] = field(default_factory=list)
    first_version: dict[str, int | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    present: bool = False

    @property
    def differing(self) -> list[TensorDiff]:
        return [d for v in self.versions for d in v.diffs]


def _records(folder: Path, prefix: str, warnings: list[str]) -> list[WeightSyncRecord]:
    bad: list[BadLine] = []
    readable = []
    for path in sorted(folder.glob(f"{prefix}*.jsonl")):
        if path.is_file() and os.access(path, os.R_OK):
            readable.append(path)
        else:
            warnings.append(f"{path}: not a readable file; its weight records are not checked")
    found = [r for path in readable for r in read_models(path, WeightSyncRecord, bad)]
    warnings.extend(f"{b.file}:{b.line}: unreadable weight record, skipped ({b.error})" for b in bad)
    return found


def _exports(folder: Path, warnings: list[str]) -> dict[int | None, WeightSyncRecord]:
    """One export per version: the lowest rank's; ranks that disagree are named."""
    by_version: dict[int | None, WeightSyncRecord] = {}
    for rec in _records(folder, EXPORT_PREFIX, warnings):
        kept = by_version.get(rec.version)
        if kept is not None:
            low, high = sorted((kept, rec), key=lambda r: r.rank)
            _compare_ranks(low, high, warnings)
            rec = low
        by_version[rec.version] = rec
    return by_version


def _compare_ranks(a: WeightSyncRecord, b: WeightSyncRecord, warnings: list[str]) -> None:
    odd = [n for n, p in a.tensors.items() if n in b.tensors and not p.same_values(b.tensors[n])]
    if odd:
        warnings.append(
            f"weight check: version {a.version}: trainer ranks {a.rank} and {b.rank} exported different "
            f"{odd[0]} ({len(odd)} tensors); rank {a.rank}'s are compared"
        )


def _want(
    rec: WeightSyncRecord, name: str, exports: dict[int | None, WeightSyncRecord]
) -> TensorPrint | None:
    """What a worker's model must hold after loading ``name`` in that sync; None if it did not
    arrive in that sync. With arrival prints: the arrival as the loader casts it (``expected``), or
    the arrival itself when the dtypes agree. Without (``arrived``): the trainer's print of that
    version, taken in the dtype vLLM holds."""
    if rec.arrived is not None:
        export = exports.get(rec.version) if name in rec.arrived else None
        return export.tensors.get(name) if export is not None else None
    return (rec.expected or {}).get(name) or (rec.received or {}).get(name)


def _last_load(
    name: str, history: list[WeightSyncRecord], exports: dict[int | None, WeightSyncRecord]
) -> tuple[WeightSyncRecord, TensorPrint] | None:
    """The latest earlier sync of this worker in which ``name`` arrived, and what it loaded then."""
    for rec in reversed(history):
        want = _want(rec, name, exports)
        if want is not None:
            return rec, want
    return None


def _not_comparable(sent: TensorPrint, held_rec: WeightSyncRecord, name: str) -> str | None:
    """Why vLLM's print of ``name`` cannot be compared with the trainer's, or None. Without arrival
    prints the two must be of the same dtype: the trainer prints in verl's ``rollout.dtype``, and a
    parameter vLLM keeps in another dtype (or a trainer that printed as sent) has nothing to meet."""
    held = held_rec.tensors.get(name)
    if held_rec.arrived is None or held is None or held.dtype == sent.dtype:
        return None
    return (
        f"vLLM holds it in {held.dtype}, the trainer printed it in {sent.dtype}: set "
        f"{env.WEIGHT_CHECK_ARRIVALS}=1 in the trainer and vLLM workers to check it through its arrival"
    )


def judge(
    name: str,
    sent: TensorPrint,
    held_rec: WeightSyncRecord,
    history: list[WeightSyncRecord],
    exports: dict[int | None, WeightSyncRecord],
) -> tuple[Kind, str] | None:
    """How one vLLM worker holds one exported tensor at the record's version; None when exactly.

    ``history``: the same worker's earlier records, oldest first. Every comparison is exact and in
    one dtype: the arrival against what was sent (with arrival prints), the model against the
    arrival as the loader casts it or against the trainer's print in the held dtype, and a tensor a
    sync left out against that worker's last load of it.
    """
    arrived = (held_rec.received or {}).get(name)
    meta = (held_rec.arrived or {}).get(name) or arrived
    if meta is not None and meta.shape != sent.shape:
        return "wrong_shape", f"sent {sent.shape}, arrived {meta.shape}"
    if meta is not None and meta.dtype != (sent.sent_dtype or sent.dtype):
        return "wrong_dtype", f"sent {sent.sent_dtype or sent.dtype}, arrived {meta.dtype}"
    held = held_rec.tensors.get(name)
    if held is None:
        return "missing", "never arrived at this vLLM worker, which has no copy of it"
    if meta is not None:
        if arrived is not None and sent.sent_dtype is None and not arrived.same_values(sent):
            return "wrong_values", "changed on the way: what arrived is not what was sent"
        want = _want(held_rec, name, exports)
        if want is not None and held.same_values(want):
            return None
        earlier = next(
            (r for r in reversed(history) if (w := _want(r, name, exports)) and held.same_values(w)), None
        )
        if earlier is not None:
            return (
                "stale",
                f"holds version {earlier.version}'s values; it arrived, but the load did not take it",
            )
        if arrived is None:
            return "wrong_values", (
                "vLLM holds values that were not sent: changed on the way or in vLLM's loading "
                f"({env.WEIGHT_CHECK_ARRIVALS}=1 prints each arrival to tell which)"
            )
        return "wrong_values", "arrived intact, but vLLM's parameter holds other values after loading"
    last = _last_load(name, history, exports)
    if last is not None and held.same_values(last[1]):
        before = exports.get(last[0].version)
        old = before.tensors.get(name) if before is not None else None
        if old is not None and old.same_values(sent):
            return None  # not sent again, and the trainer's copy has not changed since
        return "stale", f"holds version {last[0].version}'s values; it was not in this sync"
    if held.dtype == sent.dtype and held.same_values(sent):
        return None
    return "wrong_values", "not in this sync, and held values match no version this worker loaded"


def _check_version(
    version: int | None,
    export: WeightSyncRecord,
    held: list[tuple[WeightSyncRecord, list[WeightSyncRecord]]],
    exports: dict[int | None, WeightSyncRecord],
) -> VersionCheck:
    row = VersionCheck(version, exported=len(export.tensors), workers=sorted(h.pid for h, _ in held))
    for h, history in sorted(held, key=lambda x: x[0].pid):
        for name, sent in export.tensors.items():
            reason = h.unmapped.get(name) or _not_comparable(sent, h, name)
            if reason is not None:
                row.not_checked[name] = reason
                continue
            row.compared += 1
            found = judge(name, sent, h, history, exports)
            if found is not None:
                row.diffs.append(TensorDiff(version, name, found[0], found[1], h.pid))
    row.fingerprint_s = round(export.seconds + max((h.seconds for h, _ in held), default=0.0), 4)
    return row


def _version_order(version: int | None) -> tuple[bool, int]:
    """Labelled versions in order, an unlabelled sync last."""
    return version is None, version if version is not None else 0


def check(run_dir: Path) -> WeightCheck:
    """Compare every sync in ``run_dir``; an empty check (``present`` False) without records."""
    folder = Path(run_dir) / WEIGHTS_DIR
    result = WeightCheck()
    if not folder.is_dir():
        return result
    exports = _exports(folder, result.warnings)
    workers: dict[int, list[WeightSyncRecord]] = {}
    for rec in _records(folder, HELD_PREFIX, result.warnings):
        workers.setdefault(rec.pid, []).append(rec)
    held: dict[int | None, list[tuple[WeightSyncRecord, list[WeightSyncRecord]]]] = {}
    for recs in workers.values():
        recs.sort(key=lambda r: _version_order(r.version))
        for i, rec in enumerate(recs):
            held.setdefault(rec.version, []).append((rec, recs[:i]))
    result.present = bool(exports or held)
    order = sorted(set(exports) | set(held), key=_version_order)
    for version in order:
        if version not in exports:
            result.warnings.append(f"weight check: vLLM loaded version {version}; no trainer export of it")
            continue
        if version not in held:
            result.warnings.append(f"weight check: the trainer exported version {version}; no vLLM record")
        row = _check_version(version, exports[version], held.get(version, []), exports)
        for d in row.diffs:
            result.first_version.setdefault(d.tensor, d.version)
        result.versions.append(row)
    return result
