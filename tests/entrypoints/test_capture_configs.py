"""``--capture fraction:F``: the configs the run writes are the ones the bench supports, the vLLM
hook accepts them, and the two sides dump the same, comparable modules.

The end-to-end case runs each side in its own process with real mindstudio-probe 26.2.0 (see
``capture_sides.py`` for what is real there and what is a stand-in).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fixtures.subprocess_run import run_module_json
from tests.selective.scenario import tiny_config
from verl_consistency.contracts.capture import CaptureRule
from verl_consistency.contracts.env import CAPTURE, RUN_DIR
from verl_consistency.entrypoints.msprobe.config import Level, Task, parse_data_mode, parse_modules, write
from verl_consistency.entrypoints.run.overrides import Mode
from verl_consistency.entrypoints.run.plan import RunPlan, build_plan
from verl_consistency.entrypoints.run.plan_options import PlanError, PlanOptions
from verl_consistency.patches.hooks.rollout import dispatch, request_scope

pytestmark = pytest.mark.pinset

REPO = Path(__file__).resolve().parents[2]
FRACTION = "fraction:0.5"


def _plan(tmp_path: Path, **kw: Any) -> RunPlan:
    return build_plan(Mode.HYBRID, PlanOptions(dump_root=tmp_path, run_id="cap", environ={}, **kw))


def _section(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg[cfg["task"]]


def test_fraction_defaults_are_scoped_tensor_blocks_outputs_on_both_sides(tmp_path: Path) -> None:
    plan = _plan(tmp_path, capture=FRACTION)
    rollout, actor = plan.msprobe.rollout.to_json(), plan.msprobe.actor.to_json()
    assert rollout["task"] == actor["task"] == "tensor"
    for cfg in (rollout, actor):
        assert _section(cfg)["list"] == request_scope.BLOCK_TENSOR_LIST
        assert _section(cfg)["data_mode"] == request_scope.TENSOR_DATA_MODE
    assert _section(rollout)["request_id"] == request_scope.CAPTURED_SENTINEL
    assert "request_id" not in _section(actor)  # training micro batches hold one sample already
    # writing it through scoped_msprobe_config again changes nothing: it is already scoped
    assert request_scope.scoped_msprobe_config(rollout) == rollout


def test_the_default_captures_every_request_in_statistics(tmp_path: Path) -> None:
    """``run`` with no options: every request, one lane per comparable request, statistics."""
    plan = _plan(tmp_path)
    assert plan.capture == "fraction:1"
    rollout, actor = plan.msprobe.rollout.to_json(), plan.msprobe.actor.to_json()
    assert rollout["task"] == actor["task"] == "statistics", "coverage, not a tensor sample"
    assert _section(rollout)["request_id"] == request_scope.CAPTURED_SENTINEL
    assert (_section(rollout)["list"], _section(rollout)["data_mode"]) == ([], ["all"])


def test_capture_all_keeps_the_recipe_config(tmp_path: Path) -> None:
    plan = _plan(tmp_path, capture="all")
    for cfg in (plan.msprobe.rollout.to_json(), plan.msprobe.actor.to_json()):
        assert cfg["task"] == "statistics"
        assert _section(cfg)["list"] == []
        assert _section(cfg)["data_mode"] == ["all"]
        assert "request_id" not in _section(cfg)


def test_statistics_with_a_fraction_is_scoped_but_keeps_all_modules(tmp_path: Path) -> None:
    plan = _plan(tmp_path, capture=FRACTION, task=Task.STATISTICS)
    rollout = plan.msprobe.rollout.to_json()
    assert _section(rollout)["request_id"] == request_scope.CAPTURED_SENTINEL
    assert (_section(rollout)["list"], _section(rollout)["data_mode"]) == ([], ["all"])


def test_tensor_at_l1_has_no_module_default(tmp_path: Path) -> None:
    """L1 ``list`` entries name APIs: a module list there would dump nothing."""
    plan = _plan(tmp_path, capture=FRACTION, level=Level.L1)
    assert _section(plan.msprobe.rollout.to_json())["list"] == []
    assert _section(plan.msprobe.actor.to_json())["data_mode"] == request_scope.TENSOR_DATA_MODE


def test_modules_and_data_mode_options_reach_both_sides(tmp_path: Path) -> None:
    plan = _plan(tmp_path, capture=FRACTION, modules="all", data_mode="output")
    for cfg in (plan.msprobe.rollout.to_json(), plan.msprobe.actor.to_json()):
        assert (_section(cfg)["list"], _section(cfg)["data_mode"]) == ([], ["output"])
    plan = _plan(tmp_path, capture=FRACTION, modules=" DecoderLayer.forward , MLP.forward")
    assert plan.dump.modules == ["DecoderLayer.forward", "MLP.forward"]
    tail = ["--modules", "DecoderLayer.forward,MLP.forward", "--data-mode", "forward,output"]
    assert plan.invocation[-4:] == tail


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"data_mode": "all,output"}, "'all' cannot be combined"),
        ({"data_mode": "outputs"}, "'outputs' not in all, input, output, forward, backward"),
        ({"data_mode": "output,output"}, "repeated"),
        ({"modules": "MLP.forward,,"}, "an empty name"),
    ],
)
def test_bad_modules_or_data_mode_is_refused(tmp_path: Path, kw: dict[str, str], message: str) -> None:
    with pytest.raises(PlanError, match=re.escape(message)):
        _plan(tmp_path, capture=FRACTION, **kw)


def test_parsers_keep_msprobe_spelling() -> None:
    assert parse_modules(None) is None
    assert parse_modules("all") == []
    assert parse_data_mode("output,forward") == ["output", "forward"]
    assert parse_data_mode(" forward , output") == ["forward", "output"]  # as given: reruns compare equal
    assert parse_data_mode(None) is None


def test_written_rollout_config_passes_the_dispatch_hook_check(tmp_path: Path) -> None:
    plan = _plan(tmp_path, capture=FRACTION)
    write(plan.layout, plan.msprobe)
    env = {CAPTURE: plan.capture, RUN_DIR: plan.run_dir}
    logger = dispatch.DispatchLogger.for_rollout(plan.layout.rollout_config, environ=env)
    assert not logger.rule.is_all
    # the check is real: the same hook refuses a config msprobe cannot scope
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**plan.msprobe.rollout.to_json(), "level": "L2"}))
    with pytest.raises(dispatch.ConfigError, match="request-scoped dumps need"):
        dispatch.DispatchLogger.for_rollout(bad, environ=env)


# ------------------------------------------------------------------- end to end, real msprobe


def _ids(rule: CaptureRule) -> tuple[str, str]:
    """A request id the rule captures and one it does not (the hash decides; pick, don't hard-code)."""
    names = [f"req-{i}" for i in range(64)]
    captured = next(n for n in names if rule.captures(n))
    other = next(n for n in names if not rule.captures(n) and not rule.captures(f"{n}-second"))
    return captured, other


def _side(side: str, plan: RunPlan, captured: str, other: str) -> dict[str, Any]:
    env = plan.child_env({k: v for k, v in os.environ.items() if k not in plan.env})
    return run_module_json(
        "tests.entrypoints.capture_sides",
        *(side, plan.run_dir, captured, other),
        result=Path(plan.run_dir) / f"{side}-result.json",
        env=env,
    )


def _dump(result: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """Step 0's one dump: the rank folder's (a training micro batch of one), or its one lane."""
    (path,) = [
        *Path(result["dump_path"]).glob("step0/*/dump.json"),
        *Path(result["dump_path"]).glob("step0/*/req*/dump.json"),
    ]
    return json.loads(path.read_text())["data"], path.parent


def _tensor(step_dir: Path, entry: dict[str, Any]) -> torch.Tensor:
    """The first output of a module call, from its ``.pt`` file."""
    return torch.load(step_dir / "dump_tensor_data" / entry["output"][0]["data_name"], weights_only=True)


@pytest.mark.msprobe
def test_both_sides_dump_the_same_comparable_block_outputs(tmp_path: Path) -> None:
    plan = _plan(tmp_path, capture=FRACTION)
    write(plan.layout, plan.msprobe)
    captured, other = _ids(CaptureRule(fraction=0.5))
    rollout = _side("rollout", plan, captured, other)
    actor = _side("actor", plan, captured, other)

    # real PrecisionDebugger read what the run wrote; the hook started exactly one scoped step
    assert rollout["config"] == {
        "task": "tensor",
        "level": "L0",
        "list": request_scope.BLOCK_TENSOR_LIST,
        "data_mode": request_scope.TENSOR_DATA_MODE,
        "request_id": request_scope.CAPTURED_SENTINEL,
    }
    assert actor["config"] == {**rollout["config"], "request_id": None}
    assert rollout["started"]
    assert rollout["finished"]

    vllm, vllm_dir = _dump(rollout)
    train, train_dir = _dump(actor)
    assert vllm_dir.name == "req0", "the captured request's lane of the packed vLLM step"
    layers = range(tiny_config().num_hidden_layers)
    blocks = ("self_attn.Qwen2Attention", "mlp.Qwen2MLP")
    expected = {f"Module.model.layers.{i}.{b}.forward.0" for i in layers for b in blocks}
    assert set(train) == expected
    # vLLM's side has the attention kernel module too (the substring matches it); nothing else
    kernels = {f"Module.model.layers.{i}.self_attn.attn.Attention.forward.0" for i in layers}
    assert set(vllm) == expected | kernels
    for entry in [*vllm.values(), *train.values()]:
        assert set(entry) <= {"output", "parameters"}, entry.keys()  # no inputs
        assert not entry.get("parameters"), entry["parameters"]  # blocks own no parameters
    files = [p.name for d in (vllm_dir, train_dir) for p in (d / "dump_tensor_data").iterdir()]
    assert files
    assert all(".output." in f for f in files)

    compared = 0
    for key in expected:
        a = _tensor(vllm_dir, vllm[key])
        b = _tensor(train_dir, train[key])
        assert a.shape == (11, 48), key  # the captured request's rows only
        torch.testing.assert_close(a, b.squeeze(0), rtol=1e-4, atol=1e-5, msg=key)
        compared += 1
    assert compared == 4


def test_cli_options_reach_the_plan_and_reproduce() -> None:
    from typer.testing import CliRunner

    from verl_consistency.entrypoints.cli import app

    env = dict.fromkeys(("DUMP_ON", "VERL_CONSISTENCY_RUN_ID", CAPTURE))
    args = ["run", "hybrid", "--dry-run", "--json", "--dump-root", "/dump", "--run-id", "o"]
    args += ["--capture", "fraction:0.004", "--modules", "MLP.forward", "--data-mode", "output"]
    first = CliRunner().invoke(app, args, env=env)
    assert first.exit_code == 0, first.output
    plan = json.loads(first.output)
    assert (plan["modules"], plan["data_mode"]) == (["MLP.forward"], ["output"])
    assert plan["msprobe"]["actor"]["tensor"]["list"] == ["MLP.forward"]
    again = CliRunner().invoke(app, [*plan["invocation"][1:], "--dry-run", "--json"], env=env)
    assert json.loads(again.output) == plan
    refused = CliRunner().invoke(app, [*args[:-1], "all,output"], env=env)
    assert refused.exit_code == 2
    assert "'all' cannot be combined" in refused.output
