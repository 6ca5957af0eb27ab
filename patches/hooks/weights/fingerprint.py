"""An exact, cheap fingerprint of a tensor, the same in the trainer and in vLLM (issue 42).

Both ends of a weight sync fingerprint the same tensor: the trainer as it exports it, vLLM as it
holds it. An exact copy must give the same fingerprint on any device, whatever order a reduction
adds in; anything else must almost surely differ. Floating-point sums fail the first (their
rounding depends on the order), hashing the bytes on the host costs a device-to-host copy of the
whole model at every sync. So the fingerprint sums **integers**: the tensor's bytes read as 32-bit
words (an fp32 element is one word, two bf16 elements side by side are one), summed mod 2^32 in
int32, where addition is exact and associative whatever the order and the device. Two sums, both
on the device and both one pass over memory the sync reads anyway:

* ``rows``: each row's sum of words, weighted by the row's position;
* ``cols``: each column's sum of words, weighted by the column's position.

Per tensor that is two reductions, read in place: the words are a view of the tensor's own memory
and each sum stays in int32 (a sum in a wider type than its input makes torch copy the whole
tensor into that type first: measured on an H100, that copy made the check 8x a bf16 copy of the
model). The weighting and the final sums of every tensor of a sync are done together at the end
(:class:`Collector`), so a sync of a few hundred tensors costs two kernel launches a tensor.

Any change of one element changes both sums (its word changes by a nonzero amount below 2^32, so
mod 2^32 too); a value moved to another row changes ``rows``, one moved to another word of its row
changes ``cols`` (two bf16 swapped within one word change the word). A scaled or stale tensor
differs in nearly every element. The position weights are small (position mod a prime, plus one).
8-byte elements are read as int64 words; a tensor whose rows are not a whole number of words (an
odd-length bf16 row) is widened to int32 first, a copy only such rare tensors pay.

``dtype`` (:meth:`Collector.add`, :func:`fingerprint`) reads a tensor cast to another dtype first:
vLLM's side prints each arrival as its loader will cast it (``rollout/weight_held.py``).
"""

from __future__ import annotations

import time
from typing import Any

from verl_consistency.contracts.weight_records import TensorPrint

_PRIME = 65521
"""Largest prime below 2^16: position weights in 1..65521. For any tensor that fits a device the
products and sums stay far below 2^63; were one to wrap, int64 arithmetic wraps mod 2^64 on every
torch device, and a sum mod 2^64 is as exact and order-free as one that does not."""


_INT_VIEWS: dict[int, Any] = {}
"""Element size -> the integer dtype of that width (filled on first use: torch is imported late)."""
_DTYPE_NAMES: dict[Any, str] = {}


def _int_view(size: int) -> Any:
    if not _INT_VIEWS:
        import torch

        _INT_VIEWS.update({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64})
    return _INT_VIEWS[size]


def _as_matrix(x: Any) -> Any:
    """An integer tensor as a matrix (rows: the first dim; a vector is a column)."""
    dims = x.dim()
    if dims == 2:
        return x
    if dims == 1:
        return x.reshape(-1, 1)
    if dims == 0:
        return x.reshape(1, 1)
    return x.reshape(x.shape[0], -1)


def _as_words(t: Any) -> Any:
    """The tensor's bytes as a matrix of words, a view of its memory wherever the bytes allow."""
    x = t.detach().contiguous()
    size = x.element_size()
    m = _as_matrix(x.view(_int_view(size)))  # a bool is one byte: it views as int8 too
    if size >= 4:
        return m
    whole_rows = m.shape[1] * size % 4 == 0
    column = m.shape[1] == 1 and m.shape[0] * size % 4 == 0
    if not (whole_rows or column):
        return m.to(_int_view(4))  # rows of an odd byte length: one element a word
    if m.storage_offset() * size % 4:
        # a region of a fused parameter may start mid-word: the words must not depend on where the
        # values lie, so such a region is copied to a buffer of its own first (rare, and small)
        m = m.clone()
    if whole_rows:
        return m.view(_int_view(4))
    return m.reshape(-1).view(_int_view(4)).reshape(-1, 1)  # a vector: a column of words


def _reduce(t: Any, dtype: Any | None, cols: bool = True) -> tuple[Any, Any | None]:
    """The row sums and column sums of ``t``'s words (``t`` read in ``dtype``), in the words' own
    integer type on its device: the only per-tensor kernels; the position weights are applied to
    all tensors at once later. On a GPU the host's time per tensor is a large part of the check's
    cost (a sync is a few hundred tensors), so this makes as few calls into torch as it can."""
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    m = _as_words(t)
    return m.sum(dim=1, dtype=m.dtype), (m.sum(dim=0, dtype=m.dtype) if cols else None)


