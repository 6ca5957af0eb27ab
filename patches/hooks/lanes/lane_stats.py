"""Max, min, mean and L2 norm of every lane's rows of a tensor, for all lanes in one pass, on the device.

Why: msprobe computes a tensor's statistics one request at a time: cut the rows
(``slice_by_config``), then ``torch.max``, ``torch.min``, ``torch.mean``, ``torch.norm`` on the cut,
and ``.item()`` per value when it writes. With one lane per captured request that is 4 reductions
per lane per tensor, plus msprobe's host work per lane, for every module call of a dumped forward
(issue 32: 16-19x the undumped log_prob pass on an H200). Here a tensor costs 3 reductions for
every lane together, queued on its stream with no host sync, and the lanes' values come back in
one copy at the step's end.

How: the lanes' cuts (``msprobe_lanes.Cut``, msprobe's own ``slice_info`` items) select, for a
tensor of a given shape, a box on its cut dimensions: msprobe's rule, kept here exactly (a cut
applies to a dimension when ``shape[dim] == size``, a later cut of the same dimension wins, a
dimension no cut names is taken whole). The tensor is viewed as ``[P, inner]`` with the cut
dimensions in front (P = the product of their sizes: tokens for THD and vLLM, batch x positions for
the padded layout), and each of the P rows is reduced once: min and max (``aminmax`` on a GPU), a
float32 sum and a float32 L2 norm. At the step's end (:meth:`LaneStatQueue.materialise`) a boolean
mask ``[lanes, P]`` per cut signature combines the rows into each lane's max, min, sum and sum of
squares (float64), and everything crosses to the host in one copy. The mean (sum / count) and norm
(sqrt) are then rounded to the tensor's dtype, as ``torch.mean`` and ``torch.norm`` return it, so a
lane's values equal msprobe's to float32 rounding (the summation order differs;
``tests/selective/test_lane_stats.py``). A tensor object met again unchanged in the step is not
reduced again (:meth:`LaneStatQueue.seen`).

Memory: until the step's end the queue holds each reduced tensor's P row statistics on its device
(two of the tensor's dtype and two float32 a row: ~12 bytes a token a tensor in bf16), never the
tensor; the end's masked reductions work in chunks of at most :data:`MASK_ELEMENTS` elements.

What msprobe does not reduce this way stays msprobe's: 0-d tensors, empty, meta, fake, float8/4,
complex and NPU NZ tensors are cut and counted per lane by msprobe's own ``slice_by_config`` and
``get_stat_info`` (:meth:`LaneStatQueue.add_per_lane`). Integer and float64 tensors (and every
float under ``precision: high``) get max and min only, mean and norm ``None``, as msprobe writes
them; bool tensors too, as msprobe's ``any`` (Max) and ``all`` (Min), each row's ``any`` and
``all`` combined with the lanes' masks by ``any`` and ``all`` again and written as booleans (a
padded micro batch's attention mask, ``[batch, 1, T, T]``, is cut by every lane and met by every
decoder layer and attention module: 48 tensors a micro batch for Qwen2-0.5B, each once per lane
on msprobe's path, with two ``.item()`` reads a lane).

torch is imported lazily: this package is imported where torch may be absent.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from verl_consistency.patches.hooks.lanes.cuts import Cut

MASK_ELEMENTS = 1 << 24
"""At most this many elements in one masked reduction ``[tensors, lanes, rows]`` (memory bound)."""

BLOCK = 64
"""Row statistics of this many tensors of a group are stacked into one tensor each as they come.

