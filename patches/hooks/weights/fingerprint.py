"""An exact, cheap fingerprint of a tensor, the same in the trainer and in vLLM (issue 42).

Both ends of a weight sync fingerprint the same tensor: the trainer as it exports it, vLLM as it
holds it. An exact copy must give the same fingerprint on any device, whatever order a reduction
adds in; anything else must almost surely differ. Floating-point sums fail the first (their
rounding depends on the order), hashing the bytes on the host costs a device-to-host copy of the
whole model at every sync. So the fingerprint sums **integers**: the tensor's bytes read as 32-bit
words (an fp32 element is one word, two bf16 elements side by side are one), summed mod 2^32 in
int32, where addition and multiplication are exact and associative whatever the order and the
device. Per row of the tensor (its first dim; a vector is a column of words) two sums:

* the row's sum of words, mod 2^32;
* the row's words weighted by their column (1, 3, 5, ...: odd weights), mod 2^32.

The print is ``rows``, the row sums weighted by the row's position (position mod a prime, plus
one), and ``cols``, the sum of the column-weighted row sums, each summed mod 2^64. Both are taken
on the device for many tensors together (``word_groups.py``: a few kernels per group of alike
tensors, not two a tensor), and leave it in one copy to the host at :meth:`Collector.finish`.

Any change of one element changes both: its row's sum changes by a nonzero amount mod 2^32, its
weighted sum by an odd multiple of it (the column weights are odd), so nonzero mod 2^32 too, and
a nonzero row sum times a weight below 2^17 cannot vanish mod 2^64. A value moved to another row
changes ``rows``; two words of one row traded change ``cols`` by twice their column distance times
their difference, which vanishes only if that is a multiple of 2^32 (two bf16 swapped within one
word change the word itself). A scaled or stale tensor differs in nearly every element. 8-byte
elements are read as int64 words; a tensor whose rows are not a whole number of words (an
odd-length bf16 row) is widened to int32 first, one element a word, a copy only such rare tensors
pay.

``dtype`` (:meth:`Collector.add`, :func:`fingerprint`) reads a tensor cast to another dtype first:
vLLM's side prints each arrival as its loader will cast it (``rollout/weight_held.py``).
"""

from __future__ import annotations

import time
from typing import Any

from verl_consistency.contracts.weight_records import TensorPrint
from verl_consistency.patches.hooks.weights import word_groups as wg

_PRIME = 65521
"""Largest prime below 2^16: row position weights in 1..65521. The products and sums are taken in
int64, which wraps mod 2^64 on every torch device: a sum mod 2^64 is as exact and order-free as
one that does not wrap."""


def fingerprint(t: Any, dtype: Any | None = None, *, cols: bool = True) -> TensorPrint:
    """One tensor's :class:`TensorPrint` at once (tests, and callers with a handful of tensors)."""
    collector = Collector()
    collector.add("t", t, dtype, cols=cols)
    return collector.finish()["t"]


def _segment_sums(flat: Any, lengths: list[int], weights: str, offsets: list[int] | None = None) -> Any:
    """For each segment of ``flat`` (int64): the sum of its values, each weighted by its position
    within the segment: ``"rows"``, (position + the segment's offset) mod P, plus one; ``"odd"``,
    1, 3, 5, ...; ``"none"``, 1. A few kernels, left on the device (:meth:`Pending.read` copies them
    to the host): each segment's sum is read off a running sum (int64 wraps mod 2^64, so a
    difference of running sums is the exact segment sum past a wrap)."""
    import torch

    device = flat.device
    n = flat.numel()
    lens = _ints_on(lengths, device)
    starts = torch.cumsum(lens, 0) - lens
    if weights != "none":
        first = -starts if offsets is None else _ints_on(offsets, device) - starts
        pos = torch.arange(n, dtype=torch.int64, device=device) + torch.repeat_interleave(
            first, lens, output_size=n
        )
        flat = flat * (pos % _PRIME + 1 if weights == "rows" else 2 * pos + 1)
    running = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), flat.cumsum(0)])
    return running[starts + lens] - running[starts]


