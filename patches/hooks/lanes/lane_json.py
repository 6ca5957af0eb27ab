"""Each lane's ``dump.json`` text, from one template of the step: msprobe's own file, byte for byte.

Why: msprobe writes a dump with ``json.dump(data, f, indent=1)`` (``save_json``), and with an
indent CPython's json uses its pure-Python encoder. Per lane that walk is most of a dumped step's
host time once the statistics are batched (a Qwen2-0.5B lane is ~450 KB of records; 32 lanes a
step). The lanes of a step differ only in their tensor records' shapes and statistics, so the
step's skeleton is encoded once, with msprobe's encoder, each tensor record replaced by a marker;
per lane the markers become records, rendered the way that encoder renders them at that depth
(``{``, one ``"key": value`` per line one space deeper, ``,`` between, floats as ``float.__repr__``
with ``NaN``/``Infinity``, ``shape`` as a list one line per int). ``stack.json`` and
``construct.json`` are the same for every lane: encoded once. The text written is what
``json.dump(..., indent=1)`` of the lane's data would write (``tests/selective/test_lane_stats.py``
compares it with msprobe's per-lane files), and it is written the way ``save_json`` writes (an
exclusive ``flock``; msprobe's path checks once per lane folder).
"""

from __future__ import annotations

import fcntl
import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

STAT_KEYS = ("Max", "Min", "Mean", "Norm")
LANE_RECORD = "_verl_consistency_lane_record"
"""The key of a queued tensor record in the step's template (replaced before anything is written)."""
_MARKER = "\x00vclane{}\x00"
_MARKER_TEXT = re.compile(r'"\\u0000vclane(\d+)\\u0000"')


def _nested(value: Any, level: int) -> str:
    """``value`` as msprobe's encoder writes it at indent ``level`` (deeper lines re-indented)."""
    return json.dumps(value, indent=1).replace("\n", "\n" + " " * level)


