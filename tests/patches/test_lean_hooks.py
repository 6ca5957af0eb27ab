"""msprobe's module hook pair, lean (``patches/hooks/lanes/lean_hooks.py``, issue 43), against msprobe's own.

``tests/selective/lean_hooks_scenario.py`` dumps one packed micro batch of a transformers Qwen2
four times on the one-pass lanes front with real mindstudio-probe: with the lean pair and with
msprobe's own hooks, without gradients (the lean pair dumps every module call itself) and with
them (it must hand every call to msprobe's hooks). Each lane's ``dump.json``, ``stack.json`` and
``construct.json`` must be byte for byte the same either way, and ``uninstall`` must leave
msprobe's own hooks in their slots.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.subprocess_run import run_module_json
from verl_consistency.contracts.records import LANE_PREFIX

pytestmark = [pytest.mark.msprobe, pytest.mark.pinset]

FILES = ("dump.json", "stack.json", "construct.json")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("lean-hooks")
    return out, run_module_json("tests.selective.lean_hooks_scenario", str(out), result=out / "result.json")


def _lane_files(out: Path, step: int) -> dict[str, str]:
    found = {}
    for path in sorted((out / "dump" / f"step{step}").glob(f"*/{LANE_PREFIX}*/*.json")):
        if path.name in FILES:
            found[f"{path.parent.name}/{path.name}"] = path.read_text()
    return found


@pytest.mark.parametrize(("lean", "reference"), [("lean", "msprobe"), ("lean-grad", "msprobe-grad")])
def test_the_lanes_files_are_msprobes_own(
    run: tuple[Path, dict[str, Any]], lean: str, reference: str
) -> None:
    out, result = run
    got = _lane_files(out, result["steps"][lean]["step"])
    want = _lane_files(out, result["steps"][reference]["step"])
    assert len(want) == 3 * len(FILES)  # three lanes
    assert got.keys() == want.keys()
    for name, text in want.items():
        assert got[name] == text, name
    assert '"Module.' in want[f"{LANE_PREFIX}0/dump.json"]
    assert "File " in want[f"{LANE_PREFIX}0/stack.json"]  # the stacks were taken, not left empty


def test_without_gradients_the_lean_pair_dumps_every_module_call(run: tuple[Path, dict[str, Any]]) -> None:
    out, result = run
    steps = result["steps"]
    assert result["pairs"] > 10  # every hooked module of the model
    dumped = json.loads(_lane_files(out, steps["lean"]["step"])[f"{LANE_PREFIX}0/dump.json"])["data"]
    calls = [name for name in dumped if name.startswith("Module.")]
    assert len(calls) > 10
    assert steps["lean"]["lean_calls"] == len(calls)
    assert steps["msprobe"]["lean_calls"] == 0


def test_with_gradients_every_call_is_msprobes(run: tuple[Path, dict[str, Any]]) -> None:
    _, result = run
    assert result["steps"]["lean-grad"]["lean_calls"] == 0
    assert result["steps"]["msprobe-grad"]["lean_calls"] == 0


def test_uninstall_puts_msprobes_hooks_back(run: tuple[Path, dict[str, Any]]) -> None:
    _, result = run
    assert result["restored"] is True
