"""``run.json`` records verl's per-step metrics (``steps``), read from the driver's console output.

Every line here is written by the pin set's own code: verl's console logger
(``concat_dict_to_str``, what ``trainer.logger=[console]`` prints), verl's own debug metrics for
the NaN case, and Ray's log forwarding (``print_worker_logs``), which puts the actor's prefix in
front of a line that a Ray actor prints. The last test runs the command's ``execute`` on them.
"""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from verl_consistency.contracts.run_manifest import RunManifest, StepMetrics
from verl_consistency.entrypoints.run import step_metrics
from verl_consistency.entrypoints.run.command import execute, prepare_run_dir
from verl_consistency.entrypoints.run.overrides import Mode
from verl_consistency.entrypoints.run.plan import build_plan
from verl_consistency.entrypoints.run.plan_options import PlanOptions

from . import console_standin

pytestmark = [pytest.mark.verl, pytest.mark.pinset]

REPO = Path(__file__).resolve().parents[2]


def verl_line(metrics: dict[str, Any], step: int) -> str:
    """What verl's console logger prints for one ``Tracking.log(data=metrics, step=step)``."""
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    return concat_dict_to_str(metrics, step=step)


def through_ray(lines: list[str], actor: str = "TaskRunner", remote: bool = False) -> list[str]:
    """The driver's view of ``lines`` printed in a Ray actor: Ray's prefix, colour codes and all."""
    from ray._private import worker

    out = io.StringIO()
    data = {"pid": 4242, "ip": "10.0.0.9" if remote else "10.0.0.1", "localhost": "10.0.0.1"}
    worker.print_worker_logs({**data, "actor_name": actor, "lines": lines}, out)
    return out.getvalue().splitlines()


def empty_mask_debug_metrics() -> dict[str, Any]:
    """verl's own rollout-vs-actor metrics of a batch with no response token: NaN (one-token
    responses under PROMPTS_ONLY come out the same way, issue 35)."""
    import torch
    from verl import DataProto
    from verl.utils.debug.metrics import calculate_debug_metrics

    batch = DataProto.from_dict(
        tensors={
            "rollout_log_probs": torch.zeros(2, 3),
            "old_log_probs": torch.zeros(2, 3),
            "attention_mask": torch.zeros(2, 5, dtype=torch.long),
            "responses": torch.zeros(2, 3, dtype=torch.long),
        }
    )
    return calculate_debug_metrics(batch)


def step_one() -> dict[str, Any]:
    """A step's metrics as verl 0.9's trainer hands them to its logger: Python and numpy scalars,
    a bool, and a tensor (not a ``numbers.Number``: verl's console logger leaves it out)."""
    import numpy as np
    import torch

    return {
        "training/global_step": 1,
        "actor/entropy": np.float64(7.5207),
        "actor/pg_loss": -0.0123,
        "actor/grad_norm": 3.1415,
        "actor/lr": 1e-06,
        "actor/is_clipped": False,
        "critic/score/mean": np.float32(0.25),
        "critic/rewards/mean": 0.25,
        "critic/advantages/mean": np.float64(-1.5e-09),
        "response_length/mean": np.int64(16),
        "rollout_corr/kl": -0.00012,
        "rollout_corr/log_ppl_abs_diff": np.float64(0.00045),
        "training/rollout_probs_diff_mean": 1.4e-06,
        "timing_s/gen": 8.127131057000042,
        "timing_s/step": 33.86349214400002,
        "perf/total_num_tokens": 4096,
        "actor/pg_clipfrac_tensor": torch.tensor(0.1),
    }


def console_output() -> list[str]:
    """A hybrid run's stdout: config and progress lines, then three steps behind Ray's prefix."""
    step2 = {"actor/grad_norm": 0.0, "critic/rewards/mean": 0.0, "timing_s/step": 4.78}
    step2 |= empty_mask_debug_metrics()
    step3 = {"actor/grad_norm": float("inf"), "critic/score/mean": float("nan")}
    lines = [
        "{'actor_rollout_ref': {'actor': {'ppo_micro_batch_size_per_gpu': 1,",
        "  'global_step': 3, 'step': 2,",
        "Training Progress:  12%|█▎        | 1/8 [00:33<03:56, 33.86s/it]",
        verl_line(step_one(), 1),
        verl_line(step2, 2),
        verl_line(step3, 3),
    ]
    return ["ray init kwargs: {'num_cpus': None}", *through_ray(lines)]


