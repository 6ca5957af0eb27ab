"""Which training phase a ride-along run dumps: bypass mode decides it.

verl's ``algorithm.rollout_correction.bypass_mode=true`` takes vLLM's log-probs as the old
log-probs and never runs the old-log-prob forward (verl 0.8.0 ``trainer/ppo/ray_trainer.py:1532-1536``,
0.9.1 ``trainer/ppo/v1/trainer_base.py:1641-1642`` and ``trainer_separate_async.py:197-200``), so a
``log_prob`` dump would hold nothing. A ride-along run leaves the user's training step as it is,
bypass mode included, and dumps ``update_actor`` instead (the first forward of each step, before
its optimizer step). The recipe (``--prompts-only``) sets ``algorithm.rollout_correction=null``
and so refuses bypass mode, as before; the triage run requires ``bypass_mode=false``.

Whether bypass mode is in force is the user's override when they give one (the last one wins,
as in Hydra), else the default of the config that the mode's verl composes:

* verl 0.8.0 fully-async (``fully_async_main``, config ``fully_async_ppo_trainer``):
  ``bypass_mode: True`` (``verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml:69``);
* verl 0.8.0 hybrid (``main_ppo``, ``ppo_trainer``): ``false``
  (``verl/trainer/config/algorithm/rollout_correction.yaml:20``);
* verl 0.9.1, every mode (``main_ppo``, ``ppo_trainer``, which takes it at ``ppo_trainer.yaml:40``):
  ``false`` (``verl/trainer/config/algorithm/rollout_correction.yaml:20``). The legacy
  ``fully_async_ppo_trainer.yaml:98`` still says ``True``, but the next set runs fully-async as
  V1 ``separate_async`` in ``main_ppo``, which does not read that file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from verl_consistency.contracts.env import DumpPhase
from verl_consistency.entrypoints.run.hydra_syntax import UserOverride
from verl_consistency.entrypoints.run.modes import CURRENT, Mode, RunKind

CORRECTION_KEY = "algorithm.rollout_correction"
BYPASS_KEY = f"{CORRECTION_KEY}.bypass_mode"

_FULLY_ASYNC_080 = (
    "verl 0.8.0's fully-async config sets it "
    "(verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml:69)"
)
_OFF = "verl's default is false (verl/trainer/config/algorithm/rollout_correction.yaml:20)"


@dataclass(frozen=True)
class Bypass:
    """Whether bypass mode is in force for a run, and where that comes from (for messages)."""

    on: bool
    source: str


def verl_default(mode: Mode, set_name: str) -> Bypass:
    """The default of the config that ``mode``'s verl composes on ``set_name`` (module docstring)."""
    if set_name == CURRENT and mode is Mode.FULLY_ASYNC:
        return Bypass(True, _FULLY_ASYNC_080)
    return Bypass(False, _OFF)


def in_force(mode: Mode, set_name: str, parsed: Iterable[UserOverride]) -> Bypass:
    """Bypass mode as the composed config will have it: the user's last word on it, else verl's."""
    state = verl_default(mode, set_name)
    for ov in parsed:
        if ov.key == BYPASS_KEY:
            if ov.delete:  # verl reads it with .get("bypass_mode", False)
                state = Bypass(False, f"`{ov.text}` deletes it")
            else:
                state = Bypass(ov.value is True or str(ov.value).lower() == "true", f"`{ov.text}`")
        elif ov.key == CORRECTION_KEY:
            if ov.delete or ov.value is None:
                state = Bypass(False, f"`{ov.text}` turns rollout correction off")
            elif isinstance(ov.value, Mapping) and "bypass_mode" in ov.value:
                state = Bypass(ov.value["bypass_mode"] is True, f"`{ov.text}`")
    return state


@dataclass(frozen=True)
class Phase:
    """The phase a run dumps, why when the run chose it, and the problem when it cannot."""

    phase: DumpPhase
    reason: str | None = None
    problem: str | None = None


def choose(chosen: DumpPhase | None, kind: RunKind, bypass: Bypass) -> Phase:
    """The dump phase: the user's (``--phase``/``DUMP_PHASE``), else the run's own choice.

    Only a ride-along run looks at bypass mode: the recipe turns it off itself and the triage
    run requires it off (their rows refuse a user's ``bypass_mode=true``).
    """
    if kind is not RunKind.RIDE_ALONG or not bypass.on:
        return Phase(chosen or DumpPhase.LOG_PROB)
    why = (
        f"bypass mode is in force ({bypass.source}): verl takes vLLM's log-probs as the old log-probs "
        "and skips the old-log-prob forward, so a log_prob dump would be empty"
    )
    if chosen is None:
        return Phase(
            DumpPhase.UPDATE_ACTOR,
            reason=f"{why}; the run dumps update_actor (the first forward of each step, before its "
            "optimizer step) instead",
        )
    if chosen is DumpPhase.LOG_PROB:
        return Phase(
            chosen,
            problem=f"--phase log_prob (or DUMP_PHASE=log_prob) refused: {why}. Either leave --phase "
            f"out (or give --phase update_actor) to dump update_actor, or turn bypass mode off with "
            f"{BYPASS_KEY}=false",
        )
    return Phase(chosen)
