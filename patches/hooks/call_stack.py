"""msprobe's call-stack capture, remembered per call stack: the same ``stack.json``, less host time.

Why: for every dumped module call msprobe's ``BaseDataProcessor.analyze_api_call_stack`` walks the
Python stack and, for each of its ~40 frames, reads the source line (``linecache``), tests the path
against its filters and formats a line. Once the lanes' statistics were batched (issue 32), that was
the largest host cost left in a dumped step on an H200 (0.33 ms a call, ~400 calls a step for
Qwen2-0.5B: ``bench/results/fsdp-onepass-profile-h200-next.txt``). A forward calls each module from
the same few call sites step after step, so the frames' (code, line) pairs repeat exactly, and so
does the text msprobe makes of them. :func:`remembering` walks the frames as msprobe does (from the
same depth, with its ``skip_frames``), looks the pairs up, and formats a stack only the first time
it is seen: per frame the same ``linecache`` line, the same filters (``Const.STACK_FILTER_KEYWORDS``,
``Const.CALL_STACK_FLAG``) and the same text. ``tests/selective/test_lane_stats.py`` compares its
result with msprobe's own function called from the same depth.

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
from typing import Any

Site = tuple[Any, int]
"""A frame's code object and line: what msprobe's text of that frame depends on."""


def remembering(msprobe_const: Any, warn: Callable[[str], None]) -> Callable[[str], tuple[str, ...]]:
    """A drop-in for ``analyze_api_call_stack``: the same tuple of lines, formatted once per stack.

    ``msprobe_const`` is msprobe's ``Const`` (its filters and its ``WITHOUT_CALL_STACK``); ``warn``
    its logger's ``warning``, as msprobe reports a failed capture."""
    stacks: dict[tuple[Site, ...], tuple[str, ...]] = {}
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
        try:
            frame = sys._getframe(0)
            for _ in range(skip):
                if frame is None:
                    break
                frame = frame.f_back
            sites: list[Site] = []
            while frame is not None:
                sites.append((frame.f_code, frame.f_lineno))
                frame = frame.f_back
            key = tuple(sites)
            found = stacks.get(key)
            if found is None:
                texts = []
                for site in key:
                    if site not in lines:
                        lines[site] = line_of(site)
                    text = lines[site]
                    if text is not None:
                        texts.append(text)
                found = stacks[key] = tuple(texts)
            return found
        except Exception as exc:  # as msprobe: a failed capture is a warning and a placeholder
            warn(f"The call stack of <{name}> failed to retrieve, {exc}.")
            return (msprobe_const.WITHOUT_CALL_STACK,)

    return analyze_api_call_stack
