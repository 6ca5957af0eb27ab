"""The rows the run sets and the data depends on: :data:`ENV` (environment) and :data:`REQUIRED` (overrides).

Data only, kept apart from the engine so that a row can be read, added or reviewed without
reading how rows are composed and refused (:mod:`.overrides` does that, and its docstring says
what each kind of row means). Every key was checked against the real Hydra config of the set's
verl, and each row says *why*: the refusal messages and ``--table`` show it. Adding a required
override is one row in :data:`REQUIRED`; the defaults a user may override are
:mod:`.override_defaults`'s :data:`DEFAULTS`.
"""

from __future__ import annotations

from verl_consistency.contracts import env as hook_env
from verl_consistency.entrypoints.run.modes import LAUNCH, Launch, Mode
from verl_consistency.entrypoints.run.override_schema import (
    ALL_KINDS,
    ASYNC_MODES,
    NOT_RIDE_ALONG,
    ONLY_CURRENT,
    ONLY_NEXT,
    PROMPTS_ONLY_KIND,
    SHARED_POOL_MODES,
    TOKEN_LEVEL_ONLY,
    UPDATE_PHASES,
    EnvVar,
    FromRun,
    Override,
)

ENV: tuple[EnvVar, ...] = (
    EnvVar(name=hook_env.DUMP_ON, value="1", why="turns the training-side msprobe dump on (recipe name)"),
    EnvVar(
        name=hook_env.PROMPTS_ONLY,
        value="1",
        kinds=PROMPTS_ONLY_KIND,
        why="--prompts-only (the recipe): every response is trimmed to its prompt's last token, so the "
        "training forward covers the prompt only, which is what vLLM's prefill step computed (the "
        "weights do not move). A ride-along run sets nothing: the training step is the user's, and "
        "the hooks cut each request's prompt rows out of the forward over prompt + response",
    ),
    EnvVar(
        name=hook_env.DUMP_PHASE,
        value=FromRun(run="dump_phase"),
        why="which training phase is dumped: log_prob, update_actor or all (--phase)",
    ),
    EnvVar(
        name=hook_env.ACTOR_CONFIG,
        value=FromRun(run="actor_config"),
        why="the training-side msprobe config (the recipe hard-codes /home/config_actor.json)",
    ),
    EnvVar(
        name=hook_env.RUN_DIR,
        value=FromRun(run="run_dir"),
        kinds=ALL_KINDS,
        why="the run folder, so that the hooks write paths relative to it",
    ),
    EnvVar(
        name=hook_env.TOKEN_LEVEL,
        value="1",
        kinds=ALL_KINDS,
        why="one token_mismatch.jsonl record per response where verl has both vLLM's and its own "
        "log-probs (patches/current/verl/0005-token-records); in a PROMPTS_ONLY collection run, the "
        "one-token next-token records of the output row",
    ),
    EnvVar(
        name=hook_env.DUMP_ON,
        value="0",
        kinds=TOKEN_LEVEL_ONLY,
        why="a token-level run dumps nothing with msprobe",
    ),
    EnvVar(
        name=hook_env.PROMPTS_ONLY,
        value="0",
        kinds=TOKEN_LEVEL_ONLY,
        why="a token-level run trains on normal responses: their tokens are what it compares",
    ),
    EnvVar(
        name=hook_env.CAPTURE,
        value=FromRun(run="capture"),
        why="which requests are dumped, evaluated the same way on both sides (--capture)",
    ),
    EnvVar(
        name=hook_env.KEEP_VERSIONS,
        value="0",
        modes=frozenset({Mode.HYBRID}),
        why="hybrid trains each step on what that step's weights generated, so the trainer keeps no "
        "older weights on the host (the async modes keep up to 8 versions, verl's "
        "max_off_policy_threshold, to dump each request's forward at its rollout's weights)",
    ),
    EnvVar(
        name=hook_env.KEEP_VERSIONS,
        value="0",
        modes=ASYNC_MODES,
        kinds=PROMPTS_ONLY_KIND,
        why="--prompts-only pins every staleness knob and never moves the weights: no older weights are kept",
    ),
    EnvVar(
        name="VLLM_USE_V2_MODEL_RUNNER",
        value="0",
        why="vLLM's V2 model runner has no msprobe debugger hooks, so the inference side would dump nothing",
    ),
    EnvVar(
        name="TORCHDYNAMO_DISABLE",
        value="1",
        modes=ASYNC_MODES,
        why="the recipe turns TorchDynamo off for fully async: compiled regions bypass msprobe's "
        "module hooks (on the next set colocate-async too: it runs the same async client)",
    ),
    EnvVar(
        name="RAY_OVERRIDE_JOB_RUNTIME_ENV",
        value="1",
        driver_only=True,
        kinds=ALL_KINDS,
        why="on a RayJob whose runtimeEnvYAML sets one of these variables too, Ray would refuse to "
        "merge it with ours (ValueError in ray.init); with this set, our values win",
    ),
)

