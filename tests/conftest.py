"""Shared fixtures. Area-specific fixtures live in each area's own conftest.py."""

from __future__ import annotations

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
