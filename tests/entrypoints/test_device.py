"""``run --device cuda``: the same run on NVIDIA GPUs; only verl's device setting changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verl_consistency.entrypoints.cli import app
from verl_consistency.entrypoints.run.overrides import Mode
from verl_consistency.entrypoints.run.plan import build_plan
from verl_consistency.entrypoints.run.plan_options import DEVICE_KEY, Device, PlanError, PlanOptions

from .conftest import MODEL


def _plan(tmp_path: Path, *extra: str, device: Device = Device.NPU):
    return build_plan(
        Mode.HYBRID,
        PlanOptions(dump_root=tmp_path, run_id="dev", environ={}, extra_args=list(extra), device=device),
    )


def test_cuda_pins_verl_device_and_changes_nothing_else(tmp_path: Path) -> None:
    npu, cuda = _plan(tmp_path), _plan(tmp_path, device=Device.CUDA)
    assert f"{DEVICE_KEY}=cuda" in cuda.overrides
    assert not [o for o in npu.overrides if o.startswith(f"{DEVICE_KEY}=")], "npu: verl detects it"
    assert [o for o in cuda.overrides if o != f"{DEVICE_KEY}=cuda"] == npu.overrides
    assert cuda.env == npu.env, "the dump hooks read the same variables on both devices"
    assert cuda.msprobe == npu.msprobe
    assert cuda.invocation[-2:] == ["--device", "cuda"]
    assert "--device" not in npu.invocation
    assert (npu.as_json()["device"], cuda.as_json()["device"]) == ("npu", "cuda")


def test_cuda_refuses_another_trainer_device(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"--device cuda but trainer\.device=npu"):
        _plan(tmp_path, "trainer.device=npu", device=Device.CUDA)
    same = _plan(tmp_path, "trainer.device=cuda", device=Device.CUDA)
    assert same.overrides.count("trainer.device=cuda") == 1


def test_cli_dry_run_and_manifest_field(tmp_path: Path) -> None:
    args = ["run", "hybrid", "--dry-run", "--json", "--device", "cuda", "--dump-root", str(tmp_path)]
    res = CliRunner().invoke(app, [*args, "--run-id", "g", f"model={MODEL}"], env={"DUMP_ON": None})
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    assert plan["device"] == "cuda"
    assert "trainer.device=cuda" in plan["argv"]
    bad = CliRunner().invoke(app, ["run", "hybrid", "--dry-run", "--device", "tpu"])
    assert bad.exit_code == 2
