"""The RayJob entrypoints are exactly what `verl-consistency run ... --dry-run --json` calls `invocation`.

`invocation` is the command written out in full (every option at its value, `model=` as
`actor_rollout_ref.model.path=`), so the manifests cannot drift from the entrypoints: a default
that changes, an option that is renamed, or an override that becomes refused fails here. The
entrypoint's ${VAR:?}s are filled by bash from the run ConfigMap of the same source, as the
submitter pod's `/bin/bash -ce` fills them (test_submission.py does the whole submission).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.k8s.conftest import SOURCES, expand_entrypoint, of_kind, render, run_settings
from verl_consistency.contracts import pins
from verl_consistency.contracts.env import PIN_SET

# Each source is checked by the run of its own pin set (the run ConfigMap names it; the
# default set when it does not): `make test` the current sources, `make test-next` the next.
pytestmark = pytest.mark.pinset


def source_set(source: str) -> str:
    return run_settings(render(source)[1]).get(PIN_SET) or pins.raw()["sets"]["default"]


def entrypoint_argv(source: str) -> list[str]:
    docs = render(source)[1]
    (job,) = of_kind(docs, "RayJob")
    # A ${VAR:?} that the ConfigMap lacks fails the expansion: that is drift too.
    return expand_entrypoint(job["spec"]["entrypoint"], run_settings(docs))


# The shipped sources, and the nvidia component on hybrid (no shipped source has it: its
# overlay is fully-async), whose entrypoint is the component's own.
ALL = [*SOURCES, "compose:hybrid:nvidia", "compose:hybrid:next"]
UNIQUE = sorted({" ".join(entrypoint_argv(s)): s for s in ALL if source_set(s) == pins.selected()}.values())


def test_every_pin_set_has_a_source() -> None:
    assert {source_set(s) for s in ALL} == set(pins.set_names())


@pytest.mark.parametrize("source", UNIQUE)
def test_rayjob_entrypoint_is_the_dry_run_invocation(source: str) -> None:
    argv = entrypoint_argv(source)
    assert argv[:2] == ["verl-consistency", "run"]
    res = subprocess.run(
        [sys.executable, "-m", "verl_consistency.entrypoints", *argv[1:], "--dry-run", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, PIN_SET: source_set(source)},
    )
    assert res.returncode == 0, f"the entrypoint of {source} is refused:\n{res.stdout}\n{res.stderr}"
    plan = json.loads(res.stdout)
    assert plan["invocation"] == argv
    assert plan["dump_root"] == "/dump"
