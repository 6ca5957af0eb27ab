"""The RayJob entrypoints are exactly what `verl-consistency run ... --dry-run --json` calls `invocation`.

`invocation` is the command written out in full (every option at its value, `model=` as
`actor_rollout_ref.model.path=`), so the manifests cannot drift from the entrypoints: a default
that changes, an option that is renamed, or an override that becomes refused fails here. The
entrypoint's ${VAR}s are filled from the run ConfigMap of the same source, as the head pod's
shell fills them.
"""

from __future__ import annotations

import json
import shlex
import string
import subprocess
import sys

import pytest

from tests.k8s.conftest import SOURCES, of_kind, render


def entrypoint_argv(source: str) -> list[str]:
    docs = render(source)[1]
    (job,) = of_kind(docs, "RayJob")
    (cm,) = of_kind(docs, "ConfigMap")
    # string.Template.substitute raises on a ${VAR} that the ConfigMap lacks: that is drift too.
    return shlex.split(string.Template(job["spec"]["entrypoint"]).substitute(cm["data"]))


UNIQUE = sorted({" ".join(entrypoint_argv(s)): s for s in SOURCES}.values())


@pytest.mark.parametrize("source", UNIQUE)
def test_rayjob_entrypoint_is_the_dry_run_invocation(source: str) -> None:
    argv = entrypoint_argv(source)
    assert argv[:2] == ["verl-consistency", "run"]
    res = subprocess.run(
        [sys.executable, "-m", "verl_consistency.entrypoints", *argv[1:], "--dry-run", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, f"the entrypoint of {source} is refused:\n{res.stdout}\n{res.stderr}"
    plan = json.loads(res.stdout)
    assert plan["invocation"] == argv
    assert plan["dump_root"] == "/dump"