Why: a dumped step queues hundreds of tensors, each with 2-4 row-statistic tensors (Python
objects tracked by the garbage collector). Kept one by one until the step's end, they outlive two
young collections and count towards the next full one, whose cost per step grows with what each
step leaves behind (CPython's rule: a full collection once the survivors reach a quarter of the
old heap). Stacked every ``BLOCK`` tensors, they die young."""

Span = tuple[int, int]


def lane_boxes(
    shape: Sequence[int], lanes: Sequence[Sequence[Cut]]
) -> tuple[tuple[int, ...], list[tuple[Span, ...]]]:
    """msprobe's ``slice_by_config`` for every lane of a tensor of this shape: the cut dimensions
    (sorted) and each lane's ``[start, stop)`` on each of them (the whole range where a lane does
    not cut that dimension)."""
    boxes: list[dict[int, Span]] = []
    for cuts in lanes:
        box: dict[int, Span] = {}
        for cut in cuts:
            if cut.dim >= len(shape) or shape[cut.dim] != cut.size:
                continue
            start, stop, _ = slice(cut.begin, cut.end).indices(shape[cut.dim])
            box[cut.dim] = (start, max(start, stop))
        boxes.append(box)
    dims = tuple(sorted({d for box in boxes for d in box}))
    return dims, [tuple(box.get(d, (0, shape[d])) for d in dims) for box in boxes]


@dataclass(frozen=True)
class ShapeCut:
    """What the lanes cut of a tensor of one shape: :func:`lane_boxes`, and each lane's shape."""

    dims: tuple[int, ...]
    sizes: tuple[int, ...]
    boxes: list[tuple[Span, ...]]
    lane_shapes: list[list[int]]

    rows: int
    """P: the cut dimensions' sizes multiplied (1 when nothing is cut)."""
    leading: bool
    """The cut dimensions come first but for size-1 ones: ``reshape(P, -1)`` views the rows as they are."""


@dataclass
class _Group:
    """Tensors that share a cut signature (dims, sizes), a dtype and a kind: one masked reduction."""

    cut: ShapeCut
    dtype: Any
    full: bool  # max, min, mean, norm; else max and min only (integers, float64, precision high)
    device: Any
    records: list[int] = field(default_factory=list)
    inner: list[int] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)  # (min, max[, sum, norm]) per tensor
    blocks: list[tuple[Any, ...]] = field(default_factory=list)  # the same, stacked by BLOCK tensors

    def take(self, row: tuple[Any, ...]) -> None:
        """Queue one tensor's row statistics; every :data:`BLOCK` of them become one stack each."""
        import torch

        self.rows.append(row)
        if len(self.rows) == BLOCK:
            self.blocks.append(tuple(torch.stack(column) for column in zip(*self.rows, strict=True)))
            self.rows.clear()

    def columns(self) -> list[Any]:
        """``[tensors, P]`` per statistic (min, max[, sum, norm]), every queued tensor's, in order."""
        import torch

        if self.rows:
            self.blocks.append(tuple(torch.stack(column) for column in zip(*self.rows, strict=True)))
        found = [torch.cat(column) for column in zip(*self.blocks, strict=True)]
        self.rows.clear()
        self.blocks.clear()
        return found

    @property
    def lane_rows(self) -> list[int]:
        """How many of the P rows each lane selects."""
        return [math.prod(stop - start for start, stop in box) for box in self.cut.boxes]


@dataclass(slots=True)
class Entry:
    """One queued tensor's per-lane result, as :meth:`LaneStatQueue.materialise` answers it."""

    shapes: list[list[int]]
    values: list[list[Any]] | None = None  # [lane][Max, Min, Mean, Norm]
    shared: bool = False  # no lane cuts the tensor: every lane's shape and values are lane 0's


