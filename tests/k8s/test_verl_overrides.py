"""VERL_OVERRIDES: the user's own overrides in the run ConfigMap reach verl's command, checked by `run`.

The entrypoint passes three stages before `verl-consistency run` reads its arguments, each done
here with the real thing, without a cluster:

1. the submitter pod's bash expands ``${VERL_OVERRIDES?}`` and splits it into words
   (conftest.expand_entrypoint, as KubeRay's ``/bin/bash -ce`` does);
2. ``ray job submit -- <words>`` joins them with ``list2cmdline`` (Ray 2.48's
   ``ray/dashboard/modules/job/cli.py``: the function itself, imported from there);
3. Ray's job supervisor runs that line with ``subprocess.Popen(..., shell=True)``: ``/bin/sh -c``
   on the head, where `verl-consistency` is the real CLI (a two-line wrapper on PATH).

So the quoting rules of k8s/base/fully-async/settings.yaml are what these tests prove: single
quotes and backslashes act as in a shell, a quote Hydra must see is escaped, and whatever `run`
refuses on the command line fails the entrypoint with the same message.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.conftest import K8S, expand_entrypoint, of_kind, render, run_settings
from tests.k8s.test_entrypoint_drift import source_set
from verl_consistency.contracts import pins
from verl_consistency.contracts.env import PIN_SET
from verl_consistency.entrypoints.run.overrides import parse_user_overrides

pytestmark = pytest.mark.pinset

# The manifest of each mode for the pin set in force (as test_submission.py picks them).
SOURCES = (
    {"fully-async": "file:fully-async", "hybrid": "file:hybrid"}
    if pins.selected() == "current"
    else {"fully-async": "kustomize:overlays/next", "hybrid": "compose:hybrid:next"}
)


def readme_example() -> str:
    """k8s/README.md's VERL_OVERRIDES example ("Your own job"), as YAML reads the folded block."""
    text = (K8S / "README.md").read_text()
    start = text.index("```yaml\n  VERL_OVERRIDES: >-")
    block = text[start + len("```yaml\n") : text.index("```", start + 3)]
    return str(yaml.safe_load(block)["VERL_OVERRIDES"])


def settings_with(source: str, overrides: str) -> dict[str, str]:
    return {**run_settings(render(source)[1]), "VERL_OVERRIDES": overrides}


def entrypoint(source: str) -> str:
    (job,) = of_kind(render(source)[1], "RayJob")
    return str(job["spec"]["entrypoint"])


def submitted_line(source: str, settings: dict[str, str]) -> str:
    """Stages 1 and 2: the command line Ray records for the job (``ray job list`` shows it)."""
    from ray.dashboard.modules.job import cli as ray_job_cli

    return str(ray_job_cli.list2cmdline(expand_entrypoint(entrypoint(source), settings)))


@pytest.fixture
def head_path(tmp_path: Path) -> str:
    """The head's PATH: `verl-consistency` is this venv's CLI."""
    exe = tmp_path / "bin" / "verl-consistency"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m verl_consistency.entrypoints "$@"\n')
    exe.chmod(0o755)
    return f"{exe.parent}:/usr/bin:/bin"


def on_head(line: str, source: str, head_path: str) -> subprocess.CompletedProcess[str]:
    """Stage 3: Ray's job supervisor runs the line with /bin/sh on the head."""
    env = {"PATH": head_path, "HOME": os.environ.get("HOME", "/tmp"), PIN_SET: source_set(source)}
    return subprocess.run(["/bin/sh", "-c", line], env=env, capture_output=True, text=True, timeout=120)


def head_words(line: str) -> list[str]:
    res = subprocess.run(["/bin/sh", "-c", f'printf "%s\\0" {line}'], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout.split("\0")[:-1]


def dry_run(source: str, overrides: str, head_path: str) -> tuple[list[str], dict[str, Any]]:
    line = submitted_line(source, settings_with(source, overrides))
    res = on_head(f"{line} --dry-run --json", source, head_path)
    assert res.returncode == 0, f"refused:\n{res.stderr}"
    return head_words(line), json.loads(res.stdout)


@pytest.mark.parametrize("mode", sorted(SOURCES))
def test_a_dataset_and_a_reward_reach_verls_command(mode: str, head_path: str) -> None:
    source = SOURCES[mode]
    overrides = readme_example()
    assert "data.train_files=/models/" in overrides
    assert "reward.custom_reward_function.path=/models/" in overrides
    words, plan = dry_run(source, overrides, head_path)
    mine = overrides.split()
    assert words[-len(mine) :] == mine
    assert plan["invocation"] == words
    assert plan["user_overrides"][-len(mine) :] == mine
    argv = plan["argv"]
    for override in mine:
        assert argv.count(override) == 1
    # the run's own prompt set and reward (its defaults) are gone: each key is set once, by the user
    for key in ("data.train_files", "data.val_files", "reward.custom_reward_function.path"):
        assert [a for a in argv if a.startswith(key + "=")] == [next(o for o in mine if o.startswith(key))]


def test_the_quoting_rules_hold(head_path: str) -> None:
    """Single quotes as in a shell (a value with a space); escaped quotes reach Hydra."""
    source = SOURCES["hybrid"]
    overrides = r"+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG=\'1\' trainer.experiment_name='my run'"
    words, plan = dry_run(source, overrides, head_path)
    tail = ["+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG='1'", "trainer.experiment_name=my run"]
    assert words[-2:] == tail
    assert plan["argv"][-2:] == tail
    flag, name = parse_user_overrides(tail)
    assert (flag.value, name.value) == ("1", "my run")  # a string for Ray, as verl's Hydra reads them


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            "actor_rollout_ref.rollout.mode=sync",
            "refused `actor_rollout_ref.rollout.mode=sync`: the request-id patches hook",
        ),
        (
            "+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG=1",
            r"with the quotes escaped: +ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG=\'1\'",
        ),
        ("trainer.n_gpus_per_node=4", "change MODEL_PATH, TRAINER_NODES, ROLLOUT_NODES or NPUS_PER_NODE"),
        # unquoted single quotes are the head's shell's: Hydra gets an int, refused as above
        ("+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG='1'", "Ray takes only strings"),
    ],
)
def test_a_refused_override_fails_the_entrypoint(overrides: str, message: str, head_path: str) -> None:
    """The real entrypoint, no --dry-run: `run` refuses before it writes or starts anything."""
    source = SOURCES["fully-async"]
    res = on_head(submitted_line(source, settings_with(source, overrides)), source, head_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in " ".join(res.stderr.split())
    assert "nothing was written or started" in res.stderr


def test_the_default_adds_nothing() -> None:
    for source in SOURCES.values():
        settings = run_settings(render(source)[1])
        assert settings["VERL_OVERRIDES"] == ""
        with_one = expand_entrypoint(entrypoint(source), {**settings, "VERL_OVERRIDES": "a=1"})
        assert expand_entrypoint(entrypoint(source), settings) == with_one[:-1]
