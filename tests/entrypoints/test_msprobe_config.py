"""The generated msprobe configs are accepted by real mindstudio-probe 26.2.0, and dump where the
layout says. Each config is loaded in its own subprocess: PrecisionDebugger is a per-process singleton."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verl_consistency.contracts.layout import RunLayout
from verl_consistency.entrypoints.msprobe.config import (
    DumpOptions,
    Level,
    Task,
    build,
    parse_selection,
    write,
)

pytestmark = [pytest.mark.msprobe, pytest.mark.pinset]

# Load the config with the real PrecisionDebugger, dump one forward of a small module, report back.
PROBE = r"""
import json, sys, torch
from msprobe.pytorch import PrecisionDebugger
debugger = PrecisionDebugger(config_path=sys.argv[1])
cfg = debugger.config
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
debugger.start(model=model)
model(torch.ones(2, 4))
debugger.stop()
debugger.step()
print(json.dumps({"task": cfg.task, "level": cfg.level, "dump_path": cfg.dump_path,
                  "step": list(cfg.step), "rank": list(cfg.rank)}))
"""


# Both configs of a run come from one option set and differ only in dump_path, so each msprobe
# start-up (~13 s here) checks one side, and the two cases together cover both tasks and both sides.
@pytest.mark.parametrize(
    ("task", "level", "side"), [(Task.STATISTICS, Level.L0, "rollout"), (Task.TENSOR, Level.MIX, "actor")]
)
def test_precision_debugger_loads_the_config(tmp_path: Path, task: Task, level: Level, side: str) -> None:
    layout = RunLayout(tmp_path, "run-1")
    configs = build(layout, DumpOptions(task=task, level=level, steps=parse_selection("0-2,5", "step")))
    write(layout, configs)
    path, dump_dir = {
        "rollout": (layout.rollout_config, layout.rollout_dir),
        "actor": (layout.actor_config, layout.actor_dir),
    }[side]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "task": task.value,
        "level": level.value,
        "dump_path": str(dump_dir),
        "step": [0, 1, 2, 5],
        "rank": [],
    }
    dumps = list(dump_dir.glob("step0/*/dump.json"))
    assert len(dumps) == 1
    assert json.loads(dumps[0].read_text())["task"] == task.value


def test_config_json_shape(tmp_path: Path) -> None:
    configs = build(RunLayout(tmp_path, "r"), DumpOptions(ranks=[0, "2-3"]))
    assert configs.rollout.to_json() == {
        "task": "statistics",
        "dump_path": str(tmp_path / "r" / "rollout"),
        "rank": [0, "2-3"],
        "step": [],
        "level": "L0",
        "async_dump": False,
        "statistics": {
            "scope": [],
            "list": [],
            "data_mode": ["all"],
            "tensor_list": [],
            "summary_mode": "statistics",
        },
    }
    assert configs.actor.dump_path == str(tmp_path / "r" / "actor")
    assert "statistics" not in build(RunLayout(tmp_path, "r"), DumpOptions(task=Task.TENSOR)).actor.to_json()


def test_parse_selection() -> None:
    assert parse_selection(None, "step") == []
    assert parse_selection("all", "step") == []
    assert parse_selection("0, 3-4,7", "step") == [0, "3-4", 7]
    with pytest.raises(ValueError, match="N <= M"):
        parse_selection("4-3", "rank")


def test_capture_fraction_defaults_to_tensor(tmp_path: Path) -> None:
    from verl_consistency.entrypoints.run.overrides import Mode
    from verl_consistency.entrypoints.run.plan import build_plan
    from verl_consistency.entrypoints.run.plan_options import PlanOptions

    frac = build_plan(
        Mode.HYBRID, PlanOptions(dump_root=tmp_path, run_id="c", capture="fraction:0.25", environ={})
    )
    assert frac.dump.task is Task.TENSOR
    assert frac.env["VERL_CONSISTENCY_CAPTURE"] == "fraction:0.25"
    stats = build_plan(
        Mode.HYBRID,
        PlanOptions(
            dump_root=tmp_path, run_id="c", capture="fraction:0.25", task=Task.STATISTICS, environ={}
        ),
    )
    assert stats.dump.task is Task.STATISTICS
    assert (
        build_plan(Mode.HYBRID, PlanOptions(dump_root=tmp_path, run_id="c", environ={})).dump.task
        is Task.STATISTICS
    )
