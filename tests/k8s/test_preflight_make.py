"""`make preflight` as a newcomer runs it: the CLI's exit code, and a small environment of its own.

Why these: a script (or CI gate) around `make preflight` must tell "something will fail" (1)
from "the cluster could not be read" (2), which GNU make's own failure code (always 2) would
hide; and the check must run from `.venv-preflight` (pyproject's base dependencies and its
`preflight` extra), not the development environment with torch, verl, msprobe and Ray. The
clusters are the stand-in API server's (tests/k8s/apiserver_standin.py); make, the kubernetes
client and the preflight are real. The venv itself is not built here (it needs PyPI): the
tests run the CLI with every module outside that venv's packages made unimportable.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from typer.testing import CliRunner

from tests.k8s.apiserver_standin import StandInCluster, dead_kubeconfig, serve
from tests.k8s.conftest import REPO
from verl_consistency.entrypoints.cli import app

HEAVY = ("torch", "verl", "msprobe", "ray", "vllm", "numpy", "transformers")
"""What the development environment has and the preflight must not need."""


def make_preflight(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`make -s preflight ARGS`, the CLI run by this interpreter instead of .venv-preflight's
    (PREFLIGHT_CMD set: the target then builds no venv)."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    cmd = f"PREFLIGHT_CMD={sys.executable} -m verl_consistency.entrypoints preflight"
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "preflight", cmd, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("cluster", "code"),
    [
        pytest.param(StandInCluster(), 0, id="ready"),
        pytest.param(StandInCluster(crd=None, operators=[]), 1, id="will-fail"),
        pytest.param(None, 2, id="unreachable"),
    ],
)
def test_make_preflight_exits_with_the_cli_s_code(tmp_path: Path, cluster: StandInCluster | None, code: int):
    if cluster is None:
        kubeconfig = dead_kubeconfig(tmp_path)
        res = make_preflight(kubeconfig)
        cli = CliRunner().invoke(app, ["preflight"], env={"KUBECONFIG": str(kubeconfig)})
    else:
        with serve(cluster) as server:
            kubeconfig = server.kubeconfig(tmp_path)
            res = make_preflight(kubeconfig, "PREFLIGHT_ARGS=--json")
            cli = CliRunner().invoke(app, ["preflight", "--json"], env={"KUBECONFIG": str(kubeconfig)})
        assert json.loads(res.stdout)["exit_code"] == code
    assert cli.exit_code == code, cli.output
    assert res.returncode == code, (
        f"make exited {res.returncode}, the CLI {code}:\n{res.stdout}\n{res.stderr}"
    )
    if code == 2:
        assert "cannot read the cluster" in res.stderr


def test_make_preflight_beside_another_goal_still_fails(tmp_path: Path):
    """Question mode is for `preflight` alone: with another goal make keeps its own rules."""
    with serve(StandInCluster(crd=None, operators=[])) as server:
        res = make_preflight(server.kubeconfig(tmp_path), "pins", "PREFLIGHT_ARGS=--json")
    assert res.returncode == 2
    assert "preflight] Error 1" in res.stderr


def _closure(requirements: list[str]) -> set[str]:
    """The distributions that installing ``requirements`` brings, as this venv resolved them."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        todo += [Requirement(r) for r in metadata.requires(req.name) or []]
    return seen


def small_venv_modules() -> set[str]:
    """Top-level import names of what `pip install -e ".[preflight]"` installs (pyproject's base
    dependencies and the `preflight` extra, with their own dependencies), plus this package."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dists = _closure([*project["dependencies"], *project["optional-dependencies"]["preflight"]])
    modules = {
        m
        for m, owners in metadata.packages_distributions().items()
        if any(canonicalize_name(d) in dists for d in owners)
    }
    assert not modules & set(HEAVY), f"the preflight extra pulls {modules & set(HEAVY)}"
    return modules | {"verl_consistency", "tests"}


ISOLATED = """
import importlib.abc, sys
ALLOWED = set(sys.argv[1].split(",")) | set(sys.stdlib_module_names)

class OnlyTheSmallVenv(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top not in ALLOWED and not top.startswith("_"):
            raise ModuleNotFoundError(f"{top} is not in .venv-preflight", name=top)
        return None

sys.meta_path.insert(0, OnlyTheSmallVenv())
from verl_consistency.entrypoints.cli import main
sys.argv = ["verl-consistency", "preflight", "--json"]
try:
    main()
finally:
    print("HEAVY", sorted(m for m in sys.modules if m.partition(".")[0] in @HEAVY@), file=sys.stderr)
"""


def test_the_preflight_runs_with_only_the_small_venv_s_packages(tmp_path: Path):
    allowed = ",".join(sorted(small_venv_modules()))
    with serve(StandInCluster()) as server:
        env = {**os.environ, "KUBECONFIG": str(server.kubeconfig(tmp_path))}
        res = subprocess.run(
            [sys.executable, "-c", ISOLATED.replace("@HEAVY@", repr(set(HEAVY))), allowed],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["ready"]
    assert re.search(r"^HEAVY \[\]$", res.stderr, re.M), res.stderr


def test_importing_the_preflight_command_imports_no_torch():
    code = (
        "import sys, verl_consistency.entrypoints.cli, verl_consistency.entrypoints.preflight.command; "
        f"print(sorted(m for m in sys.modules if m.partition('.')[0] in {set(HEAVY)!r}))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"
