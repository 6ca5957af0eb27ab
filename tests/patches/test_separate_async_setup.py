"""verl 0.9.1's separate_async set-up on the run's own config (``patches/next/verl/0008``).

``run fully-async`` on the next set runs ``PPOTrainerSeparateAsync`` with
``actor_rollout_ref.hybrid_engine=false``; unpatched, its ``_setup`` then calls
``logger.info(..., flush=True)`` (``trainer_separate_async.py:181``) and every run stopped with
``TypeError: Logger._log() got an unexpected keyword argument 'flush'`` (one H100, 2026-12-06).
``separate_async_driver.py`` runs the real ``_setup`` on CPU, patched and unpatched, with
stand-ins only for what needs a cluster (named there), so a crash on that branch fails CI.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import pytest

from bench.support.verl_support import run_patched
from tests.entrypoints.test_verl_validation import dry_run_plan
from tests.patches.test_vllm_patch import read_member
from verl_consistency.contracts import pins
from verl_consistency.entrypoints.run.overrides import Mode
from verl_consistency.patches.tooling import apply, upstream

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.pinset,
    pytest.mark.skipif(pins.get("set.name") != "next", reason="verl 0.9.1's V1 separate_async (next set)"),
]

TARGET = "verl/trainer/ppo/v1/trainer_separate_async.py"
PATCH = "0008-separate-async-log-flush.patch"
DRIVER = Path(__file__).with_name("separate_async_driver.py")
LOG_LINE = "[V1SepAsync] hybrid replicas disabled (actor_rollout_ref.hybrid_engine=False)"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The unpatched ``trainer_separate_async.py``, from the pinned wheel."""
    path = tmp_path_factory.mktemp("pristine") / "trainer_separate_async.py"
    path.write_bytes(read_member(upstream.fetch_wheel("verl"), TARGET))
    return path


@pytest.fixture(scope="module")
def report(root: Path, pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One driver run on the patched verl with ``run fully-async``'s own overrides."""
    plan = dry_run_plan(Mode.FULLY_ASYNC)
    args = tmp_path_factory.mktemp("setup") / "args.json"
    args.write_text(
        json.dumps({"module": plan["module"], "overrides": plan["overrides"], "pristine": str(pristine)})
    )
    script = (
        f"import runpy, sys; sys.argv = [{str(DRIVER)!r}, {str(args)!r}]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    # VERL_LOGGING_LEVEL unset is verl's INFO (trainer_separate_async.py:36), as in the runs: the bad
    # call only raises when INFO is enabled.
    out = run_patched(root, script, env={"VERL_LOGGING_LEVEL": "INFO"}, timeout=240)
    line = next(x for x in out.splitlines() if x.startswith("VC_REPORT "))
    result: dict[str, Any] = json.loads(line.removeprefix("VC_REPORT "))
    return result


def test_only_0008_touches_the_file_and_only_drops_flush(root: Path, pristine: Path) -> None:
    """The unpatched variant below is the series without 0008: no other patch edits this file."""
    touching = [p.name for p in apply.read_series("verl") if TARGET in p.targets]
    assert touching == [PATCH]
    before, after = pristine.read_text().splitlines(), (root / TARGET).read_text().splitlines()
    diff = [
        line
        for line in difflib.unified_diff(before, after)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert diff == ["-                flush=True,"]


def test_patched_setup_completes_in_trainer_mode(report: dict[str, Any], root: Path) -> None:
    patched = report["patched"]
    assert patched["file"] == str(root / TARGET), "the driver ran the patched verl's own module"
    assert patched["enable_hybrid_replicas"] is False, "run fully-async sets hybrid_engine=false"
    assert patched["error"] is None, patched["error"]
    assert patched["mode"] == "trainer", "no hybrid replicas: the engine never enters ROLLOUT mode"
    assert f"INFO {LOG_LINE}: rollout served by 2 standalone replicas only" in patched["logs"]
    assert patched["standalone_start_rank"] == 0, "no hybrid replicas: standalone ranks start at 0"
    assert patched["checkpoint"] == {
        "config": "CheckpointEngineConfig",
        "backend": "nccl",
        "replicas_are_standalone": True,
        "actor_wg_is_trainers": True,
    }


def test_unpatched_setup_raises_the_h100_runs_type_error(report: dict[str, Any], pristine: Path) -> None:
    unpatched = report["unpatched"]
    assert unpatched["file"] == str(pristine)
    assert unpatched["enable_hybrid_replicas"] is False
    assert unpatched["error"] is not None, "verl 0.9.1 unpatched no longer fails here: is 0008 still needed?"
    assert unpatched["error"]["type"] == "TypeError"
    assert "unexpected keyword argument 'flush'" in unpatched["error"]["message"]
    assert unpatched["error"]["at"] == "_setup:181"
    assert not any(LOG_LINE in line for line in unpatched["logs"]), "the line is never logged"
    assert unpatched["mode"] == "trainer", "it fails right after setting the mode, in the log call"