def test_verls_lines_become_step_records() -> None:
    log = step_metrics.StepLog()
    fed = [log.feed(line) for line in console_output()]
    assert sum(fed) == 3  # the config and progress lines that mention a step are not step lines
    one, two, three = log.records()
    assert one == StepMetrics(
        step=1,
        grad_norm=3.1415,
        reward_mean=0.25,
        rollout_probs_diff_mean=1.4e-06,
        rollout_corr_kl=-0.00012,
        rollout_corr_log_ppl_abs_diff=0.00045,
        step_time_s=33.86349214400002,
    )
    # weights that did not move; verl's NaN debug metrics; rollout_corr not logged at all
    assert (two.grad_norm, two.reward_mean, two.step_time_s) == (0.0, 0.0, 4.78)
    assert two.rollout_probs_diff_mean is None
    assert two.not_finite == ["rollout_probs_diff_mean"]
    assert two.rollout_corr_kl is None
    assert three.grad_norm is None
    assert three.not_finite == ["grad_norm", "reward_mean"]
    assert three.step_time_s is None


def test_one_step_over_several_lines_and_other_prefixes() -> None:
    """verl 0.8.0's fully-async trainer logs a step's timings and metrics on two lines."""
    log = step_metrics.StepLog()
    timings = verl_line({"fully_async/total_wait_time": 1.5, "timing_s/step": 12.5}, 4)
    metrics = verl_line({"actor/grad_norm": 2.5, "critic/score/mean": 0.5}, 4)
    for line in [
        *through_ray([timings, metrics], actor="FullyAsyncTrainer", remote=True),
        verl_line({"actor/grad_norm": 1.0}, 3),  # an earlier step after a later one, no prefix
    ]:
        assert log.feed(line)
    three, four = log.records()
    assert (three.step, three.grad_norm) == (3, 1.0)
    assert (four.step, four.grad_norm, four.reward_mean, four.step_time_s) == (4, 2.5, 0.5, 12.5)
    assert log.last_step == 3


@pytest.mark.parametrize("color", ["0", "1"])
def test_ray_prefix_with_and_without_colour(monkeypatch: pytest.MonkeyPatch, color: str) -> None:
    monkeypatch.setenv("RAY_COLOR_PREFIX", color)
    (line,) = through_ray([verl_line({"actor/grad_norm": 0.5}, 7)])
    assert line.startswith("\x1b") is (color == "1")
    assert step_metrics.parse_line(line) == (7, {"actor/grad_norm": 0.5})


def test_values_as_pprint_writes_them() -> None:
    assert step_metrics.number("np.float64(0.5)") == 0.5
    assert step_metrics.number("np.int64(16)") == 16.0
    assert math.isnan(step_metrics.number("np.float32(nan)") or 0.0)
    assert step_metrics.number("True") == 1.0
    assert step_metrics.number("-inf") == -math.inf
    assert step_metrics.number("tensor(0.1)") is None  # not a number verl would print; skipped


def _no_nan(text: str) -> dict[str, Any]:
    def refuse(name: str) -> None:
        raise AssertionError(f"run.json holds {name}: not JSON")

    data: dict[str, Any] = json.loads(text, parse_constant=refuse)
    return data


@pytest.mark.parametrize("exit_code", [0, 1])
def test_run_json_records_the_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exit_code: int) -> None:
    """The command's own ``prepare_run_dir`` and ``execute``, with a stand-in for verl's driver."""
    lines = tmp_path / "driver-stdout.txt"
    lines.write_text("\n".join(console_output()) + "\n")
    monkeypatch.setenv(console_standin.LINES, str(lines))
    monkeypatch.setenv(console_standin.EXIT, str(exit_code))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    plan = build_plan(
        Mode.HYBRID,
        PlanOptions(dump_root=tmp_path / "dump", run_id="steps", environ={}, python=sys.executable),
    )
    plan = plan.model_copy(update={"module": console_standin.__name__})
    manifest = prepare_run_dir(plan)
    assert manifest.steps == []

    assert execute(plan, manifest) == exit_code
    data = _no_nan(plan.layout.run_manifest.read_text())
    written = RunManifest.model_validate(data)
    assert written.exit_code == exit_code
    assert [s.step for s in written.steps] == [1, 2, 3]
    assert written.steps[0].grad_norm == 3.1415
    assert data["steps"][1]["rollout_probs_diff_mean"] is None
    assert data["steps"][1]["not_finite"] == ["rollout_probs_diff_mean"]
