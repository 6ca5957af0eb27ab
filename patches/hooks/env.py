"""The environment contract between ``verl-consistency run`` (which sets it) and the hooks.

The first three names are the public recipe's, kept so that users' existing launch scripts
still work. Every other name is ours and carries the ``VERL_CONSISTENCY_`` prefix.
"""

from __future__ import annotations

import os
from enum import StrEnum

DUMP_ON = "DUMP_ON"
"""``1`` turns the training-side msprobe dump on (recipe name)."""

PROMPTS_ONLY = "PROMPTS_ONLY"
"""``1`` trims responses so that the training forward covers the prompt (recipe name)."""

DUMP_PHASE = "DUMP_PHASE"
"""Which training phase is dumped: see :class:`DumpPhase` (recipe name)."""

ACTOR_CONFIG = "VERL_CONSISTENCY_ACTOR_CONFIG"
"""Path of the training-side msprobe config. The recipe hard-codes ``/home/config_actor.json``."""

RUN_DIR = "VERL_CONSISTENCY_RUN_DIR"
"""The run folder on the dump volume (see ``verl_consistency.layout``)."""


class DumpPhase(StrEnum):
    LOG_PROB = "log_prob"
    UPDATE_ACTOR = "update_actor"
    ALL = "all"


def flag(name: str, environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Read a recipe-style 0/1 flag. Anything but an integer is an error, not a silent 'off'."""
    env = os.environ if environ is None else environ
    raw = env.get(name, "0").strip() or "0"
    try:
        return int(raw) != 0
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r}: expected 0 or 1") from None


def dump_phase(environ: os._Environ[str] | dict[str, str] | None = None) -> DumpPhase:
    env = os.environ if environ is None else environ
    raw = env.get(DUMP_PHASE, DumpPhase.LOG_PROB.value)
    try:
        return DumpPhase(raw)
    except ValueError:
        allowed = ", ".join(p.value for p in DumpPhase)
        raise ValueError(f"environment variable {DUMP_PHASE}={raw!r}: expected one of {allowed}") from None