def _ints_on(values: list[int], device: Any) -> Any:
    """``values`` as int64 on ``device``, copied without waiting. ``torch.tensor(values,
    device=cuda)`` copies from pageable memory, and torch synchronises the stream after such a copy:
    the sync's own thread would wait there for every kernel queued before it, the sync's and the
    check's own, which :meth:`Collector.launch` exists to leave to the writer thread. From pinned
    memory the copy is queued like a kernel (torch's host allocator keeps the pinned block until the
    copy has run). The bench on an H100 showed no difference (``bench/results/gpu-2026-12-07e/``:
    there the device had finished before the host asked); a sync whose own copies are still queued
    is the case this is for."""
    import torch

    host = torch.tensor(values, dtype=torch.int64)
    if device.type == "cpu":
        return host
    try:
        host = host.pin_memory()
    except RuntimeError:  # no pinned memory on this accelerator: the waiting copy
        return host.to(device)
    return host.to(device, non_blocking=True)


def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


class Collector:
    """Fingerprints of many tensors, computed in groups and leaving the device together.

    :meth:`add` only files a tensor (and its rows) into the group of tensors alike; a group is
    summed on the device when it is full, at :meth:`flush` and at :meth:`finish`
    (``word_groups.py``). The row sums' position weights and the final sums of all tensors are a
    handful of kernels at :meth:`finish`, and one copy to the host. ``seconds`` is the time spent
    here on the host's clock, synchronised at :meth:`finish` so that it includes the device's.

    ``cols=False`` takes the row sums alone: enough for a print that only checks a transport (sent
    against arrived: a change, a truncation or a shifted buffer moves the row sums), where the
    layout checks are those of the model against its expected values (:meth:`TensorPrint.same_values`
    compares ``cols`` only where both prints have them).
    """

    def __init__(self) -> None:
        self._names: list[str] = []
        self._meta: list[tuple[Any, str, int, str | None]] = []
        """Per tensor: shape, dtype name, the bits ``cols`` wraps at (its words'; 0: no ``cols``), and
        the dtype it was added in where the print reads it cast."""
        self._groups: dict[wg.Key, wg.Group] = {}
        self._pending = 0
        self._limit = wg.group_bytes()
        self._sums: list[wg.Sums] = []
        self.seconds = 0.0

    def add(self, name: str, t: Any, dtype: Any | None = None, *, cols: bool = True) -> None:
        t0 = time.perf_counter()
        plan = wg.plan(t, dtype, cols, self._limit)
        index = len(self._names)
        self._names.append(name)
        self._meta.append((t.shape, plan.dtype, plan.key.word.itemsize * 8 if cols else 0, plan.sent_dtype))
        x = wg.shaped(t, plan)
        rows, step = plan.rows, plan.step
        if rows <= step:  # the common case: one piece, the tensor itself
            self._file(plan.key, x, (index, 0, rows), rows * plan.per_row)
        else:  # larger than a group: blocks of rows, each summed where it lies (a block kept for a
            # group would keep the whole tensor alive with it: the trainer's may be freed as it passes)
            for first in range(0, rows, step):
                n = min(step, rows - first)
                piece = x.narrow(0, first * plan.scale, n * plan.scale)
                self._file(plan.key, piece, (index, first, n), n * plan.per_row, alone=True)
        self.seconds += time.perf_counter() - t0

    def _file(self, key: wg.Key, piece: Any, rows: wg.PieceRows, size: int, *, alone: bool = False) -> None:
        if alone or size >= wg.alone_bytes(key.device):  # summed where it lies, now
            self._sums.append(wg.flush(key, wg.Group([piece], [rows])))
            return
        if self._pending and self._pending + size > self._limit:
            self.flush()
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = wg.Group()
        group.pieces.append(piece)
        group.rows.append(rows)
        self._pending += size

    def flush(self) -> None:
        """Sum every group now: before the caller's tensors may change (a reused bucket buffer)."""
        t0 = time.perf_counter()
        for key, group in self._groups.items():
            self._sums.append(wg.flush(key, group))
        self._groups.clear()
        self._pending = 0
        self.seconds += time.perf_counter() - t0

    def finish(self) -> dict[str, TensorPrint]:
        """Every tensor's print, now (the sums launched and read at once)."""
        return self.launch().read()

    def launch(self) -> Pending:
        """Sum every group and launch the final sums, without waiting for them: the prints are read
        by :meth:`Pending.read`, which a caller on a weight sync's path leaves to another thread
        (``sync_log.write_later``), so the sync does not wait for the device. Empties the collector."""
        self.flush()
        t0 = time.perf_counter()
        by_device: dict[Any, list[wg.Sums]] = {}
        for s in self._sums:
            by_device.setdefault(s.plain.device, []).append(s)
        jobs: list[_Job] = []
        for sums in by_device.values():
            jobs.append(_launch("rows", [(s.rows, s.plain) for s in sums], "rows"))
            jobs.append(
                _launch("cols", [(s.rows, s.weighted) for s in sums if s.weighted is not None], "none")
            )
            # a whole piece's column sums: one segment each, weighted by column
            columns = [
                ([(s.rows[0][0], 0, s.columns.numel())], s.columns) for s in sums if s.columns is not None
            ]
            jobs.append(_launch("cols", columns, "odd"))
        pending = Pending(self._names, self._meta, [j for j in jobs if j is not None], _events(by_device))
        self._names, self._meta, self._sums = [], [], []
        self.seconds += time.perf_counter() - t0
        return pending


