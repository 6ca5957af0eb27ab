"""The vocabulary the override table is written in: row types, scopes, and the values known only at run time.

Each row of :mod:`.override_rows` and :mod:`.override_refusals` is a typed, frozen model, so a
misspelt field or an unknown scope fails at import, not halfway through composing a run. A row
applies to a run by four scopes (mode, dump phase, run kind, pin set; every one unless it says
otherwise), and :class:`FromRun` stands for the values known only once the run folder exists.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from verl_consistency.contracts.env import DumpPhase
from verl_consistency.entrypoints.run.modes import CURRENT, NEXT, PIN_SETS, Mode, RunKind

ALL_MODES: frozenset[Mode] = frozenset(Mode)
ASYNC_MODES: frozenset[Mode] = frozenset({Mode.FULLY_ASYNC, Mode.COLOCATE_ASYNC})
SHARED_POOL_MODES: frozenset[Mode] = frozenset({Mode.HYBRID, Mode.COLOCATE_ASYNC})
"""Modes where rollout and training share the NPUs (one pool)."""
ONLY_CURRENT: frozenset[str] = frozenset({CURRENT})
ONLY_NEXT: frozenset[str] = frozenset({NEXT})
ALL_PHASES: frozenset[DumpPhase] = frozenset(DumpPhase)
UPDATE_PHASES: frozenset[DumpPhase] = frozenset({DumpPhase.UPDATE_ACTOR, DumpPhase.ALL})
"""The phases that dump update_actor, whose forward an earlier optimizer step can spoil."""
COLLECTION_ONLY: frozenset[RunKind] = frozenset({RunKind.RIDE_ALONG, RunKind.PROMPTS_ONLY})
"""Every msprobe collection run: ride-along (the default) and prompts-only (``--prompts-only``)."""
PROMPTS_ONLY_KIND: frozenset[RunKind] = frozenset({RunKind.PROMPTS_ONLY})
"""The recipe only (``--prompts-only``): rows that pin what ride-along leaves to the user's job."""
RIDE_ALONG_ONLY: frozenset[RunKind] = frozenset({RunKind.RIDE_ALONG})
NOT_RIDE_ALONG: frozenset[RunKind] = frozenset({RunKind.PROMPTS_ONLY, RunKind.TOKEN_LEVEL})
"""Rows that prevent staleness: the recipe and the triage run keep them; ride-along names it instead."""
TOKEN_LEVEL_ONLY: frozenset[RunKind] = frozenset({RunKind.TOKEN_LEVEL})
ALL_KINDS: frozenset[RunKind] = frozenset(RunKind)

RUNTIME_ENV_PREFIX = "ray_kwargs.ray_init.runtime_env.env_vars"
"""Where verl takes the Ray job's env vars from (``main_ppo.py`` ``run_ppo``, verl 0.8.0 and 0.9.1)."""

MODEL_PATH_KEY = "actor_rollout_ref.model.path"
MODEL_SHORTCUT = "model"
"""``model=/path`` on our command line means ``actor_rollout_ref.model.path=/path``."""


RunField = Literal[
    "run_dir", "run_id", "rollout_config", "actor_config", "train_data", "reward_fn", "dump_phase", "capture"
]


class FromRun(BaseModel):
    """A value known only once the run's folder, phase and capture rule are chosen."""

    model_config = ConfigDict(frozen=True)
    run: RunField


Value = bool | int | float | str | None | FromRun | dict[str, Any] | list[Any]


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    modes: frozenset[Mode] = ALL_MODES
    phases: frozenset[DumpPhase] = ALL_PHASES
    kinds: frozenset[RunKind] = COLLECTION_ONLY
    """Run kinds the row applies to (default: both collection kinds); a collection run's rows do
    not apply to a triage run."""
    sets: frozenset[str] = PIN_SETS
    """Pin sets the row applies to: a row both verl releases need is written once."""
    why: str

    def applies(
        self, mode: Mode, phase: DumpPhase, kind: RunKind = RunKind.RIDE_ALONG, set_name: str = CURRENT
    ) -> bool:
        return mode in self.modes and phase in self.phases and kind in self.kinds and set_name in self.sets


class EnvVar(_Row):
    name: str
    value: str | FromRun
    driver_only: bool = False
    """Only the verl driver needs it (not put into the Ray runtime env)."""


class Override(_Row):
    key: str
    value: Value
    add: bool = False
    """Spell it ``+key=value``: the key is not in verl's config (Hydra: 'Key ... is not in struct')."""


class Refusal(_Row):
    key: str
    match: Literal["exact", "subtree", "suffix"] = "exact"
    """``subtree``: the key and everything under it. ``suffix``: any key ending in ``.<key>``, or the key."""
    bad: tuple[Any, ...] | None = None
    """Refuse these values."""
    allowed: tuple[Any, ...] | None = None
    """Refuse every value but these. With neither ``bad`` nor ``allowed``, refuse any value."""


class Matched(_Row):
    keys: tuple[str, str]
    """Both keys' values as the run composes them (the user's override, else ours) must be equal."""