class LaneStatQueue:
    """The dumped step's per-lane statistics: queued on the device during the forward, read at the end."""

    def __init__(self, lanes: Sequence[Sequence[Cut]]) -> None:
        self.lanes = [tuple(cuts) for cuts in lanes]
        # per queued tensor, in order (parallel lists: no object per tensor until the step's end)
        self._shapes: list[list[list[int]]] = []
        self._shared: list[bool] = []
        self._pending: dict[int, list[list[Any]]] = {}
        self._values: list[list[list[Any]] | None] = []  # filled by materialise, kept for a later write
        self._groups: dict[tuple[Any, ...], _Group] = {}
        self._cuts: dict[tuple[int, ...], ShapeCut] = {}
        self._seen: dict[int, tuple[Any, int, bool, int]] = {}
        # per (shape, dtype, kind, device): the cut and its group, one lookup per tensor instead
        # of the cut's, then a group key built and hashed
        self._routes: dict[tuple[Any, ...], tuple[ShapeCut, _Group]] = {}

    def __len__(self) -> int:
        return len(self._shapes)

    def cut(self, shape: tuple[int, ...]) -> ShapeCut:
        """The lanes' cut of a tensor of this shape (kept per shape: a step has few of them)."""
        found = self._cuts.get(shape)
        if found is None:
            dims, boxes = lane_boxes(shape, self.lanes)
            lane_shapes = []
            for box in boxes:
                lane_shape = list(shape)
                for d, (start, stop) in zip(dims, box, strict=True):
                    lane_shape[d] = stop - start
                lane_shapes.append(lane_shape)
            sizes = tuple(shape[d] for d in dims)
            first = dims[0] if dims else 0
            leading = math.prod(shape[:first]) == 1 and dims == tuple(range(first, first + len(dims)))
            found = self._cuts[shape] = ShapeCut(dims, sizes, boxes, lane_shapes, math.prod(sizes), leading)
        return found

    def add(self, tensor: torch.Tensor, *, full: bool) -> int:
        """Queue the row reductions of a plain, non-empty tensor of >= 1 dimension; returns its index.

        ``full``: floating point (not float64) under msprobe's default precision: all four
        statistics; otherwise max and min only. The same tensor met again in the step, unchanged
        (one module's output is the next one's input; q, k and v read the same hidden states), is
        not reduced again: its index is returned (:meth:`seen`).

        Everything fixed by the tensor's shape, dtype, kind and device (the cut, the group, the
        row width, the reductions) is looked up once per route: a step meets few routes, and
        this runs for every tensor of every module call (issue 43: the lanes' per-tensor step was
        a quarter of a dumped pass's added host time on an H100)."""
        version = _version(tensor)
        again = self._seen.get(id(tensor))
        if again is not None and version is not None:
            ref, was, was_full, index = again
            if was == version and was_full == full and ref() is tensor:
                return index
        shape = tensor.shape
        route = (shape, tensor.dtype, full, tensor.device)
        found = self._routes.get(route)
        if found is None:
            found = self._routes[route] = self._route(tensor, full)
        cut, group, inner, reduce = found
        if cut.leading:  # [P, ...] or [1, P, ...]: a view, nothing to move
            flat = tensor.reshape(cut.rows, inner)
        else:
            flat = tensor.movedim(cut.dims, tuple(range(len(cut.dims)))).reshape(cut.rows, inner)
        group.take(reduce(flat))
        index = len(self._shapes)
        group.records.append(index)
        group.inner.append(inner)
        self._shapes.append(cut.lane_shapes)
        self._shared.append(not cut.dims)
        if version is not None:
            self._seen[id(tensor)] = (weakref.ref(tensor), version, full, index)
        return index

    def _route(self, tensor: torch.Tensor, full: bool) -> tuple[ShapeCut, _Group, int, Reduce]:
        """The cut, group, row width and row reductions of tensors of this one's shape, dtype,
        kind and device."""
        cut = self.cut(tensor.shape)
        key = (cut.dims, cut.sizes, tensor.dtype, full, tensor.device)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(cut, tensor.dtype, full, tensor.device)
        return cut, group, tensor.numel() // cut.rows, _row_reductions(tensor.dtype, tensor.device, full)

    def seen(self, tensor: torch.Tensor, full: bool) -> int | None:
        """The index of this very tensor object queued earlier in the step, if it is still alive
        (so its memory is not another tensor's) and unmodified since (its version counter)."""
        found = self._seen.get(id(tensor))
        if found is None:
            return None
        ref, version, was_full, index = found
        if ref() is not tensor or version != _version(tensor) or was_full != full:
            return None
        return index

    def add_per_lane(
        self, tensor: Any, stat: Callable[[Any], Sequence[Any]], cut: Callable[[Any, Any], Any]
    ) -> int:
        """msprobe's own path for one tensor: ``cut(tensor, slice_info)`` and ``stat(cut)`` per lane
        (``slice_by_config`` and ``get_stat_info``); the values' ``.item()`` waits for the end.
        Where no lane's cut applies to the tensor's shape (a 0-d tensor, a flag), every lane takes it
        whole: its statistics are computed once and shared."""
        dims, _ = lane_boxes(tuple(tensor.shape), self.lanes)
        shapes: list[list[int]] = []
        pending: list[list[Any]] = []
        for k, cuts in enumerate(self.lanes):
            if not dims and k:
                shapes.append(list(shapes[0]))
                pending.append(pending[0])
                continue
            part = cut(tensor, [c.as_msprobe() for c in cuts])
            shapes.append([int(n) for n in part.shape])
            pending.append(list(stat(part)))
        self._pending[len(self._shapes)] = pending
        self._shapes.append(shapes)
        self._shared.append(not dims)
        return len(self._shapes) - 1

    # -- the step's end ------------------------------------------------------------------------
    def materialise(self) -> list[Entry]:
        """Every entry's per-lane ``[Max, Min, Mean, Norm]``: one device-to-host copy for the reduced
        tensors, msprobe's ``.item()`` for the per-lane ones. Clears the queue's device state."""
        import torch

        groups = [g for g in self._groups.values() if g.records]
        parts = [_reduce(g) for g in groups]
        # one device-to-host copy for the whole step (the first sync since the forward began)
        host = torch.cat([p.reshape(-1).to(parts[0].device) for p in parts]).cpu() if parts else None
        values = self._values
        values += [None] * (len(self._shapes) - len(values))
        offset = 0
        for group, part in zip(groups, parts, strict=True):
            n = part.numel()
            assert host is not None
            _fill(group, host[offset : offset + n].reshape(part.shape), values)
            offset += n
        for index, found in _read_pending(self._pending).items():
            values[index] = found
        entries = [
            Entry(shapes, found, shared=shared)
            for shapes, found, shared in zip(self._shapes, values, self._shared, strict=True)
        ]
        self._pending.clear()
        self._groups.clear()
        self._routes.clear()
        return entries


