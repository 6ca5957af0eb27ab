"""Session fixtures: each mode is composed ONCE with the real Hydra config of the pin set's verl
(0.8.0 on the current set, 0.9.1 on the next; ~10-15 s each). The mode fixtures compose the recipe
(``--prompts-only``: every row it had before ride-along became the default); ``ride_along``
composes the default collection of fully-async, where bypass mode and the staleness knobs differ.

* fully-async (and colocate-async, next set only): exactly the acceptance path —
  ``verl-consistency run <mode> --dry-run --json model=<path>``, then the printed argv and env are
  executed with Hydra's ``--cfg job``.
* hybrid: the real (non-dry-run) path — ``verl-consistency run hybrid ... --cfg job`` writes the
  run folder and runs verl, which prints its composed config and exits.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures import subprocess_run

MODEL = "/models/Qwen2.5-0.5B-Instruct"
COMPOSE_TIMEOUT = 300


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m verl_consistency.entrypoints`` in a subprocess, as a user (or a RayJob) runs it,
    in this directory and without the variables the run sets."""
    return subprocess_run.cli(*args, timeout=timeout, env=env or clean_env(), cwd=None)


def clean_env() -> dict[str, str]:
    """The caller's environment without variables the run sets (they would be refused as conflicts)."""
    from verl_consistency.entrypoints.run.overrides import ENV

    names = {row.name for row in ENV} | {"VERL_CONSISTENCY_DUMP_ROOT", "VERL_CONSISTENCY_RUN_ID"}
    return {k: v for k, v in os.environ.items() if k not in names}


@dataclass
class Composed:
    mode: str
    run_dir: Path
    plan: dict[str, Any]
    config: dict[str, Any]
    stdout: str
    stderr: str

    def get(self, dotted: str) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            node = node[part]
        return node


def supported(mode: str) -> bool:
    """Whether the pin set in force runs ``mode`` (colocate-async needs verl 0.9's V1 trainer)."""
    from verl_consistency.entrypoints.run.overrides import LAUNCH, Launch, Mode, pin_set

    return isinstance(LAUNCH[pin_set()][Mode(mode)], Launch)


def _compose_dry_run(root: Path, mode: str, run_id: str, *options: str) -> Composed:
    dry = cli(
        "run",
        mode,
        *options,
        "--dry-run",
        "--json",
        "--dump-root",
        str(root),
        "--run-id",
        run_id,
        f"model={MODEL}",
    )
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    verl = subprocess.run(
        [*plan["argv"], "--cfg", "job"],
        env={**clean_env(), **plan["env"]},
        capture_output=True,
        text=True,
        timeout=COMPOSE_TIMEOUT,
    )
    assert verl.returncode == 0, verl.stderr[-4000:]
    return Composed(mode, root / run_id, plan, yaml.safe_load(verl.stdout), verl.stdout, verl.stderr)


@pytest.fixture(scope="session")
def fully_async(tmp_path_factory: pytest.TempPathFactory) -> Composed:
    return _compose_dry_run(tmp_path_factory.mktemp("dump-fa"), "fully-async", "fa-test", "--prompts-only")


@pytest.fixture(scope="session")
def ride_along(tmp_path_factory: pytest.TempPathFactory) -> Composed:
    """fully-async as a user types it: ride-along, the phase the run picks."""
    return _compose_dry_run(tmp_path_factory.mktemp("dump-ride"), "fully-async", "ride-test")


@pytest.fixture(scope="session")
def fully_async_all(tmp_path_factory: pytest.TempPathFactory) -> Composed:
    """fully-async with ``--phase all``: the update_actor rows (one actor update per weight sync)."""
    return _compose_dry_run(
        tmp_path_factory.mktemp("dump-fa-all"), "fully-async", "fa-all", "--prompts-only", "--phase", "all"
    )


@pytest.fixture(scope="session")
def colocate_async(tmp_path_factory: pytest.TempPathFactory) -> Composed:
    if not supported("colocate-async"):
        pytest.skip("colocate-async is verl 0.9's V1 trainer mode: the next pin set only")
    return _compose_dry_run(tmp_path_factory.mktemp("dump-ca"), "colocate-async", "ca-test", "--prompts-only")


@pytest.fixture(scope="session")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Composed:
    root = tmp_path_factory.mktemp("dump-hybrid")
    args = (
        "run",
        "hybrid",
        "--prompts-only",
        "--dump-root",
        str(root),
        "--run-id",
        "hy-test",
        "--steps",
        "0-3",
        f"model={MODEL}",
        "trainer.nnodes=1",
        "--cfg",
        "job",
    )
    dry = cli(*args[:1], *args[1:-2], "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    done = cli(*args, timeout=COMPOSE_TIMEOUT)
    assert done.returncode == 0, done.stderr[-4000:]
    # verl's config YAML is everything on stdout; our own messages go to stderr.
    return Composed(
        "hybrid",
        root / "hy-test",
        json.loads(dry.stdout),
        yaml.safe_load(done.stdout),
        done.stdout,
        done.stderr,
    )


@pytest.fixture(params=["hybrid", "fully_async", "colocate_async"])
def composed(request: pytest.FixtureRequest) -> Composed:
    return request.getfixturevalue(request.param)
