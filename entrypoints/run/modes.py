"""What ``verl-consistency run MODE`` launches on each pin set: the modes, the run kinds, :data:`LAUNCH`.

A mode is not one verl module: on the current set (verl 0.8.0) hybrid and fully-async are two
entry modules, on the next set (verl 0.9.1) all three are ``verl.trainer.main_ppo`` with a
``trainer.v1.trainer_mode``. Keeping that mapping as one table, apart from the override rows,
lets the rows (:mod:`.override_rows`), the plan (:mod:`.run_plan`) and the manifests' tests
ask the same question, "what does this mode run here?", and get one answer. The set in force is
``pins.load().set.name`` (``VERL_CONSISTENCY_PIN_SET``).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class Mode(StrEnum):
    HYBRID = "hybrid"
    FULLY_ASYNC = "fully-async"
    COLOCATE_ASYNC = "colocate-async"

    @property
    def module(self) -> str:
        """The verl entry module this mode runs on the pin set in force (see :func:`launch`)."""
        return launch(self).module


CURRENT = "current"
NEXT = "next"
PIN_SETS: frozenset[str] = frozenset({CURRENT, NEXT})
"""The pin sets of ``patches/pins.toml`` this table knows (``tests/entrypoints`` checks the file)."""

MAIN_PPO = "verl.trainer.main_ppo"


def pin_set() -> str:
    """The pin set in force: ``pins.load().set.name``, i.e. ``$VERL_CONSISTENCY_PIN_SET`` or the default."""
    from verl_consistency.contracts import pins

    return pins.load().set.name


class Launch(BaseModel):
    """How one mode runs on one pin set: the verl module and, on verl's V1 trainer, its trainer mode."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    module: str
    trainer_mode: str | None = None
    """``trainer.v1.trainer_mode`` (verl 0.9's V1 trainer); None: a verl 0.8.0 trainer."""
    why: str


class Unsupported(BaseModel):
    """A mode that the pin set cannot run with valid data: refused with ``why``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    why: str


LAUNCH: dict[str, dict[Mode, Launch | Unsupported]] = {
    CURRENT: {
        Mode.HYBRID: Launch(
            module=MAIN_PPO,
            why="verl 0.8.0's PPO trainer with the hybrid engine: rollout and training share the NPUs, "
            "and each step trains on what the weights of that step generated",
        ),
        Mode.FULLY_ASYNC: Launch(
            module="verl.experimental.fully_async_policy.fully_async_main",
            why="verl 0.8.0's fully-async policy: separate rollout and trainer pools; with "
            "async_training.staleness_threshold=0 (and, to dump update_actor, one actor update per "
            "weight sync) every sample is generated and trained by one weight version",
        ),
        Mode.COLOCATE_ASYNC: Unsupported(
            why="colocate-async is verl 0.9's V1 trainer mode colocate_async; the current pin set's "
            "verl 0.8.0 has no V1 trainer. Run it on the next set (VERL_CONSISTENCY_PIN_SET=next), "
            "or use hybrid or fully-async here"
        ),
    },
    NEXT: {
        Mode.HYBRID: Launch(
            module=MAIN_PPO,
            trainer_mode="sync",
            why="verl 0.9's V1 equivalent of 0.8.0's hybrid AgentLoop: rollout and training share the "
            "NPUs, and each step generates exactly the batch it trains on, with that step's weights",
        ),
        Mode.FULLY_ASYNC: Launch(
            module=MAIN_PPO,
            trainer_mode="separate_async",
            why="separate rollout and trainer pools; verl's maintainers deprecate "
            "verl.experimental.fully_async_policy in its favour",
        ),
        Mode.COLOCATE_ASYNC: Launch(
            module=MAIN_PPO,
            trainer_mode="colocate_async",
            why="shared NPUs with the partial-rollout client (FullyAsyncLLMServerClient) and the async "
            "replay buffer; with no warm-up batch it trains each step on what that step's weights "
            "generated, like sync",
        ),
    },
}
"""Per pin set, what each mode runs, or why the set refuses it."""


def launch(mode: Mode, set_name: str | None = None) -> Launch:
    """The mode's module and trainer mode on the set (default: in force); ValueError when refused."""
    name = set_name or pin_set()
    if name not in LAUNCH:
        raise ValueError(f"pin set {name!r} is not in the run table (sets: {', '.join(sorted(LAUNCH))})")
    how = LAUNCH[name][mode]
    if isinstance(how, Unsupported):
        raise ValueError(
            f"`verl-consistency run {mode.value}` is not available on pin set {name!r}: {how.why}"
        )
    return how


class RunKind(StrEnum):
    """What a run is for: a msprobe collection run of one of two kinds, or a token-level triage run.

    ``ride-along`` (the default): the user's training step untouched (full responses, their
    reward, the weights move); the hooks cut each request's prompt rows out of the training
    forward, and records carry weight versions, so staleness is named (``weights_differ``)
    rather than prevented. ``prompts-only`` (``--prompts-only``): the recipe, ``PROMPTS_ONLY=1``
    trims every response to its prompt and every staleness knob is pinned. ``token-level``
    (``--token-level``): no msprobe dump, one token record per response.
    """

    RIDE_ALONG = "ride-along"
    PROMPTS_ONLY = "prompts-only"
    TOKEN_LEVEL = "token-level"

    @property
    def manifest_kind(self) -> str:
        """``run.json``'s ``kind``: ``collection`` (both msprobe kinds) or ``token-level``."""
        return "token-level" if self is RunKind.TOKEN_LEVEL else "collection"

    @property
    def collection(self) -> str | None:
        """``run.json``'s ``collection``: ``ride-along`` or ``prompts-only``; None for a triage run."""
        return None if self is RunKind.TOKEN_LEVEL else self.value
