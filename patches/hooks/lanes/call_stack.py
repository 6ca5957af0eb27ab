"""msprobe's call-stack capture, remembered per call stack: the same ``stack.json``, less host time.

Why: for every dumped module call msprobe's ``BaseDataProcessor.analyze_api_call_stack`` walks the
Python stack and, for each of its ~40 frames, reads the source line (``linecache``), tests the path
against its filters and formats a line. Once the lanes' statistics were batched (issue 32), that was
the largest host cost left in a dumped step on an H200 (0.33 ms a call, ~400 calls a step for
Qwen2-0.5B: ``bench/results/fsdp-onepass-profile-h200-next.txt``). A forward calls each module from
the same few call sites step after step, so the frames' (code, line) pairs repeat exactly, and so
does the text msprobe makes of them. :func:`remembering` walks the frames as msprobe does (from the
same depth, with its ``skip_frames``), looks the stack up by each frame's code object's identity
and last instruction (one int each: a code object's own hash is recomputed from its bytecode and
constants at every call, ~7 us for a 40-frame stack; an instruction has one line), and formats a
stack only the first time it is seen: per frame the same ``linecache`` line, the same filters
(``Const.STACK_FILTER_KEYWORDS``, ``Const.CALL_STACK_FLAG``) and the same text.
``tests/selective/test_lane_stats.py`` compares its result with msprobe's own function called from
the same depth.

Where: :class:`lane_collector.LaneStats` puts it on its one collector's data processor (an instance
attribute over the static method; msprobe's ``DataCollector.call_stack_collect`` calls
``self.data_processor.analyze_api_call_stack(name)``), so only the one-pass lanes' collector uses it
and msprobe itself stays unpatched. Like msprobe's, it catches any failure and answers
``Const.WITHOUT_CALL_STACK``.

The memory is per collector and grows with the distinct call stacks of the dumped steps (a few
hundred for a model's forward); a source file edited while the process runs is not re-read (msprobe's
``linecache`` would re-read it only after a ``checkcache`` either).
"""

from __future__ import annotations

import linecache
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

Site = tuple[Any, int]
"""A frame's code object and line: what msprobe's text of that frame depends on."""

HIDDEN: set[Any] = set()
"""Code objects whose frames are left out of a stack's text: ``lean_hooks``' pair, whose frame sits
between torch's and msprobe's hook when it hands a call to msprobe's own hook (msprobe's filters
leave out its own frames by path; ours would show)."""


def remembering(msprobe_const: Any, warn: Callable[[str], None]) -> Callable[[str], tuple[str, ...]]:
    """A drop-in for ``analyze_api_call_stack``: the same tuple of lines, formatted once per stack.

    ``msprobe_const`` is msprobe's ``Const`` (its filters and its ``WITHOUT_CALL_STACK``); ``warn``
    its logger's ``warning``, as msprobe reports a failed capture."""
    stacks: dict[tuple[int, ...], tuple[str, ...]] = {}
    lines: dict[Site, str | None] = {}
    filters = tuple(msprobe_const.STACK_FILTER_KEYWORDS)
    flag = msprobe_const.CALL_STACK_FLAG

    def line_of(site: Site) -> str | None:
        code, lineno = site
        path = code.co_filename
        source = linecache.getline(path, lineno).strip()
        if not source or any(f in path for f in filters) or flag in path:
            return None
        return f"File {path}, line {lineno}, in {code.co_name}, \n {source}"

    def analyze_api_call_stack(name: str) -> tuple[str, ...]:
        # frame 0 is this function, where msprobe's frame 0 is its own: the same skip counts
        skip = 4 if name.startswith("Primitive") else 5
        top: FrameType | None = sys._getframe(0)
        for _ in range(skip):
            if top is None:
                break
            top = top.f_back
        return from_frame(name, top)

    def from_frame(name: str, top: FrameType | None) -> tuple[str, ...]:
        """The stack from ``top`` outwards (``lean_hooks``: torch's frame that called the hook)."""
        try:
            # the key: each frame's code by identity and its last instruction. A code object hashes
            # its name, bytecode and constants anew at every hash (~0.2 us each, ~40 frames a call),
            # its id is one int; ``f_lineno`` is looked up in the line table at every read, the
            # instruction offset is stored (one offset has one line, so the texts follow). Every
            # code object of a remembered stack is kept alive by ``lines``: no id met here can be a
            # later code object's.
            key: list[int] = []
            frame: FrameType | None = top
            while frame is not None:
                key.append(id(frame.f_code))
                key.append(frame.f_lasti)
                frame = frame.f_back
            found = stacks.get(tuple(key))
            if found is None:
                texts = []
                frame = top
                while frame is not None:
                    if frame.f_code in HIDDEN:
                        frame = frame.f_back
                        continue
                    site = (frame.f_code, frame.f_lineno)
                    if site not in lines:
                        lines[site] = line_of(site)
                    text = lines[site]
                    if text is not None:
                        texts.append(text)
                    frame = frame.f_back
                found = stacks[tuple(key)] = tuple(texts)
            return found
        except Exception as exc:  # as msprobe: a failed capture is a warning and a placeholder
            warn(f"The call stack of <{name}> failed to retrieve, {exc}.")
            return (msprobe_const.WITHOUT_CALL_STACK,)

    analyze_api_call_stack.from_frame = from_frame  # type: ignore[attr-defined]
    return analyze_api_call_stack
