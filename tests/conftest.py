"""Shared fixtures. Area-specific fixtures live in each area's own conftest.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


def lean_disk() -> bool:
    """``$VERL_CONSISTENCY_LEAN_DISK`` (``.ci/run``): delete heavy test artefacts once used."""
    from verl_consistency.contracts import env

    return env.flag(env.LEAN_DISK)


@pytest.fixture(autouse=True)
def _os_environ_kept() -> Iterator[None]:
    """Put ``os.environ`` back after each test: HF ``datasets``' ``map(num_proc=...)`` rebinds it to
    a plain copy (``datasets/arrow_dataset.py``: ``os.environ = prev_env``), after which click's
    ``CliRunner(env=...)`` and rich read different mappings, and a later test's ``--help`` renders
    at 80 columns whatever ``COLUMNS`` says (verl's ``RLHFDataset`` filters prompts that way)."""
    environ = os.environ
    yield
    if os.environ is not environ:
        os.environ = environ  # type: ignore[assignment]  # noqa: B003
