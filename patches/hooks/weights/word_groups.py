"""The fingerprint's device work for many tensors at once: a few kernels per group, not per tensor.

A weight sync is a few hundred tensors, and on a GPU the per-tensor check cost the host's time:
each reduction a kernel launch and a handful of torch calls, ~30 us a tensor on an H100's host
against ~3 us of memory traffic (``bench/results/gpu-2026-12-07b/``). So tensors whose rows are
alike (same device, dtype, the dtype the print reads them in, and row length) join one *group*:
at :func:`flush` they are concatenated along their rows (one copy kernel), cast once where the
print reads another dtype, viewed as words, and every row of every tensor is summed by one
reduction, and once more weighted by column. A vector is a column of words: its row sums are its
words. A group holds at most ``$VERL_CONSISTENCY_WEIGHT_CHECK_GROUP_MB`` (128 MiB by default) of
words: a larger tensor is cut into blocks of rows, each a piece of the group it fills, so the
check's extra device memory stays within ~3 groups (the copy, its cast and the weighted words).

The tensors of a group are kept alive until it is flushed (the trainer's exported tensors may be
freed right after they pass); a caller whose tensors are overwritten after a point (vLLM's bucket
buffer, reused for the next bucket) flushes before it (``Collector.flush``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from verl_consistency.contracts import env

DEFAULT_GROUP_MB = 128

ALONE_BYTES = {"cpu": 64 << 10, "accelerator": DEFAULT_GROUP_MB << 20}
"""A piece this large is summed on its own, where it lies; a smaller one is copied into a group.

On a CPU a reduction starts in ~2 us while copying runs at a few GB/s, so only small tensors are
grouped. On an accelerator the check's cost to a sync is the host's time: the device's share is
read back off the sync's path (``sync_log.write_later``), and every tensor summed alone costs the
host ~5 torch calls where a grouped one costs a list append. On an H100 (``bench/results/
gpu-2026-12-07d/``) the sync's own thread spent 10-17 ms a side on Qwen2-0.5B's 291 tensors with
8 MiB here, 10.6 % of that run's 0.255 s sync; so every tensor up to a whole group is grouped
(one larger is cut into blocks of rows, each summed alone: a block kept for a group would keep the
whole tensor alive), and the extra copies run on the device while the host goes on. On the same
shape the bench's share of the sync's thread went from ~21.9 to ~12.6 ms a sync
(``bench/results/gpu-2026-12-07e/``)."""


def alone_bytes(device: Any) -> int:
    return ALONE_BYTES["cpu" if device.type == "cpu" else "accelerator"]


PieceRows = tuple[int, int, int]
"""(tensor index, first row within the tensor, rows): where a piece's row sums belong."""


def group_bytes() -> int:
    """The most bytes of words a group holds, from ``$VERL_CONSISTENCY_WEIGHT_CHECK_GROUP_MB``."""
    raw = os.environ.get(env.WEIGHT_CHECK_GROUP_MB, "")
    try:
        mb = int(raw) if raw else DEFAULT_GROUP_MB
    except ValueError as err:
        raise ValueError(
            f"${env.WEIGHT_CHECK_GROUP_MB}={raw!r} is not a whole number of MiB: "
            f"unset it for the default, {DEFAULT_GROUP_MB}"
        ) from err
    return max(mb, 1) << 20


_WORDS: dict[int, Any] = {}


def word_type(size: int) -> Any:
    """The integer dtype of ``size`` bytes (filled on first use: torch is imported late)."""
    if not _WORDS:
        import torch

        _WORDS.update({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64})
    return _WORDS[size]


@dataclass(frozen=True)
class Key:
    """What a group's pieces share, so that they can be laid end to end and read as one."""

    device: Any
    source: Any
    """The pieces' dtype as added."""
    target: Any | None
    """The dtype the print reads them in (None: as they are)."""
    word: Any
    """int32, or int64 for 8-byte elements."""
    row: int | None
    """Elements a row (of ``target``); None: vectors, a column of words."""
    cols: bool


@dataclass
class Group:
    pieces: list[Any] = field(default_factory=list)
    """Tensors: 2-D (rows, row) for a matrix key, 1-D for a vector key."""
    rows: list[PieceRows] = field(default_factory=list)
    """Per piece: (tensor index, first row within the tensor, rows), rows counted in words' rows."""


@dataclass
class Sums:
    """One flushed group: its pieces, and per row of each piece in order its sums on the device."""

    rows: list[PieceRows]
    plain: Any
    """Each row's words summed, in the word type (mod 2^32 for int32)."""
    weighted: Any | None
    """Each row's words weighted by column (1, 3, 5, ...), the same way; None where not wanted or
    where ``columns`` stand for them."""
    columns: Any | None = None
    """A single piece's column sums: weighted by column at the end, they add up to the same ``cols``
    mod 2^32 as its rows' weighted sums, for one reduction without a temporary."""


