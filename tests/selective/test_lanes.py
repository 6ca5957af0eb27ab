"""Per-request lanes out of packed steps, with REAL mindstudio-probe 26.2.0 on CPU.

``lanes_scenario.py`` runs the vLLM-layout stand-in under msprobe in its own process (msprobe's
``PrecisionDebugger`` is one per process, as in a vLLM worker). Each lane of a packed step must be
the dump of that request computed alone: the same keys, shapes and statistics (tensors too), and
the pinned msprobe's own ``compare`` must read it unchanged and find every row the same.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fixtures.subprocess_run import run_module_json
from tests.selective.dump_stats import mismatches, tensors
from tests.selective.scenario import PACKING
from verl_consistency.contracts.records import LANE_PREFIX
from verl_consistency.patches.hooks.lanes.msprobe_lanes import Cut, packed_lanes

pytestmark = [pytest.mark.msprobe, pytest.mark.pinset]

ALONE_STEP = {"a": 2, "b": 3, "c": 4}
LOGITS = "Module.logits_processor.LogitsProcessor.forward.0"


def _run(task: str, out: Path) -> dict[str, Any]:
    return run_module_json("tests.selective.lanes_scenario", task, str(out), result=out / "result.json")


@pytest.fixture(scope="module")
def stats_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lanes-stats")
    assert _run("statistics", out)["dumped"] == [True, False, True, True, True, True, True]
    return out


@pytest.fixture(scope="module")
def tensor_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lanes-tensor")
    _run("tensor", out)
    return out


def _lane(out: Path, step: int, lane: int) -> Path:
    (path,) = (out / "dump" / f"step{step}").glob(f"*/{LANE_PREFIX}{lane}/dump.json")
    return path


def _data(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())["data"]


def test_every_request_of_a_packed_step_gets_its_own_dump(stats_run: Path) -> None:
    (rank,) = (stats_run / "dump" / "step0").iterdir()
    assert sorted(p.name for p in rank.iterdir()) == [f"{LANE_PREFIX}{k}" for k in range(3)]
    # no whole-step dump beside the lanes: a packed step costs its lanes' bytes, no more
    assert not (rank / "dump.json").exists()
    # the undumped decode step takes no msprobe step
    assert sorted(p.name for p in (stats_run / "dump").iterdir()) == [f"step{i}" for i in (0, 2, 3, 4, 5, 6)]


@pytest.mark.parametrize("lane", range(3))
def test_each_lane_equals_its_request_computed_alone(stats_run: Path, lane: int) -> None:
    request = PACKING[lane]
    assert mismatches(_data(_lane(stats_run, 0, lane)), _data(_lane(stats_run, ALONE_STEP[request], 0))) == []


def test_a_lane_differs_from_another_request(stats_run: Path) -> None:
    """The control: the comparison above can fail."""
    assert mismatches(_data(_lane(stats_run, 0, 0)), _data(_lane(stats_run, ALONE_STEP["b"], 0))) != []


def test_lanes_follow_the_order_asked_not_the_packing_order(stats_run: Path) -> None:
    for lane, request in enumerate(["c", "a"]):
        assert (
            mismatches(_data(_lane(stats_run, 5, lane)), _data(_lane(stats_run, ALONE_STEP[request], 0)))
            == []
        )
    (rank,) = (stats_run / "dump" / "step5").iterdir()
    assert sorted(p.name for p in rank.iterdir()) == [f"{LANE_PREFIX}0", f"{LANE_PREFIX}1"]


def test_the_one_request_path_still_works_after_lanes(stats_run: Path) -> None:
    (whole,) = (stats_run / "dump" / "step6").glob("*/dump.json")
    # msprobe's own cut leaves the [num_reqs, vocab] logits whole (the lanes cut them, above)
    assert mismatches(_data(whole), _data(_lane(stats_run, ALONE_STEP["b"], 0))) == [
        f"{LOGITS}: shape [3, 48] != [1, 48]",
        f"{LOGITS}: shape [3, 96] != [1, 96]",
    ]


def test_lane_tensors_are_the_request_rows_only(tensor_run: Path) -> None:
    compared = 0
    for lane, request in enumerate(PACKING):
        packed_path, alone_path = _lane(tensor_run, 0, lane), _lane(tensor_run, ALONE_STEP[request], 0)
        packed, alone = _data(packed_path), _data(alone_path)
        for key, entry in packed.items():
            for tp, ta in zip(tensors(entry), tensors(alone[key]), strict=True):
                a = torch.load(packed_path.parent / "dump_tensor_data" / tp["data_name"], weights_only=True)
                b = torch.load(alone_path.parent / "dump_tensor_data" / ta["data_name"], weights_only=True)
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=key)
                assert a.untyped_storage().nbytes() == a.nbytes, f"{key}: the file holds more than the rows"
                compared += 1
    assert compared > 200


def test_pinned_msprobe_compare_reads_a_lane_unchanged(tensor_run: Path, tmp_path: Path) -> None:
    target, golden = _lane(tensor_run, 0, 1), _lane(tensor_run, ALONE_STEP["b"], 0)
    # the installed `msprobe` console script, run by this interpreter
    cli = "import sys; from msprobe.msprobe import main; sys.argv[0] = 'msprobe'; sys.exit(main())"
    cmd = [sys.executable, "-c", cli, "compare", "-tp", str(target), "-gp", str(golden), "-o", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (table,) = tmp_path.glob("compare_result_*.csv")
    rows = list(csv.DictReader(table.open()))
    assert len(rows) >= len(tensors(_data(target)))  # msprobe adds rows for non-tensor items
    assert {r["Result"] for r in rows} == {"pass"}
    cosines = [float(r["Cosine"]) for r in rows if r["Cosine"] not in ("unsupported", "N/A")]
    assert len(cosines) > 90
    assert min(cosines) > 0.99999


def test_packed_lanes_offsets_and_cuts() -> None:
    lanes = packed_lanes({"c": 5, "a": 7, "b": 11}, ["a", "b", "c"], ["b", "c"], request_rows=True)
    assert [lane.request_id for lane in lanes] == ["b", "c"]
    assert lanes[0].cuts == (Cut(0, 23, 7, 18), Cut(0, 3, 1, 2))
    assert lanes[1].cuts == (Cut(0, 23, 18, 23), Cut(0, 3, 2, 3))
    # a training engine's packed rows: [1, total, ...] and [total, ...]
    (thd,) = packed_lanes({"x": 4, "y": 6}, ["x", "y"], ["y"], dims=(1, 0))
    assert thd.cuts == (Cut(1, 10, 4, 10), Cut(0, 10, 4, 10))
    # as many requests as tokens: the row cut could hit token rows, so it is left out
    (one,) = packed_lanes({"x": 1, "y": 1}, ["x", "y"], ["y"], request_rows=True)
    assert one.cuts == (Cut(0, 2, 1, 2),)


@pytest.mark.parametrize(
    ("tokens", "order", "wanted", "message"),
    [
        ({"a": 1, "b": 2}, ["a"], ["a"], "different requests"),
        ({"a": 1, "b": 0}, ["a", "b"], ["a"], "positive int"),
        ({"a": 1, "b": True}, ["a", "b"], ["a"], "positive int"),
        ({"a": 1, "b": 2}, ["a", "b"], ["z"], "not in this batch"),
    ],
)
def test_packed_lanes_refuses_what_would_cut_the_wrong_rows(
    tokens: dict[str, Any], order: list[str], wanted: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        packed_lanes(tokens, order, wanted)