def _weighted_sums(vectors: list[Any], offsets: list[int]) -> list[int]:
    """For each vector v with its offset o: sum_i v[i] * ((i + o) mod P + 1), all in a few kernels
    and one copy to the host.

    The vectors (int32 or int64 sums, widened to int64 here: a few thousand numbers a tensor) are
    concatenated, each element is weighted by its position within its own vector,
    and the per-vector sums are read off a running sum (int64 arithmetic wraps mod 2^64, so a
    difference of running sums is the exact segment sum even past a wrap)."""
    import torch

    lengths = [v.shape[0] for v in vectors]
    device = vectors[0].device
    flat = torch.cat(vectors).to(torch.int64)  # cat promotes int32 sums to int64 where mixed
    n = flat.numel()
    # every position's weight made on the device (a sync's sums are ~10^5-10^6 numbers)
    lens = torch.tensor(lengths, dtype=torch.int64, device=device)
    starts = torch.cumsum(lens, 0) - lens
    first = torch.tensor(offsets, dtype=torch.int64, device=device) - starts
    shift = torch.repeat_interleave(first, lens, output_size=n)
    weights = (torch.arange(n, dtype=torch.int64, device=device) + shift) % _PRIME + 1
    running = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), (flat * weights).cumsum(0)])
    sums = running[starts + lens] - running[starts]
    return sums.cpu().tolist()


def dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def fingerprint(t: Any, dtype: Any | None = None, *, cols: bool = True) -> TensorPrint:
    """One tensor's :class:`TensorPrint` at once (tests, and callers with a handful of tensors)."""
    collector = Collector()
    collector.add("t", t, dtype, cols=cols)
    return collector.finish()["t"]


class Collector:
    """Fingerprints of many tensors, leaving the device together at :meth:`finish`.

    Each tensor costs two reductions when it is added (on the device's stream, before the sync's
    sender or loader can reuse its buffer); the position weights and the final sums of all tensors
    are a handful of kernels at :meth:`finish`, and one copy to the host. ``seconds`` is the time
    spent here on the host's clock, synchronised at :meth:`finish` so that it includes the device's.

    ``cols=False`` takes the row sums alone, one reduction: enough for a print that only checks a
    transport (sent against arrived: a change, a truncation or a shifted buffer moves the row sums),
    where the layout checks are those of the model against its expected values
    (:meth:`TensorPrint.same_values` compares the column sums only where both prints have them).
    """

    def __init__(self) -> None:
        self._names: list[str] = []
        self._meta: list[tuple[list[int], str]] = []
        self._rows: list[Any] = []
        self._cols: list[Any] = []
        self.seconds = 0.0

    def add(self, name: str, t: Any, dtype: Any | None = None, *, cols: bool = True) -> None:
        t0 = time.perf_counter()
        rows, col_sums = _reduce(t, dtype, cols)
        self._names.append(name)
        self._meta.append((list(t.shape), dtype_name(dtype if dtype is not None else t.dtype)))
        self._rows.append(rows)
        self._cols.append(col_sums)
        self.seconds += time.perf_counter() - t0

    def finish(self) -> dict[str, TensorPrint]:
        t0 = time.perf_counter()
        found: dict[int, TensorPrint] = {}
        by_device: dict[Any, list[int]] = {}
        for i, r in enumerate(self._rows):
            by_device.setdefault(r.device, []).append(i)
        for idxs in by_device.values():
            n = len(idxs)
            with_cols = [i for i in idxs if self._cols[i] is not None]
            sums = _weighted_sums(
                [self._rows[i] for i in idxs] + [self._cols[i] for i in with_cols],
                [0] * n + [7] * len(with_cols),
            )
            col_of = dict(zip(with_cols, sums[n:], strict=True))
            for i, r in zip(idxs, sums[:n], strict=True):
                shape, dtype = self._meta[i]
                c = col_of.get(i)
                # built without validation: the fields are ints and strings made just above
                found[i] = TensorPrint.model_construct(shape=shape, dtype=dtype, rows=r, cols=c)
        self._rows.clear()
        self._cols.clear()
        self.seconds += time.perf_counter() - t0
        return {self._names[i]: found[i] for i in sorted(found)}
