"""What a collection run on verl's Megatron actor refuses before anything starts.

Per-request lanes cut verl's Megatron micro batches in its bshd layout only
(``hooks/training/megatron_lanes.py``): megatron-core's packed (THD) attention is Transformer
Engine's, which no machine of this project runs, so lanes of it are not verified; sequence and
context parallelism split a row's positions across ranks. A Megatron collection that needs lanes
(a ride-along forward, or several samples per micro batch) must therefore say
``use_remove_padding=False`` and keep every position of a row on one rank. Without lanes, the
recipe's way still works: ``--prompts-only`` and one sample per micro batch, each dumped whole.
The training hook refuses the same at the first dumped micro batch; refusing here saves the
cluster start-up and says it before a RayJob is written.

verl's V1 worker (``engine_workers.py`` ``ActorRolloutRefWorker.init_model``, verl 0.8.0 and 0.9.1)
does not read the engine's own ``use_remove_padding``: it overwrites the actor's (and the
reference's) with ``actor_rollout_ref.model.use_remove_padding``, which every collection run sets
to true for FSDP's packed lanes. So a Megatron run that asks for the bshd layout gets
``actor_rollout_ref.model.use_remove_padding=false`` in that row's place (:func:`required`), or
verl would run it packed whatever the user said. Megatron is named either way verl selects it:
``actor_rollout_ref.actor.strategy=megatron`` or ``model_engine=megatron`` (the Hydra group of
``ppo_trainer.yaml`` that ``ppo_megatron_trainer.yaml`` selects).
"""

from __future__ import annotations

from verl_consistency.entrypoints.run.overrides import Override, RunKind, UserOverride
from verl_consistency.patches.hooks.training.megatron_lanes import MEGATRON

STRATEGY_KEY = "actor_rollout_ref.actor.strategy"
ENGINE_KEY = "model_engine"
"""verl's Hydra group that picks the actor's, reference's and critic's configs (``dp`` or ``megatron``)."""
MODEL_REMOVE_PADDING_KEY = "actor_rollout_ref.model.use_remove_padding"
"""What verl's V1 worker copies into every engine's ``use_remove_padding`` (the run's required row)."""

REMOVE_PADDING_KEY = f"{MEGATRON}.use_remove_padding"
"""The Megatron engine's layout (verl's ``McoreEngineConfig``; default True, THD)."""
TP_KEY = f"{MEGATRON}.tensor_model_parallel_size"
SP_KEY = f"{MEGATRON}.sequence_parallel"
"""Default True in verl's Megatron trainer config; verl turns it off itself at TP 1."""
CP_KEY = f"{MEGATRON}.context_parallel_size"

MICRO_BATCH_KEYS = (
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
)
"""The micro batch sizes a collection run takes from the user (one lane per request)."""


def _value(parsed: list[UserOverride], key: str) -> str | None:
    """The last value the user gave ``key`` (Hydra keeps the last), as text; None if not given."""
    found = [ov for ov in parsed if ov.key.lstrip("+") == key and not ov.delete]
    return None if not found else str(found[-1].value)


def _false(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "false"


def _megatron(parsed: list[UserOverride]) -> UserOverride | None:
    """The override that puts the actor on Megatron (its strategy or verl's engine group), if any."""
    return next(
        (ov for ov in parsed if ov.key in (STRATEGY_KEY, ENGINE_KEY) and str(ov.value) == "megatron"),
        None,
    )


def required(rows: list[Override], parsed: list[UserOverride]) -> list[Override]:
    """The run's required rows, with ``model.use_remove_padding=false`` for a Megatron run in bshd.

    verl's V1 worker overwrites the Megatron engine's ``use_remove_padding`` with the model's, so
    the user's ``actor.megatron.use_remove_padding=False`` holds only if the model's row agrees."""
    if _megatron(parsed) is None or not _false(_value(parsed, REMOVE_PADDING_KEY)):
        return rows
    why = (
        f"{REMOVE_PADDING_KEY}=False asks for Megatron's bshd layout, and verl's V1 worker "
        f"(engine_workers.py) overwrites the engine's use_remove_padding with {MODEL_REMOVE_PADDING_KEY}"
    )
    return [
        row.model_copy(update={"value": False, "why": why}) if row.key == MODEL_REMOVE_PADDING_KEY else row
        for row in rows
    ]


def refusals(parsed: list[UserOverride], kind: RunKind) -> list[str]:
    """One line per problem of a Megatron collection run; none for FSDP or a token-level run."""
    strategy = _megatron(parsed)
    if strategy is None or kind is RunKind.TOKEN_LEVEL:
        return []
    several = [ov for ov in parsed if ov.key in MICRO_BATCH_KEYS and str(ov.value) != "1"]
    needs_lanes = kind is RunKind.RIDE_ALONG or bool(several)
    if not needs_lanes:
        return []
    why = (
        "a ride-along forward covers prompt + response"
        if kind is RunKind.RIDE_ALONG
        else f"`{several[0].text}` puts several samples in one micro batch"
    )
    problems = []
    if not _false(_value(parsed, REMOVE_PADDING_KEY)):
        problems.append(
            f"refused `{strategy.text}` without `{REMOVE_PADDING_KEY}=False`: {why}, so each "
            "request's prompt rows are cut into its own lane, and Megatron's lanes are cut in "
            "verl's bshd layout only (the packed THD layout's attention is Transformer Engine's, "
            f"not verified here). Pass {REMOVE_PADDING_KEY}=False, or --prompts-only with "
            f"{MICRO_BATCH_KEYS[0]}=1 and {MICRO_BATCH_KEYS[1]}=1 (each micro batch dumped whole)"
        )
    cp = _value(parsed, CP_KEY)
    if cp is not None and cp != "1":
        problems.append(
            f"refused `{CP_KEY}={cp}`: context parallelism splits each row's positions across "
            "ranks, so a request's lane is not on one rank. Collect with context_parallel_size=1"
        )
    tp = _value(parsed, TP_KEY)
    if tp is not None and tp != "1" and not _false(_value(parsed, SP_KEY)):
        problems.append(
            f"refused `{TP_KEY}={tp}` with sequence parallelism (verl's default): it splits each "
            f"layer's positions across the tensor-parallel ranks. Pass {SP_KEY}=False for the "
            "collection run"
        )
    return problems