class StepTemplate:
    """The step's ``dump.json`` with every queued tensor record as a marker, split at the markers.

    ``is_record(node)`` names a queued record (a dict) and returns its queue index, else None.
    """

    def __init__(self, cache_data: dict[str, Any], is_record: Callable[[Any], int | None]) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.indices: list[int] = []
        marked = self._mark(cache_data, is_record)
        text = json.dumps(marked, indent=1)
        pieces = _MARKER_TEXT.split(text)
        self.parts = pieces[0::2]  # the text between records; the record numbers are pieces[1::2]
        self.levels: list[int] = []
        self._kinds: dict[tuple[Any, ...], list[str]] = {}
        # one %-format of the whole file: per record a slot for its shape and one per statistic
        chunks = [_escape(self.parts[0])]
        for i, node in enumerate(self.nodes):
            line = self.parts[i][self.parts[i].rfind("\n") + 1 :]  # the marker's line, up to the marker
            head, *stats, tail = (_escape(t) for t in self._record(node, len(line) - len(line.lstrip(" "))))
            chunks[-1] += head
            chunks += [*stats, tail + _escape(self.parts[i + 1])]
        self.format = "%s".join(chunks)  # slots: the shape, then Max, Min, Mean, Norm
        self._shapes: dict[tuple[tuple[int, ...], int], str] = {}
        # the queue entries the records name, each once (first seen first), and per record where its
        # entry's 4 tokens start in that order
        self.unique = list(dict.fromkeys(self.indices))
        first = {index: 4 * n for n, index in enumerate(self.unique)}
        self.pos4 = [first[index] for index in self.indices]

    def __getstate__(self) -> dict[str, Any]:
        """What rendering needs, for the lane writer's helper process (``lane_writer``): not the
        step's record dicts (``nodes``) nor the text pieces the format was made from."""
        return {k: v for k, v in self.__dict__.items() if k not in ("nodes", "parts", "_kinds")}

    def _mark(self, node: Any, is_record: Callable[[Any], int | None]) -> Any:
        if isinstance(node, dict):
            index = is_record(node)
            if index is not None:
                self.nodes.append(node)
                self.indices.append(index)
                return _MARKER.format(len(self.nodes) - 1)
            return {key: self._mark(value, is_record) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            return [self._mark(value, is_record) for value in node]
        return node

    def _record(self, node: dict[str, Any], level: int) -> list[str]:
        """The record's fixed text around its shape and statistics, at its depth: the head up to
        the shape, the text before each statistic, and the tail (the other keys, the brace).
        Kept per kind of plain record (most of a step's records share a handful)."""
        self.levels.append(level)
        plain = len(node) == 4 and "requires_grad" in node
        key = (level, node["type"], node["dtype"], node.get("requires_grad")) if plain else None
        found = self._kinds.get(key) if key is not None else None
        if found is None:
            found = self._record_text(node, level)
            if key is not None:
                self._kinds[key] = found
        return found

    @staticmethod
    def _record_text(node: dict[str, Any], level: int) -> list[str]:
        inner = "\n" + " " * (level + 1)
        kind, dtype = json.dumps(node["type"]), json.dumps(node["dtype"])
        rest = [
            f",{inner}{json.dumps(key)}: {_nested(value, level + 1)}"
            for key, value in node.items()
            if key not in ("type", "dtype", "shape", LANE_RECORD, *STAT_KEYS)
        ]
        head = f'{{{inner}"type": {kind},{inner}"dtype": {dtype},{inner}"shape": '
        stats = [f',{inner}"{key}": ' for key in STAT_KEYS]
        return [head, *stats, "".join(rest) + "\n" + " " * level + "}"]

    def _shape(self, shape: list[int], level: int) -> str:
        key = (tuple(shape), level)
        text = self._shapes.get(key)
        if text is None:
            deeper, close = "\n" + " " * (level + 2), "\n" + " " * (level + 1) + "]"
            text = "[" + deeper + ("," + deeper).join(map(str, shape)) + close if shape else "[]"
            self._shapes[key] = text
        return text

    def render(
        self, shapes: Sequence[Sequence[list[int]]], values: Sequence[Sequence[list[Any]]], k: int
    ) -> str:
        """Lane ``k``'s text: record ``i`` of the template gets ``shapes[i][k]`` and ``values[i][k]``."""
        return next(self.render_lanes(shapes, values, [k]))

    def render_lanes(
        self,
        shapes: Sequence[Sequence[list[int]]],
        values: Sequence[Sequence[list[Any]]],
        lanes: Sequence[int],
        shared: Sequence[bool] | None = None,
    ) -> Iterator[str]:
        """Each of ``lanes``' text in turn (:meth:`render`), the statistics encoded once per queue
        entry and lane, not once per record.

        The statistics are encoded by json's C encoder (``float.__repr__``, ``NaN``, ``Infinity``,
        ``null``, ``true``: what the pure-Python one writes for them too); a float's repr is most of
        the cost (~1 us), so an entry that several records name (one module's output is the next
        one's input) is encoded once, and one that is ``shared`` (``shared[index]``: every lane's
        values and shape are lane 0's, as for a tensor no lane cuts, a parameter) once for all
        lanes."""
        unique, pos4 = self.unique, self.pos4
        common = [i for i in unique if shared is not None and shared[i]]
        own = [i for i in unique if shared is None or not shared[i]]
        slots = self._slots(common, own)
        common_tokens = _encode([v for i in common for v in values[i][0]])
        for k in lanes:
            tokens = common_tokens + _encode([v for i in own for v in values[i][k]])
            tok = [tokens[q] for q in slots]  # back in ``unique``'s order, 4 a entry
            args: list[str] = [""] * (5 * len(self.indices))
            args[0::5] = self._shape_texts(shapes, k)
            for j in range(4):
                args[1 + j :: 5] = [tok[q + j] for q in pos4]
            yield self.format % tuple(args)

    def _slots(self, common: list[int], own: list[int]) -> list[int]:
        """For each of ``unique``'s 4 tokens a entry, where it sits in ``common``'s tokens then ``own``'s."""
        at = {index: 4 * n for n, index in enumerate(common + own)}
        return [at[index] + j for index in self.unique for j in range(4)]

    def _shape_texts(self, shapes: Sequence[Sequence[list[int]]], k: int) -> list[str]:
        """Each record's shape text for lane ``k``; a lane's shape list shared by many records (one
        cut, one shape) is formatted once per depth."""
        memo: dict[tuple[int, int], str] = {}
        texts = []
        for index, level in zip(self.indices, self.levels, strict=True):
            shape = shapes[index][k]
            key = (id(shape), level)
            text = memo.get(key)
            if text is None:
                text = memo[key] = self._shape(shape, level)
            texts.append(text)
        return texts


def _encode(flat: list[Any]) -> list[str]:
    """Scalars as json's C encoder writes them, one string each."""
    return json.dumps(flat)[1:-1].split(", ") if flat else []


def _escape(text: str) -> str:
    return text.replace("%", "%%")


def save_text(path: str, text: str) -> None:
    """Write ``text`` as msprobe's ``save_json`` writes a file (an exclusive ``flock`` while it
    writes). msprobe's path checks (``check_path_before_create``) ran once for the lane's folder
    (``lane_collector.lane_paths``), not again for each of its files."""
    with open(path, "w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(text)
        fcntl.flock(handle, fcntl.LOCK_UN)


def stack_text(cache_stack: dict[Any, Any]) -> str:
    """``stack.json`` as msprobe's ``DataWriter.write_stack_info_json`` writes it."""
    return json.dumps({num: [value, key] for num, (key, value) in enumerate(cache_stack.items())}, indent=1)
