"""The set's demo venv, shared by the demo and the check tests (session scope: in CI the venv is
removed once both are done, for the disk the next set's venvs need)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from verl_consistency.contracts import pins
from verl_consistency.entrypoints.demo.venv import STAMP

from ..conftest import lean_disk

DEMO_VENV_ENV = "VERL_CONSISTENCY_DEMO_VENV"


@pytest.fixture(scope="session")
def demo_python() -> Iterator[Path]:
    name = pins.get("set.name")
    make = "make demo-venv" + ("" if name == "current" else f" PINS={name}")
    venv = os.environ.get(DEMO_VENV_ENV)
    if not venv:
        pytest.skip(
            f"${DEMO_VENV_ENV} unset: no demo venv for pin set {name!r} "
            f"(`{make}` builds it; `make test-current`/`make test-next` then set the variable)"
        )
    py = Path(venv) / "bin" / "python"
    assert py.is_file(), f"${DEMO_VENV_ENV}={venv} has no bin/python: run `{make}`"
    stamp = Path(venv) / STAMP
    assert stamp.is_file(), f"{venv} is unfinished (no {STAMP}): run `{make}`"
    # stamps from before pin sets carry no "set": those venvs are the current set's
    built_for = json.loads(stamp.read_text()).get("set", "current")
    assert built_for == name, f"{venv} was built for pin set {built_for!r}, the tests run {name!r}"
    yield py
    if lean_disk():  # CI: the next set's demo venv needs the disk this one holds
        shutil.rmtree(venv)
