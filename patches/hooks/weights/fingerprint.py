"""An exact, cheap fingerprint of a tensor, the same in the trainer and in vLLM (issue 42).

Both ends of a weight sync fingerprint the same tensor: the trainer as it exports it, vLLM as it
holds it. An exact copy must give the same fingerprint on any device, whatever order a reduction
adds in; anything else must almost surely differ. Floating-point sums fail the first (their
rounding depends on the order), hashing the bytes on the host costs a device-to-host copy of the
whole model at every sync. So the fingerprint sums **integers**: the tensor's bit patterns (a
bf16 read as int16, an fp32 as int32), accumulated in int64, where addition is exact and
associative (mod 2^64 if it ever wraps, which is still exact). Two sums, both on the device and
both one pass over memory the sync reads anyway:

* ``rows``: each row's sum of bit patterns, weighted by the row's position;
* ``cols``: each column's sum, weighted by the column's position.

Any change of one element changes both sums (its bit pattern changes by a nonzero amount); a
value moved to another row changes ``rows``, one moved within its row changes ``cols``. A scaled
or stale tensor differs in nearly every element. The position weights are small (position mod a
prime, plus one), and the two numbers leave the device once per sync (:class:`Collector`),
not once per tensor.

A tensor of another dtype is compared in the dtype it was exported in: vLLM may hold fp32 what
the trainer sent as bf16 (the cast up and back is exact), and :func:`fingerprint` takes the dtype
to read it as.
"""

from __future__ import annotations

import time
from typing import Any

from verl_consistency.contracts.weight_records import TensorPrint

_PRIME = 65521
"""Largest prime below 2^16: position weights in 1..65521. For any tensor that fits a device the
products and sums stay far below 2^63; were one to wrap, int64 arithmetic wraps mod 2^64 on every
torch device, and a sum mod 2^64 is as exact and order-free as one that does not."""


def _as_matrix(t: Any) -> Any:
    """The tensor's bit patterns as an integer matrix (rows: the first dim; a vector is a column)."""
    import torch

    views = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    x = t.detach()
    if x.dtype == torch.bool:
        x = x.to(torch.int8)
    x = x.contiguous().view(views[x.element_size()])
    if x.dim() == 0:
        return x.reshape(1, 1)
    if x.dim() == 1:
        return x.reshape(-1, 1)
    return x.reshape(x.shape[0], -1)


def _weights(n: int, offset: int, device: Any) -> Any:
    import torch

    return (torch.arange(n, device=device, dtype=torch.int64) + offset) % _PRIME + 1


def device_sums(t: Any, dtype: Any | None = None) -> Any:
    """The two sums as a length-2 int64 tensor on ``t``'s device (no host sync).

    ``dtype``: read the values in this dtype first (the exported one) when ``t`` holds another.
    """
    import torch

    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    m = _as_matrix(t)
    if m.numel() == 0:
        return torch.zeros(2, dtype=torch.int64, device=m.device)
    rows = m.sum(dim=1, dtype=torch.int64)
    cols = m.sum(dim=0, dtype=torch.int64)
    return torch.stack(
        [
            (rows * _weights(rows.numel(), 0, m.device)).sum(),
            (cols * _weights(cols.numel(), 7, m.device)).sum(),
        ]
    )


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def fingerprint(t: Any, dtype: Any | None = None) -> TensorPrint:
    """One tensor's :class:`TensorPrint` at once (tests, and callers with a handful of tensors)."""
    collector = Collector()
    collector.add("t", t, dtype)
    return collector.finish()["t"]


class Collector:
    """Fingerprints of many tensors, leaving the device together at :meth:`finish`.

    The sums of each tensor are computed when it is added (on the device's stream, before the
    sync's sender or loader can reuse the buffer), kept as two int64s on the device, and copied
    to the host once. ``seconds`` is the time spent here, on the host's clock, synchronised at
    :meth:`finish` so that it includes the device work.
    """

    def __init__(self) -> None:
        self._names: list[str] = []
        self._meta: list[tuple[list[int], str]] = []
        self._sums: list[Any] = []
        self.seconds = 0.0

    def add(self, name: str, t: Any, dtype: Any | None = None) -> None:
        t0 = time.perf_counter()
        self._names.append(name)
        self._meta.append((list(t.shape), dtype_name(dtype if dtype is not None else t.dtype)))
        self._sums.append(device_sums(t, dtype))
        self.seconds += time.perf_counter() - t0

    def __len__(self) -> int:
        return len(self._names)

    def finish(self) -> dict[str, TensorPrint]:
        import torch

        t0 = time.perf_counter()
        if not self._sums:
            return {}
        by_device: dict[Any, list[int]] = {}
        for i, s in enumerate(self._sums):
            by_device.setdefault(s.device, []).append(i)
        values: list[tuple[int, int]] = [(0, 0)] * len(self._sums)
        for idxs in by_device.values():
            host = torch.stack([self._sums[i] for i in idxs]).cpu().tolist()
            for i, (r, c) in zip(idxs, host, strict=True):
                values[i] = (int(r), int(c))
        out = {
            name: TensorPrint(shape=shape, dtype=dtype, rows=r, cols=c)
            for name, (shape, dtype), (r, c) in zip(self._names, self._meta, values, strict=True)
        }
        self._sums.clear()
        self.seconds += time.perf_counter() - t0
        return out