Reduce = Callable[["torch.Tensor"], tuple[Any, ...]]
"""A ``[P, inner]`` tensor's row statistics: (min, max) or (min, max, float32 sum, float32 norm)."""


def _row_reductions(dtype: Any, device: Any, full: bool) -> Reduce:
    """The row reductions for tensors of this dtype, device and kind, chosen once per route: min
    and max as :func:`_row_min_max` takes them, then for ``full`` the float32 sum and L2 norm."""
    import torch

    if dtype == torch.bool:  # never full: msprobe's any and all only
        return _row_min_max
    if device.type == "cuda":
        aminmax = torch.aminmax

        def low_high(flat: torch.Tensor) -> tuple[Any, ...]:
            return tuple(aminmax(flat, dim=1))

    else:

        def low_high(flat: torch.Tensor) -> tuple[Any, ...]:
            return flat.amin(1), flat.amax(1)

    if not full:
        return low_high
    float32, norm = torch.float32, torch.linalg.vector_norm

    def all_four(flat: torch.Tensor) -> tuple[Any, ...]:
        low, high = low_high(flat)
        return low, high, flat.sum(1, dtype=float32), norm(flat, dim=1, dtype=float32)

    return all_four


def _row_min_max(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's min and max: one ``aminmax`` kernel on a GPU; ``amin`` and ``amax`` elsewhere.

    Why: on CPU, torch's ``aminmax`` over a dimension took 1-5 ms for a ``[320, 64]`` or
    ``[24, 4864]`` float32 tensor on this project's 2-core machines, where ``amin`` + ``amax`` took
    4-120 us (torch 2.10; erratic, its parallel path); it made the one-pass lanes slower than the
    forward on CPU. NPU kernels are not assumed to have a fused one either."""
    import torch

    if flat.dtype == torch.bool:  # msprobe's min and max of a bool tensor: all and any
        return flat.all(1), flat.any(1)
    if flat.device.type == "cuda":
        low, high = torch.aminmax(flat, dim=1)
        return low, high
    return flat.amin(1), flat.amax(1)


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter (it moves with every in-place change), or None for an
    inference-mode tensor, which has none: such a tensor is never taken for one seen before
    (vLLM changes some in place, e.g. a fused residual add)."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return None


def _read_pending(pending: dict[int, list[list[Any]]]) -> dict[int, list[list[Any]]]:
    """msprobe's own per-lane values, as its ``.item()`` reads them: every one-element tensor among
    them read in one stack and one copy per device and dtype (``tolist`` gives each the Python
    scalar ``.item()`` gives), each tensor once however many lanes share it, not one host sync per
    value; anything else with ``.item()`` is read by it, the rest kept as it is."""
    import torch

    found = {index: [list(lane[:4]) for lane in lanes] for index, lanes in pending.items()}
    where: dict[int, list[tuple[int, int, int]]] = {}
    tensors: dict[int, Any] = {}
    for index, lanes in found.items():
        for k, lane in enumerate(lanes):
            for j, value in enumerate(lane):
                if isinstance(value, torch.Tensor) and value.numel() == 1:
                    tensors[id(value)] = value
                    where.setdefault(id(value), []).append((index, k, j))
                elif hasattr(value, "item"):
                    lane[j] = value.item()
    groups: dict[tuple[Any, Any], list[int]] = {}
    for key, tensor in tensors.items():
        groups.setdefault((tensor.device, tensor.dtype), []).append(key)
    for keys in groups.values():
        read = torch.stack([tensors[key].reshape(()) for key in keys]).tolist()
        for key, value in zip(keys, read, strict=True):
            for index, k, j in where[key]:
                found[index][k][j] = value
    return found


def _mask(group: _Group) -> torch.Tensor:
    """``[lanes, P]``: which of the P rows (cut dimensions flattened, C order) each lane selects."""
    import torch

    mask = torch.zeros((len(group.cut.boxes), *group.cut.sizes), dtype=torch.bool)
    for k, box in enumerate(group.cut.boxes):
        index: tuple[int | slice, ...] = (k, *(slice(start, stop) for start, stop in box))
        mask[index] = True
    # built at the step's end, where the host waits for the device anyway: a plain copy (no pinned
    # memory, which asks for an accelerator runtime that an NPU host may not name)
    return mask.reshape(len(group.cut.boxes), -1).to(group.device)


def _reduce(group: _Group) -> torch.Tensor:
    """``[tensors, lanes, 2 or 4]`` float64 on the device: each lane's max, min (and sum, sum of squares)."""
    import torch

    mask = _mask(group)
    lanes, rows = mask.shape
    low, high, *more = group.columns()
    flags = group.dtype == torch.bool
    if flags:  # any and all: a lane's rows combined by any and all again
        floor, ceil = False, True
    elif group.dtype.is_floating_point:
        floor, ceil = -math.inf, math.inf
    else:
        floor, ceil = torch.iinfo(group.dtype).min, torch.iinfo(group.dtype).max
    step = max(1, MASK_ELEMENTS // max(1, lanes * rows))
    if group.full:  # float64 sums of the rows' float32 sums and squared norms
        sums = more[0].double()
        squares = more[1].double().square()
    columns: list[list[torch.Tensor]] = [[], [], [], []]
    for begin in range(0, low.shape[0], step):
        chunk = slice(begin, begin + step)
        # where, not a product with the mask: an inf or nan in another lane's rows stays there
        highs = torch.where(mask, high[chunk, None, :], floor)
        lows = torch.where(mask, low[chunk, None, :], ceil)
        columns[0].append((highs.any(-1) if flags else highs.amax(-1)).double())
        columns[1].append((lows.all(-1) if flags else lows.amin(-1)).double())
        if group.full:
            columns[2].append(torch.where(mask, sums[chunk, None, :], 0.0).sum(-1))
            columns[3].append(torch.where(mask, squares[chunk, None, :], 0.0).sum(-1))
    return torch.stack([torch.cat(c) for c in columns if c], dim=-1)


def _fill(group: _Group, values: torch.Tensor, found: list[list[list[Any]] | None]) -> None:
    """Each lane's msprobe values from ``[tensors, lanes, 2|4]`` on the host: the mean and norm
    rounded to the tensor's dtype (what ``torch.mean``/``torch.norm`` return), integers as ints,
    and ``None`` for a lane that selects nothing (msprobe skips an empty cut).

    The table is built by torch (one ``tolist`` for the group), not per value in Python: a step
    has hundreds of entries times its lanes."""
    import torch

    rows = torch.tensor(group.lane_rows, dtype=torch.float64)
    counts = torch.tensor(group.inner, dtype=torch.float64)[:, None] * rows  # exact below 2**53
    if group.full:
        mean = (values[..., 2] / counts.clamp(min=1)).to(group.dtype).double()
        norm = values[..., 3].sqrt().to(group.dtype).double()
        table = torch.stack([values[..., 0], values[..., 1], mean, norm], dim=-1).tolist()
    else:
        pair = values[..., :2]
        if group.dtype == torch.bool:
            pair = pair.bool()
        elif not group.dtype.is_floating_point:
            pair = pair.long()
        table = [[[*lane, None, None] for lane in tensor] for tensor in pair.tolist()]
    for g, k in (counts == 0).nonzero().tolist():
        table[g][k] = [None, None, None, None]
    for record, per_lane in zip(group.records, table, strict=True):
        found[record] = per_lane