_Job = tuple[str, list[int], Any]
"""("rows" or "cols", the tensor index of each segment, the segments' sums on the device)."""


def _launch(kind: str, parts: list[tuple[list[wg.PieceRows], Any]], weights: str) -> _Job | None:
    """Each segment's weighted sum (``_segment_sums``), launched on the device, with the tensor it
    adds to; None for no parts."""
    if not parts:
        return None
    import torch

    pieces = [p for rows, _ in parts for p in rows]
    flat = torch.cat([values.to(torch.int64) for _, values in parts])
    offsets = [first for _, first, _ in pieces]
    sums = _segment_sums(flat, [n for _, _, n in pieces], weights, offsets)
    return kind, [i for i, _, _ in pieces], sums


def _events(by_device: dict[Any, Any]) -> list[Any] | None:
    """An event recorded now on each accelerator's current stream (``torch.<type>.Event``: CUDA,
    NPU), so that a reader in another thread waits for exactly the sums launched so far; [] when
    every device is the CPU (its kernels have run); None where an accelerator has no such event
    (then the prints must be read on the launching thread)."""
    import torch

    events = []
    for device in by_device:
        if device.type == "cpu":
            continue
        kind = getattr(torch, device.type, None)
        if kind is None or not hasattr(kind, "Event"):
            return None
        with kind.device(device):
            event = kind.Event()
            event.record()
        events.append(event)
    return events


class Pending:
    """A collector's sums on the device, launched and not yet read (:meth:`Collector.launch`)."""

    def __init__(
        self,
        names: list[str],
        meta: list[tuple[Any, str, int, str | None]],
        jobs: list[_Job],
        events: list[Any] | None,
    ) -> None:
        self._names = names
        self._meta = meta
        self._jobs = jobs
        self.events = events
        self.seconds = 0.0
        """Time spent in :meth:`read` (waiting for the device, then copying)."""

    @property
    def readable_elsewhere(self) -> bool:
        """Whether another thread may read the prints (each device's sums are marked by an event)."""
        return self.events is not None

    def read(self) -> dict[str, TensorPrint]:
        """The prints: waits for the sums' event on each device, copies them to the host, adds up."""
        t0 = time.perf_counter()
        for event in self.events or ():
            event.synchronize()
        totals: dict[str, dict[int, int]] = {"rows": {}, "cols": {}}
        for kind, indices, sums in self._jobs:
            into = totals[kind]
            for i, v in zip(indices, sums.cpu().tolist(), strict=True):
                into[i] = into.get(i, 0) + v
        found = {}
        for i, name in enumerate(self._names):
            shape, dtype, bits, sent = self._meta[i]
            # built without validation: the fields are ints and strings made just above
            found[name] = TensorPrint.model_construct(
                shape=list(shape),
                dtype=dtype,
                rows=_signed(totals["rows"].get(i, 0), 64),
                cols=_signed(totals["cols"].get(i, 0), bits) if bits else None,
                sent_dtype=sent,
            )
        self.seconds += time.perf_counter() - t0
        return found