_NAMED = (
    "in ride-along (the default) the user's value stands: records carry weight versions, and the "
    "pairing pairs equal versions only and names the rest weights_differ"
)
"""Why a staleness row applies only to the recipe (and the triage run)."""

_OUTPUT_ROW = (
    "vLLM's log-probs of the first response token are the vLLM side of the output row "
    "(the PROMPTS_ONLY trim keeps them for the trainer's next-token record)"
)


def _v1_rows() -> tuple[Override, ...]:
    """``trainer.use_v1`` and one ``trainer.v1.trainer_mode`` row per mode, from :data:`LAUNCH`."""
    rows = []
    for set_name, modes in LAUNCH.items():
        v1 = {mode: how for mode, how in modes.items() if isinstance(how, Launch) and how.trainer_mode}
        if not v1:
            continue
        pick = ", ".join(f"{how.trainer_mode}: `run {mode.value}`" for mode, how in v1.items())
        rows.append(
            Override(
                key="trainer.use_v1",
                value=True,
                modes=frozenset(v1),
                kinds=ALL_KINDS,
                sets=frozenset({set_name}),
                why="on this pin set the patches hook verl 0.9's V1 trainer (verl/trainer/ppo/v1/); "
                "trainer.use_v1=false runs the legacy trainer (verl.trainer.main_ppo_v0, deprecated "
                "upstream), which they do not patch. For verl's legacy trainers (and the legacy "
                "fully_async_main), use the current pin set: VERL_CONSISTENCY_PIN_SET=current",
            )
        )
        rows += [
            Override(
                key="trainer.v1.trainer_mode",
                value=how.trainer_mode,
                modes=frozenset({mode}),
                kinds=ALL_KINDS,
                sets=frozenset({set_name}),
                why=f"`verl-consistency run {mode.value}` is V1 trainer_mode={how.trainer_mode} ({how.why}); "
                f"choose the trainer mode with the command's MODE argument ({pick})",
            )
            for mode, how in v1.items()
        ]
    return tuple(rows)


