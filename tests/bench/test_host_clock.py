"""``bench/support/host_clock.py``: the split of a dumped step's added time that the benches print.

The clock must charge the lanes' real methods only while on, count what took msprobe's per-lane
path by kind, keep collections out of the methods they ran in (and asked-for ``gc.collect()`` calls
out of the automatic ones), and put everything back when closed; the line must say each part's
share and the rest, and no shares when the pass added nothing measurable.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator

import pytest
import torch

from bench.support.host_clock import HostClock, per_lane_line, split_line
from verl_consistency.patches.hooks.lanes.lane_stats import LaneStatQueue
from verl_consistency.patches.hooks.lanes.msprobe_lanes import Cut

pytestmark = pytest.mark.msprobe


@pytest.fixture
def clock() -> Iterator[HostClock]:
    found = HostClock()
    try:
        yield found
    finally:
        found.close()


def test_the_clock_charges_the_lanes_methods_only_while_on(clock: HostClock) -> None:
    from msprobe.core.common.utils import slice_by_config

    queue = LaneStatQueue([[Cut(0, 4, 0, 2)], [Cut(0, 4, 2, 4)]])

    def stat(part: torch.Tensor) -> list[torch.Tensor]:
        return [part.max(), part.min(), part.float().mean(), part.float().norm()]

    queue.add(torch.ones(4, 3), full=True)  # off: not counted
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between: the one below is the only one
    try:
        clock.on = True
        queue.add(torch.ones(4, 3), full=True)
        queue.add_per_lane(torch.ones(4, dtype=torch.bool), stat, slice_by_config)
        gc.collect()  # asked for: counted apart from the automatic collections
        clock.on = False
    finally:
        if was_enabled:
            gc.enable()
    assert clock.calls == {"add": 1, "add_per_lane": 1}
    assert clock.per_lane == Counter({"Tensor torch.bool [4]": 1})
    split = clock.split()
    assert split["add"] > 0
    assert split["add_per_lane"] > 0
    assert split["gc.collect()"] > 0
    assert split["gc"] == 0  # no automatic collection counted for the one asked for
    clock.reset()
    assert clock.split() == {"gc": 0, "gc.collect()": 0}


def test_closing_puts_back_what_the_clock_wrapped() -> None:
    original_add, original_collect = LaneStatQueue.__dict__["add"], gc.collect
    clock = HostClock()
    assert LaneStatQueue.__dict__["add"] is not original_add
    assert gc.collect is not original_collect
    clock.close()
    assert LaneStatQueue.__dict__["add"] is original_add
    assert gc.collect is original_collect
    assert clock._collected not in gc.callbacks


def test_the_split_line_gives_shares_and_the_rest_and_no_shares_for_noise() -> None:
    parts = {"_analyze_tensor": 0.1, "add_per_lane": 0.02, "write_json": 0.2, "gc": 0.05, "gc.collect()": 0.5}
    line = split_line(parts, 0.5, 2)
    assert (
        "lanes' per-tensor step (add included) 0.100 s, 20% (msprobe's per-lane path 0.020 s of it)" in line
    )
    assert "the rest (msprobe's hook walk) 0.150 s, 30%, of 0.500 s added" in line
    assert line.endswith("besides: gc.collect() calls 0.500 s (undumped passes make them too)")
    noisy = split_line(parts, -0.1, 2)
    assert "%" not in noisy
    assert "the rest" not in noisy


def test_the_per_lane_line_names_the_most_frequent_kinds_per_pass() -> None:
    kinds = Counter(
        {"Tensor torch.bool [1x1x8x8]": 96, "Tensor torch.float32 []": 4, "Tensor torch.int8 [2]": 2}
    )
    assert per_lane_line(kinds, 2) == (
        "msprobe's per-lane path: 51 tensors (Tensor torch.bool [1x1x8x8] x48, Tensor torch.float32 [] x2, "
        "Tensor torch.int8 [2] x1)"
    )
    assert "none" in per_lane_line(Counter(), 1)


def test_the_collection_after_a_dumped_step_counts_with_the_collections(clock: HostClock) -> None:
    from verl_consistency.patches.hooks.training import gc_pause

    was_enabled = gc.isenabled()
    gc.enable()
    try:
        gc_pause.pause()
        clock.on = True
        gc_pause.resume()  # its gc.collect(0) is the dumped step's, not an asked-for one
        clock.on = False
    finally:
        if not was_enabled:
            gc.disable()
    split = clock.split()
    assert clock.gc_count[0] == 1
    assert split["gc"] > 0
    assert split["gc.collect()"] == 0
    assert "resume" in split