class Plan(NamedTuple):
    """How a tensor of one shape and dtype is filed: worked out once per shape (:func:`plan`)."""

    how: str
    """"as is" (a matrix), "reshape" (to rows x row), "flat" (a vector) or "widen" (one element a word)."""
    key: Key
    rows: int
    """Rows of words (a vector: its words)."""
    row: int
    """Elements a row of the pieces (a vector: 1)."""
    per_row: int
    """Bytes of words a row."""
    step: int
    """Rows a piece at most (a group's size)."""
    scale: int
    """Elements of the pieces a row of words (a vector: elements a word; else 1)."""
    dtype: str
    """The print's dtype name."""
    cast: Any | None = None
    """A widened tensor's dtype to read it in first (its key's target is None: the words are made here)."""
    sent_dtype: str | None = None
    """The tensor's own dtype name where the print reads it cast to another (else None)."""


_PLANS: dict[tuple[Any, ...], Plan] = {}


def plan(t: Any, dtype: Any | None, cols: bool, limit: int) -> Plan:
    """The :class:`Plan` of ``t`` printed in ``dtype`` (None: its own), cached by shape and dtype:
    the host's time per tensor is most of the check's cost, and a model has few distinct shapes."""
    sig = (t.shape, t.dtype, dtype, t.device, cols, limit)
    found = _PLANS.get(sig)
    if found is None:
        found = _PLANS[sig] = _plan(t, dtype, cols, limit)
    return found


def _plan(t: Any, dtype: Any | None, cols: bool, limit: int) -> Plan:
    target = dtype if dtype is not None and dtype != t.dtype else None
    shown = str(dtype if dtype is not None else t.dtype).removeprefix("torch.")
    size = (target if target is not None else t.dtype).itemsize
    word = word_type(8 if size == 8 else 4)
    ws = word.itemsize
    dims = t.dim()
    how, source, row_key, cast = "flat", t.dtype, None, None
    rows, row = (t.shape[0], math.prod(t.shape[1:])) if dims >= 2 else (1, t.numel())
    if dims >= 2 and row * size % ws == 0:
        how, row_key = ("as is" if dims == 2 else "reshape"), row
    elif (dims >= 2 and row != 1) or t.numel() * size % ws:
        # rows (or a vector) that are not whole words: one element a word, int32, as a matrix
        how, source, cast, target, word, size = "widen", word_type(4), target, None, word_type(4), 4
        rows, row_key = (rows, row) if dims >= 2 else (t.numel() if dims else 1, 1)
    if how == "flat":
        rows, row = t.numel() * size // ws, 1
    per_row = row_key * size if row_key is not None else ws
    return Plan(
        how=how,
        key=Key(t.device, source, target, word, row_key, cols),
        rows=rows,
        row=row_key if row_key is not None else 1,
        per_row=per_row,
        step=max(limit // max(per_row, 1), 1),
        scale=1 if row_key is not None else ws // size,
        dtype=shown,
        cast=cast,
        sent_dtype=None if dtype is None or dtype == t.dtype else str(t.dtype).removeprefix("torch."),
    )


def shaped(t: Any, p: Plan) -> Any:
    """``t`` as its plan's pieces are cut from it."""
    if p.how == "as is":
        return t
    if p.how == "reshape":
        return t.reshape(p.rows, p.row)
    if p.how == "flat":
        return t.reshape(-1)
    x = (t.to(p.cast) if p.cast is not None else t).contiguous()  # widen
    return x.view(word_type(x.element_size())).reshape(p.rows, -1).to(word_type(4))


_COLUMN_WEIGHTS: dict[tuple[Any, Any, int], Any] = {}


def _column_weights(device: Any, word: Any, width: int) -> Any:
    key = (device, word, width)
    w = _COLUMN_WEIGHTS.get(key)
    if w is None:
        import torch

        w = _COLUMN_WEIGHTS[key] = torch.arange(1, 2 * width, 2, dtype=word, device=device)
    return w


def flush(key: Key, group: Group) -> Sums:
    """Read the group's pieces as words and sum every row of them: one piece where it is (a large
    tensor: no copy, its column sums for ``cols``), several laid end to end by one copy (their rows'
    column-weighted sums for ``cols``: column sums would mix the tensors)."""
    import torch

    with torch.no_grad():
        one = len(group.pieces) == 1
        buf = group.pieces[0].contiguous() if one else torch.cat(group.pieces)
        if key.target is not None:
            buf = buf.to(key.target)
        try:
            words = buf.view(key.word)
        except RuntimeError:  # a single piece that starts mid-word (a region of a fused parameter)
            words = buf.clone().view(key.word)
        if key.row is None:  # a column of words: each word is a row, of column weight 1
            plain = words.to(torch.int64)
            return Sums(group.rows, plain, plain if key.cols else None)
        plain = words.sum(1, dtype=key.word)
        if not key.cols:
            return Sums(group.rows, plain, None)
        if one:
            return Sums(group.rows, plain, None, columns=words.sum(0, dtype=key.word))
        by_column = words * _column_weights(words.device, key.word, words.shape[1])
        return Sums(group.rows, plain, by_column.sum(1, dtype=key.word))
