"""``.ci/sysdeps.sh``: the one set-up piece ``make test``, ``make demo`` and ``.ci/run`` share."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs a Debian/Ubuntu host")


def _run(repo: Path, tmp_path: Path, packages: list[str], uid: str | None = None):
    lst = tmp_path / "list.txt"
    lst.write_text("# comment\n" + "\n".join(packages) + "\n")
    env = dict(os.environ)
    if uid is not None:  # pretend to be a normal user: a stand-in `id` first on PATH
        shim = tmp_path / "bin"
        shim.mkdir()
        (shim / "id").write_text(f"#!/bin/sh\necho {uid}\n")
        (shim / "id").chmod(0o755)
        env["PATH"] = f"{shim}:{env['PATH']}"
    return subprocess.run(
        ["bash", str(repo / ".ci" / "sysdeps.sh"), str(lst)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_installed_packages_need_nothing(repo, tmp_path):
    res = _run(repo, tmp_path, ["bash", "coreutils  # inline comment"])
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""


def test_not_root_stops_with_the_exact_command(repo, tmp_path):
    res = _run(repo, tmp_path, ["bash", "verl-consistency-no-such-package"], uid="1000")
    assert res.returncode == 1
    assert "missing Debian packages: verl-consistency-no-such-package" in res.stderr
    assert "apt-get install -y --no-install-recommends verl-consistency-no-such-package" in res.stderr
    assert "bash" not in res.stderr.split("missing Debian packages:")[1].splitlines()[0]


def test_the_demo_list_names_tcmalloc(repo):
    assert "libtcmalloc-minimal4" in (repo / ".ci" / "apt" / "demo.txt").read_text()
