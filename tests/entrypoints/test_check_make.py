"""`make check-model` (entrypoints/check.mk): the command it runs, the bundle it verifies, its refusal.

The command lines are read from `make -n` (nothing runs, nothing is built) and checked with the
same validator as the check Job's args (tests/fixtures/check_interface.py). The MODEL path then
runs for real with a stand-in `verl-consistency` (VERL_CONSISTENCY=...), whose `verify` is the
real one: make must stop on a check that fails and on a bundle that does not verify.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.fixtures import check_interface

# Records each call; `check` writes a (not verifiable) bundle where the real one goes and exits
# $CHECK_RC; `verify` runs the real `verl-consistency verify`, or exits 0 with VERIFY=pass.
STAND_IN = """#!{python}
import json, os, pathlib, subprocess, sys
args = sys.argv[1:]
with open(os.environ["CALLS"], "a") as f:
    f.write(json.dumps(args) + "\\n")
if args[0] == "check":
    opts = dict(zip(args[1::2], args[2::2]))
    bundle = pathlib.Path(opts["--dump-root"], "bundles", f"bundle-{{opts['--run-id']}}.tar.zst")
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_bytes(b"not a bundle")
    sys.exit(int(os.environ.get("CHECK_RC", "0")))
if args[0] == "verify" and os.environ.get("VERIFY") == "pass":
    sys.exit(0)
sys.exit(subprocess.run([sys.executable, "-m", "verl_consistency.entrypoints", *args]).returncode)
"""


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def recipe_lines(out: str) -> list[list[str]]:
    """`make -n` output as argv lists (continuation lines joined)."""
    return [shlex.split(line) for line in out.replace("\\\n", " ").splitlines() if line.strip()]


def test_with_model_runs_the_installed_command_and_verifies_its_bundle() -> None:
    res = make(
        "-n", "check-model", "MODEL=/models/Qwen2.5-7B", "CHECK_RUN=c1", "CHECK_ARGS=--tp 2 --top-k 20"
    )
    assert res.returncode == 0, res.stderr
    lines = recipe_lines(res.stdout)
    check = next(line for line in lines if line[:2] == ["verl-consistency", "check"])
    assert check_interface.problems(check) == []
    assert check_interface.options(check) == {
        "--model": "/models/Qwen2.5-7B",
        "--device": "npu",
        "--dump-root": "out/check",
        "--run-id": "c1",
        "--tp": "2",
        "--top-k": "20",
    }
    assert ["verl-consistency", "verify", "out/check/bundles/bundle-c1.tar.zst"] in lines
    assert not any("demo_venv" in " ".join(line) for line in lines), "MODEL must not build the demo venv"


def test_without_model_runs_on_cpu_in_the_demo_venv() -> None:
    res = make("-n", "check-model", "CHECK_RUN=c2", "DEMO_VENV=/opt/dv", "CHECK_ROOT=/tmp/cr")
    assert res.returncode == 0, res.stderr
    lines = recipe_lines(res.stdout)
    prefix = ["/opt/dv/bin/python", "-m", "verl_consistency.entrypoints"]
    build = next(i for i, line in enumerate(lines) if "verl_consistency.entrypoints.demo.venv" in line)
    run = next(i for i, line in enumerate(lines) if line[:4] == [*prefix, "check"])
    assert build < run  # the demo venv is a prerequisite, as for `make demo`
    check = ["verl-consistency", *lines[run][3:]]
    assert check_interface.problems(check) == []
    assert check_interface.options(check) == {"--device": "cpu", "--dump-root": "/tmp/cr", "--run-id": "c2"}
    assert [*prefix, "verify", "/tmp/cr/bundles/bundle-c2.tar.zst"] in lines


def test_a_device_without_model_is_refused_before_anything_is_built() -> None:
    res = make("-n", "check-model", "DEVICE=cuda")
    assert "DEVICE=cuda needs MODEL=<hf folder>" in res.stdout
    assert "demo_venv" not in res.stdout  # (-n goes on to print the recipe; the real run stops)
    # For real: its only prerequisite is the refusal. (Were it not, PYTHON=false and a missing
    # VENV stop the venv builds at once instead of building 9 GB.)
    real = make("check-model", "DEVICE=npu", "PYTHON=false", "VENV=/nonexistent-venv")
    assert real.returncode == 2
    assert "without MODEL the check runs the demo's random model on CPU only" in real.stderr


def standin(tmp_path: Path) -> tuple[Path, Path]:
    exe = tmp_path / "verl-consistency"
    exe.write_text(STAND_IN.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe, tmp_path / "calls.jsonl"


def run_model(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    exe, calls = standin(tmp_path)
    res = make(
        "check-model",
        "MODEL=/m/q",
        "DEVICE=cpu",
        "CHECK_RUN=c3",
        f"CHECK_ROOT={tmp_path / 'out'}",
        f"VERL_CONSISTENCY={exe}",
        env={"CALLS": str(calls), **env},
    )
    return res, [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_runs_check_then_verify(tmp_path: Path) -> None:
    res, calls = run_model(tmp_path, VERIFY="pass")
    assert res.returncode == 0, res.stderr
    bundle = tmp_path / "out" / "bundles" / "bundle-c3.tar.zst"
    assert [c[0] for c in calls] == ["check", "verify"]
    assert calls[1] == ["verify", str(bundle)]
    assert res.stdout.strip().endswith(f"bundle: {bundle}")


def test_stops_on_a_failed_check_and_on_a_bundle_that_does_not_verify(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    res, calls = run_model(tmp_path / "a", CHECK_RC="3")
    assert res.returncode != 0
    assert [c[0] for c in calls] == ["check"]
    (tmp_path / "b").mkdir()
    res, calls = run_model(tmp_path / "b")  # the real `verify` on the stand-in's bytes
    assert res.returncode != 0
    assert [c[0] for c in calls] == ["check", "verify"]
    assert "bundle:" not in res.stdout
