"""The rows that refuse what the run does not set: :data:`REFUSALS` (one key) and :data:`MATCHED` (two keys).

A user may override any key of verl's config the run leaves to verl, except these: they would
spoil the data (a ``sync`` rollout, a shuffled prompt order, the legacy fully-async blocks on
the next set, a second PPO epoch, a train batch larger than the mini batch). Data only, like
:mod:`.override_rows`; :mod:`.overrides` applies them, and each row's ``why`` is its refusal message.
"""

from __future__ import annotations

from verl_consistency.entrypoints.run.modes import Mode
from verl_consistency.entrypoints.run.override_schema import (
    ALL_KINDS,
    ONLY_NEXT,
    PROMPTS_ONLY_KIND,
    SHARED_POOL_MODES,
    UPDATE_PHASES,
    Matched,
    Refusal,
)

_LEGACY_FULLY_ASYNC = (
    "on the next pin set fully-async is verl 0.9's V1 trainer_mode=separate_async in "
    "verl.trainer.main_ppo (`verl-consistency run fully-async`); the legacy "
    "verl.experimental.fully_async_policy.fully_async_main, which verl's maintainers deprecate in its "
    "favour, is not run on this set (use VERL_CONSISTENCY_PIN_SET=current for it)"
)

REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        key="global_profiler.tool",
        bad=("precision_debugger",),
        why="verl's own stage-level msprobe hook shares the per-process PrecisionDebugger "
        "singleton with our per-micro-batch hook; the two would start and stop each other's dumps",
    ),
    Refusal(
        key="profiler.tool",
        match="suffix",
        bad=("precision_debugger",),
        why="verl's own stage-level msprobe hook shares the per-process PrecisionDebugger "
        "singleton with our per-micro-batch hook; the two would start and stop each other's dumps",
    ),
    Refusal(
        key="actor_rollout_ref.rollout.log_prob_micro_batch_size",
        why="the deprecated global micro batch size cannot be combined with "
        "log_prob_micro_batch_size_per_gpu=1 (verl raises), and it batches samples together",
    ),
    Refusal(
        key="actor_rollout_ref.actor.ppo_micro_batch_size",
        why="the deprecated global micro batch size overrides ppo_micro_batch_size_per_gpu=1 "
        "and batches samples together",
    ),
    Refusal(
        key="trainer.test_freq",
        allowed=(-1,),
        why="validation during training runs vLLM generations that have no training "
        "counterpart and use up msprobe's dump steps; keep trainer.test_freq=-1 (0 turns "
        "validation off too, but verl 0.8.0's fully-async trainer divides by it when training "
        "ends, fully_async_trainer.py:407: a ZeroDivisionError after the dumps are written)",
    ),
    Refusal(
        key="actor_rollout_ref.rollout.mode",
        bad=("sync",),
        kinds=ALL_KINDS,
        why="the request-id patches hook verl's async LLM server client",
    ),
    Refusal(
        key="data.shuffle",
        bad=(True,),
        modes=frozenset({Mode.HYBRID}),
        kinds=PROMPTS_ONLY_KIND,
        why="--prompts-only keeps the recipe's fixed order: with shuffle on and no data.seed every "
        "run draws a different prompt order; set data.seed too if you need a shuffled order "
        "(ride-along takes any order: pairing is by request id)",
    ),
    Refusal(
        key="async_training",
        match="subtree",
        kinds=ALL_KINDS,
        sets=ONLY_NEXT,
        why=_LEGACY_FULLY_ASYNC + ". Its knobs map to: staleness_threshold -> "
        "trainer.v1.sampler.max_off_policy_threshold (--prompts-only sets 1), trigger_parameter_sync_step -> "
        "trainer.v1.separate_async.parameter_sync_step, partial_rollout -> always on",
    ),
    Refusal(
        key="rollout",
        match="subtree",
        kinds=ALL_KINDS,
        sets=ONLY_NEXT,
        why=_LEGACY_FULLY_ASYNC + ". Its top-level rollout.{nnodes,n_gpus_per_node} block is "
        "actor_rollout_ref.rollout.{nnodes,n_gpus_per_node} in verl 0.9, and "
        "rollout.total_rollout_steps is trainer.total_training_steps",
    ),
    *(
        Refusal(
            key=f"trainer.v1.{trainer_mode}.parameter_sync_step",
            allowed=(1,),
            modes=frozenset({mode}),
            kinds=ALL_KINDS,
            sets=ONLY_NEXT,
            why=f"verl reads parameter_sync_step for every trainer mode (trainer_base.py:130); above 1, "
            f"{trainer_mode} updates the actor several times between weight syncs and, unlike "
            "separate_async, computes old log-probs with the updated weights, which the rollout never had",
        )
        for mode, trainer_mode in ((Mode.HYBRID, "sync"), (Mode.COLOCATE_ASYNC, "colocate_async"))
    ),
    Refusal(
        key="trainer.v1.sampler.custom_sampler",
        match="subtree",
        allowed=(None,),
        kinds=ALL_KINDS,
        sets=ONLY_NEXT,
        why="a custom replay buffer owns which trajectories a step trains on, so the run's "
        "one-weight-version rule (max_off_policy_threshold=1) would no longer hold",
    ),
    Refusal(
        key="actor_rollout_ref.actor.ppo_epochs",
        allowed=(1,),
        phases=UPDATE_PHASES,
        why="a second PPO epoch runs the update_actor forward again on weights the first epoch "
        "already stepped (update_actor gets epochs=ppo_epochs: verl 0.8.0 ray_trainer.py:1312-1322, "
        "0.9.1 trainer/ppo/v1/trainer_base.py:1853), which the rollout never had: its dumps would "
        "compare as diverged although nothing is wrong",
    ),
)

MATCHED: tuple[Matched, ...] = (
    Matched(
        keys=("data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"),
        modes=SHARED_POOL_MODES,
        phases=UPDATE_PHASES,
        why="update_actor splits a step's batch into train_batch_size / ppo_mini_batch_size mini "
        "batches and steps the optimizer after each (verl 0.8.0 ray_trainer.py:1310-1326, 0.9.1 "
        "trainer/ppo/v1/trainer_base.py:1827-1853), so from the second mini batch on the forward "
        "runs on weights the rollout never had and its dumps would compare as diverged although "
        "nothing is wrong. Dump --phase log_prob to keep a larger train batch",
    ),
)
