"""The rows the run sets but the user may override: :data:`DEFAULTS`.

What makes a run work out of the box (the generated prompt set and its reward, a small batch,
console logging, one node's NPUs split between training and rollout) and has no bearing on
whether a pair compares like with like; :data:`.override_rows.REQUIRED` holds what does. Data
only, like :mod:`.override_rows`; :mod:`.overrides` composes them, leaving out every default
whose key the user sets.
"""

from __future__ import annotations

from verl_consistency.contracts.env import DumpPhase
from verl_consistency.entrypoints.run.modes import Mode
from verl_consistency.entrypoints.run.override_schema import (
    ALL_KINDS,
    ONLY_CURRENT,
    ONLY_NEXT,
    RIDE_ALONG_ONLY,
    SHARED_POOL_MODES,
    TOKEN_LEVEL_ONLY,
    UPDATE_PHASES,
    FromRun,
    Override,
)

_GRPO_N = "GRPO needs more than one response per prompt"
_MICRO_BATCH = (
    "a value verl accepts with any mini batch; set your job's own: each request of an FSDP "
    "micro batch is dumped in a lane of its own (hooks/lanes/msprobe_lanes.py). Every run kind sets it: "
)

DEFAULTS: tuple[Override, ...] = (
    Override(
        kinds=ALL_KINDS,
        key="actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        value=1,
        why=_MICRO_BATCH + "verl's validate_config raises 'Please set at least one of "
        "'actor_rollout_ref.rollout.log_prob_micro_batch_size' or ...' without it",
    ),
    Override(
        kinds=ALL_KINDS,
        key="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        value=1,
        why=_MICRO_BATCH + "verl's FSDPActorConfig asserts 'Please set at least one of "
        "'actor.ppo_micro_batch_size' or ...' without it",
    ),
    Override(
        kinds=TOKEN_LEVEL_ONLY,
        key="actor_rollout_ref.rollout.name",
        value="vllm",
        why="verl's rollout config has no default name (???: 'Missing mandatory value: "
        "actor_rollout_ref.rollout.name' when the workers start); a collection run requires vllm, "
        "a token-level run may use another engine that returns log-probs",
    ),
    Override(
        kinds=ALL_KINDS,
        key="data.train_files",
        value=FromRun(run="train_data"),
        why="the generated prompt set, so that a run needs no dataset download",
    ),
    Override(
        kinds=ALL_KINDS,
        key="data.val_files",
        value=FromRun(run="train_data"),
        why="verl builds a validation set even when it never validates",
    ),
    Override(
        kinds=ALL_KINDS, key="data.max_prompt_length", value=512, why="the generated prompts are far shorter"
    ),
    Override(
        kinds=ALL_KINDS,
        key="data.max_response_length",
        value=128,
        why="short responses keep a run fast (--prompts-only trims them before the training forward)",
    ),
    Override(
        kinds=ALL_KINDS,
        key="reward.custom_reward_function.path",
        value=FromRun(run="reward_fn"),
        why="a rule-based reward for the generated prompt set (no reward model): 1 for the right "
        "answer, a partial credit below 0.5 otherwise that varies across a random model's responses, "
        "so that GRPO's advantages and the gradient are not 0 (reward.py)",
    ),
    Override(
        kinds=ALL_KINDS,
        key="reward.custom_reward_function.name",
        value="compute_score",
        why="the function in the generated reward file",
    ),
    Override(kinds=ALL_KINDS, key="algorithm.adv_estimator", value="grpo", why="GRPO needs no critic model"),
    Override(
        kinds=ALL_KINDS,
        key="trainer.logger",
        value=["console"],
        why="verl's default also logs to wandb, which needs network access and a key",
    ),
    Override(
        kinds=ALL_KINDS,
        key="trainer.project_name",
        value="verl-consistency",
        why="names the run in verl's logs",
    ),
    Override(
        kinds=ALL_KINDS,
        key="trainer.experiment_name",
        value=FromRun(run="run_id"),
        why="names the run in verl's logs",
    ),
    Override(
        kinds=ALL_KINDS, key="trainer.total_epochs", value=1, why="one pass over the prompt set is enough"
    ),
    Override(kinds=ALL_KINDS, key="trainer.save_freq", value=-1, why="a collection run needs no checkpoints"),
    Override(
        kinds=ALL_KINDS,
        key="actor_rollout_ref.actor.ppo_mini_batch_size",
        value=8,
        why="verl's default (256) exceeds the generated prompt set",
    ),
    Override(
        kinds=ALL_KINDS,
        key="data.train_batch_size",
        value=8,
        modes=SHARED_POOL_MODES,
        why="verl's default (1024) exceeds the generated prompt set",
    ),
    Override(
        kinds=ALL_KINDS,
        key="actor_rollout_ref.rollout.n",
        value=2,
        modes=SHARED_POOL_MODES,
        why=_GRPO_N,
    ),
    Override(
        kinds=ALL_KINDS,
        key="actor_rollout_ref.rollout.n",
        value=2,
        modes=frozenset({Mode.FULLY_ASYNC}),
        sets=ONLY_NEXT,
        why=_GRPO_N + " (0.8.0's fully-async config set rollout.n=4 itself; main_ppo's default is 1)",
    ),
    Override(
        kinds=ALL_KINDS,
        key="data.train_batch_size",
        value=0,
        modes=frozenset({Mode.FULLY_ASYNC}),
        sets=ONLY_CURRENT,
        why="fully async draws prompts one by one (data.gen_batch_size=1); recipe setting",
    ),
    Override(
        kinds=ALL_KINDS,
        key="data.train_batch_size",
        value=8,
        modes=frozenset({Mode.FULLY_ASYNC}),
        sets=ONLY_NEXT,
        why="separate_async asserts train_batch_size == parameter_sync_step * ppo_mini_batch_size "
        "(trainer_separate_async.py:56-63): 1 * 8. The async modes draw prompts one by one "
        "themselves (data.gen_batch_size is forced to 1, trainer_base.py:728-739)",
    ),
    Override(
        kinds=ALL_KINDS,
        key="trainer.v1.separate_async.parameter_sync_step",
        value=1,
        modes=frozenset({Mode.FULLY_ASYNC}),
        phases=frozenset({DumpPhase.LOG_PROB}),
        sets=ONLY_NEXT,
        why="one actor update per weight sync (verl's default is 4); with more, verl still computes "
        "old log-probs with the rollout's weights, so a log_prob run may raise it together with "
        "data.train_batch_size",
    ),
    Override(
        kinds=RIDE_ALONG_ONLY,
        key="trainer.v1.separate_async.parameter_sync_step",
        value=1,
        modes=frozenset({Mode.FULLY_ASYNC}),
        phases=UPDATE_PHASES,
        sets=ONLY_NEXT,
        why="one actor update per weight sync, so that every update_actor forward can pair; a "
        "ride-along run may raise it (with data.train_batch_size): the later mini batches of a "
        "cycle then pair as weights_differ (--prompts-only requires 1)",
    ),
    Override(
        kinds=ALL_KINDS,
        key="actor_rollout_ref.rollout.nnodes",
        value=1,
        modes=frozenset({Mode.FULLY_ASYNC}),
        sets=ONLY_NEXT,
        why="the standalone rollout pool: one node (verl's default 0 is refused by separate_async, "
        "trainer_separate_async.py:64; 0.8.0 had it as the top-level rollout.nnodes)",
    ),
    Override(
        kinds=ALL_KINDS,
        key="actor_rollout_ref.rollout.checkpoint_engine.backend",
        value="nccl",
        modes=frozenset({Mode.FULLY_ASYNC}),
        sets=ONLY_NEXT,
        why="separate_async refuses the default 'naive' weight sync (trainer_separate_async.py:68); "
        "'nccl' is HCCL on Ascend (checkpoint_engine/hccl_checkpoint_engine.py registers under it), "
        "as 0.8.0's fully-async config set",
    ),
    Override(
        kinds=ALL_KINDS,
        key="trainer.n_gpus_per_node",
        value=4,
        modes=frozenset({Mode.FULLY_ASYNC}),
        why="one 8-NPU node: 4 NPUs train...",
    ),
    Override(
        kinds=ALL_KINDS,
        key="rollout.n_gpus_per_node",
        value=4,
        modes=frozenset({Mode.FULLY_ASYNC}),
        sets=ONLY_CURRENT,
        why="...and 4 NPUs roll out",
    ),
    Override(
        kinds=ALL_KINDS,
        key="actor_rollout_ref.rollout.n_gpus_per_node",
        value=4,
        modes=frozenset({Mode.FULLY_ASYNC}),
        sets=ONLY_NEXT,
        why="...and 4 NPUs roll out (0.8.0's top-level rollout.n_gpus_per_node)",
    ),
    Override(
        kinds=ALL_KINDS,
        key="async_training.trigger_parameter_sync_step",
        value=1,
        modes=frozenset({Mode.FULLY_ASYNC}),
        phases=frozenset({DumpPhase.LOG_PROB}),
        sets=ONLY_CURRENT,
        why="one trainer step per weight sync (verl 0.8.0's default is 4); with more, verl still "
        "computes old log-probs with the weights the rollout had (fully_async_trainer.py:476-485), "
        "so a log_prob run may raise it",
    ),
    Override(
        kinds=RIDE_ALONG_ONLY,
        key="async_training.trigger_parameter_sync_step",
        value=1,
        modes=frozenset({Mode.FULLY_ASYNC}),
        phases=UPDATE_PHASES,
        sets=ONLY_CURRENT,
        why="one trainer step per weight sync, so that every update_actor forward can pair; a "
        "ride-along run may raise it: the later steps of a cycle then pair as weights_differ "
        "(--prompts-only requires 1)",
    ),
    Override(
        kinds=ALL_KINDS,
        key="rollout.total_rollout_steps",
        value=64,
        modes=frozenset({Mode.FULLY_ASYNC}),
        sets=ONLY_CURRENT,
        why="as many prompts as the generated prompt set holds",
    ),
)