REQUIRED: tuple[Override, ...] = (
    Override(
        key="actor_rollout_ref.rollout.name",
        value="vllm",
        why="the inference-side dump hooks live in vllm-ascend's model runner",
    ),
    Override(
        key="actor_rollout_ref.rollout.enforce_eager",
        value=True,
        why="vllm-ascend builds its msprobe debugger only in eager mode and raises "
        "'Dumping/debugging only works in eager mode' otherwise",
    ),
    Override(
        key="actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config",
        value={"dump_config_path": FromRun(run="rollout_config")},
        add=True,
        why="points vllm-ascend at the inference-side msprobe config; the run writes it there",
    ),
    Override(
        key="actor_rollout_ref.rollout.enable_prefix_caching",
        value=False,
        why="a prefix-cache hit prefills only the uncached suffix, so the vLLM dump no longer "
        "covers the prompt that the training forward computes",
    ),
    Override(
        key="actor_rollout_ref.rollout.enable_chunked_prefill",
        value=False,
        why="chunked prefill splits a prompt over several steps and mixes it with decode tokens, "
        "so no single vLLM step holds the whole prompt",
    ),
    Override(
        key="actor_rollout_ref.model.use_remove_padding",
        value=True,
        why="vLLM computes unpadded (packed) tokens; a padded training forward computes other tensors",
    ),
    Override(
        key="actor_rollout_ref.actor.use_dynamic_bsz",
        value=False,
        why="dynamic batch size re-forms micro batches by token count; per-request lanes are "
        "proven on verl's static micro batches only",
    ),
    Override(
        key="actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
        value=False,
        why="verl asserts it equals actor.use_dynamic_bsz; dynamic packing mixes samples in a "
        "log-prob micro batch",
    ),
    Override(
        key="trainer.val_before_train",
        value=False,
        why="validation before training runs extra vLLM generations that have no training "
        "counterpart and use up msprobe's dump steps",
    ),
    Override(
        key="trainer.balance_batch",
        value=False,
        kinds=PROMPTS_ONLY_KIND,
        why="--prompts-only keeps the recipe's setting (it reorders and re-partitions samples across "
        "ranks by token count). Not required in ride-along: pairing is by request id, and each "
        "micro batch's request_id column travels with its rows through the reorder (verl 0.9.1's "
        "V1 trainer reorders always and pairs all the same)",
    ),
    Override(
        key="algorithm.rollout_correction",
        value=None,
        kinds=PROMPTS_ONLY_KIND,
        why="--prompts-only: null turns bypass mode off, so verl recomputes old log-probs (the "
        "PROMPTS_ONLY trim refuses bypass mode in every phase: it would train on rollout log-probs "
        "that the trim drops), and it skips rollout-correction IS/RS on prompt-only batches (verl "
        "0.8.0 ray_trainer.py; 0.9.1 trainer/ppo/v1/trainer_base.py _compute_old_log_prob and "
        "_compute_advantage). A ride-along run leaves it to the user: with bypass mode in force "
        "it dumps update_actor (run/bypass.py)",
    ),
    Override(
        key="actor_rollout_ref.hybrid_engine",
        value=False,
        modes=frozenset({Mode.FULLY_ASYNC}),
        kinds=ALL_KINDS,
        sets=ONLY_CURRENT,
        why="fully async runs rollout and training on separate pools; verl asserts "
        "hybrid_engine is False there",
    ),
    Override(
        key="actor_rollout_ref.hybrid_engine",
        value=False,
        modes=frozenset({Mode.FULLY_ASYNC}),
        kinds=ALL_KINDS,
        sets=ONLY_NEXT,
        why="fully async runs rollout and training on separate pools; with hybrid_engine=true verl "
        "0.9's separate_async also serves rollout from replicas on the training NPUs "
        "(trainer_separate_async.py:78-82), so the two pools would no longer be separate",
    ),
    Override(
        key="data.shuffle",
        value=False,
        modes=ASYNC_MODES,
        kinds=PROMPTS_ONLY_KIND,
        why="--prompts-only keeps the recipe's setting: with shuffle on and no data.seed every run "
        "draws a different prompt order, so two collection runs cannot be compared step for step. "
        "Not required in ride-along: pairing is by request id within a run, whatever the order",
    ),
    Override(
        key="actor_rollout_ref.rollout.calculate_log_probs",
        value=True,
        modes=frozenset({Mode.FULLY_ASYNC}),
        sets=ONLY_CURRENT,
        why="the fully-async rollouter asserts it ('must rollout calculate log_probs')",
    ),
    Override(
        key="actor_rollout_ref.rollout.calculate_log_probs",
        value=True,
        modes=SHARED_POOL_MODES,
        why=_OUTPUT_ROW,
    ),
    Override(
        key="actor_rollout_ref.rollout.calculate_log_probs",
        value=True,
        modes=frozenset({Mode.FULLY_ASYNC}),
        sets=ONLY_NEXT,
        why=_OUTPUT_ROW,
    ),
    Override(
        key="actor_rollout_ref.rollout.calculate_log_probs",
        value=True,
        kinds=TOKEN_LEVEL_ONLY,
        why="vLLM's log-probs of the response tokens are one side of every token record",
    ),
    Override(
        key="algorithm.rollout_correction.bypass_mode",
        value=False,
        kinds=TOKEN_LEVEL_ONLY,
        why="bypass mode (the fully-async default) uses vLLM's log-probs as the old log-probs and "
        "never recomputes them, so there is nothing to compare them with (verl 0.8.0 computes its own "
        "training/rollout_probs_diff_* only in decoupled mode too)",
    ),
    Override(
        key="async_training.staleness_threshold",
        value=0,
        modes=frozenset({Mode.FULLY_ASYNC}),
        kinds=NOT_RIDE_ALONG,
        sets=ONLY_CURRENT,
        why="every sample must be generated by the weights the trainer holds when it takes the sample "
        "(0.8.0's default 0.1 lets the rollouter run ahead). The rollouter submits at most "
        "ppo_mini_batch_size * require_batches * (staleness_threshold + 1) * trigger_parameter_sync_step "
        "samples per weight version (fully_async_rollouter.py:529-543, paused at :1090) and the trainer "
        "syncs after consuming exactly ppo_mini_batch_size * require_batches * trigger_parameter_sync_step "
        "(fully_async_trainer.py:150-151, :495-499); with 0 the two are equal, so at each sync the queue "
        "is empty and no request is in flight: nothing generated by an older version is trained after "
        "it, and partial rollout never resumes a request with newer weights (--prompts-only and "
        "--token-level; " + _NAMED + ")",
    ),
    Override(
        key="async_training.trigger_parameter_sync_step",
        value=1,
        modes=frozenset({Mode.FULLY_ASYNC}),
        phases=UPDATE_PHASES,
        kinds=PROMPTS_ONLY_KIND,
        sets=ONLY_CURRENT,
        why="the k-th trainer step of a sync cycle updates the actor with weights already updated k-1 "
        "times, which the rollout never had (verl restores the cycle's first version for old "
        "log-probs only: fully_async_trainer.py:476-485), so update_actor dumps pair only when every "
        "step syncs (--prompts-only; " + _NAMED + ")",
    ),
    Override(
        key="async_training.require_batches",
        value=1,
        modes=frozenset({Mode.FULLY_ASYNC}),
        phases=UPDATE_PHASES,
        kinds=PROMPTS_ONLY_KIND,
        sets=ONLY_CURRENT,
        why="a trainer step takes require_batches mini batches (fully_async_trainer.py:150-151) and "
        "update_actor steps the optimizer after each (ray_trainer.py:1310-1326), so the second mini "
        "batch's forward runs on weights the rollout never had (--prompts-only; " + _NAMED + ")",
    ),
    *_v1_rows(),
    Override(
        key="trainer.v1.sampler.max_off_policy_threshold",
        value=1,
        modes=ASYNC_MODES,
        kinds=NOT_RIDE_ALONG,
        sets=ONLY_NEXT,
        why="a prompt may be trained on only in the step it was submitted in, i.e. by the weights "
        "that generated it: the async replay buffer drops a finished prompt whose span "
        "(global step - submission step + 1) exceeds this (replay_buffer.py:520-529, asserted at "
        "sampling, :600-611). A prompt still generating at a weight sync is resumed with the new "
        "weights (partial rollout) and so dropped, instead of pairing a prefill of one weight "
        "version with a training forward of another; the V1 form of 0.8.0's async_training "
        "staleness knobs (--prompts-only and --token-level; " + _NAMED + ")",
    ),
    Override(
        key="trainer.v1.sampler.max_off_policy_strategy",
        value="drop",
        modes=ASYNC_MODES,
        kinds=NOT_RIDE_ALONG,
        sets=ONLY_NEXT,
        why="'wait' trains on prompts that reached the staleness threshold instead of dropping "
        "them (replay_buffer.py:541-556), i.e. on trajectories of older weights (--prompts-only "
        "and --token-level; " + _NAMED + ")",
    ),
    Override(
        key="trainer.v1.colocate_async.num_warmup_batches",
        value=0,
        modes=frozenset({Mode.COLOCATE_ASYNC}),
        kinds=NOT_RIDE_ALONG,
        sets=ONLY_NEXT,
        why="a warm-up batch keeps prompts generating while the trainer takes its batch; "
        "colocate_async aborts them at sample end and resumes them after the weight update "
        "(trainer_colocate_async.py:34-48), so their prefill and their training forward would see "
        "different weights. With none, each step generates exactly the batch it trains on "
        "(--prompts-only and --token-level; " + _NAMED + ")",
    ),
    Override(
        key="trainer.v1.separate_async.parameter_sync_step",
        value=1,
        modes=frozenset({Mode.FULLY_ASYNC}),
        phases=UPDATE_PHASES,
        kinds=PROMPTS_ONLY_KIND,
        sets=ONLY_NEXT,
        why="within a sync cycle the k-th mini batch is trained by weights already updated k times, "
        "while the rollout still has the cycle's first version (verl restores that version for "
        "old log-probs only: trainer_separate_async.py:187-211), so update_actor dumps pair only "
        "when every mini batch syncs (--prompts-only; " + _NAMED + ")",
    ),
)
