"""THE table of what a collection run needs from verl, per pin set and mode: env, overrides, refusals.

Everything that decides how ``verl-consistency run`` launches verl lives here as data, so that
the CLI, the k8s manifests' tests and the image defaults read one table and cannot drift.
Adding a required override is one line in :data:`REQUIRED`.

There is one table for every pin set of ``patches/pins.toml``: a row names the sets it applies
to (:attr:`_Row.sets`, every set unless it says otherwise), so a row that both verl releases
need is written once, and only what differs between them is a row of its own. The set in force
is ``pins.load().set.name`` (``VERL_CONSISTENCY_PIN_SET``); :data:`LAUNCH` says, per set, which
verl module each mode runs and, on verl 0.9's V1 trainer, which ``trainer.v1.trainer_mode``.

Every key was checked against the real Hydra config of the set's verl
(``python -m verl.trainer.main_ppo --cfg job``, and on verl 0.8.0 the fully-async equivalent);
the tests in ``tests/entrypoints`` compose every mode of the set in force again from the command
this table produces.

Five kinds of rows:

* :data:`ENV` — environment variables. They are set on the verl driver *and* passed as
  ``+ray_kwargs.ray_init.runtime_env.env_vars.<NAME>``: verl's ``run_ppo`` (0.8.0 and 0.9.1) hands
  that dict to ``ray.init(runtime_env=...)``, Ray makes it the job's runtime env, and every actor
  verl creates (TaskRunner, the worker groups in ``single_controller/ray/base.py``, the vLLM
  servers in ``vllm_async_server.py``) adds its own ``env_vars`` on top — Ray merges
  ``env_vars`` per key. A variable only in the driver's environment reaches Ray workers only
  when the driver starts a local Ray; on a RayJob (an existing cluster) it does not.
* :data:`REQUIRED` — overrides the data depends on. A user override that contradicts one is refused.
* :data:`DEFAULTS` — what makes a run work out of the box (the generated prompt set, a small
  batch, console logging). The user may override any of them.
* :data:`REFUSALS` — user overrides refused although we do not set the key ourselves.
* :data:`MATCHED` — keys whose values must stay equal: a user override of one alone is refused
  (what a row per key cannot say, e.g. the train batch against the mini batch).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from verl_consistency.patches.contracts import env as hook_env
from verl_consistency.patches.contracts.env import DumpPhase


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
    from verl_consistency.patches import pins

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
    """What a run is for: a msprobe collection run, or a cheap token-level triage run (``--token-level``)."""

    COLLECTION = "collection"
    TOKEN_LEVEL = "token-level"


ALL_MODES: frozenset[Mode] = frozenset(Mode)
ASYNC_MODES: frozenset[Mode] = frozenset({Mode.FULLY_ASYNC, Mode.COLOCATE_ASYNC})
SHARED_POOL_MODES: frozenset[Mode] = frozenset({Mode.HYBRID, Mode.COLOCATE_ASYNC})
"""Modes where rollout and training share the NPUs (one pool)."""
ONLY_CURRENT: frozenset[str] = frozenset({CURRENT})
ONLY_NEXT: frozenset[str] = frozenset({NEXT})
ALL_PHASES: frozenset[DumpPhase] = frozenset(DumpPhase)
UPDATE_PHASES: frozenset[DumpPhase] = frozenset({DumpPhase.UPDATE_ACTOR, DumpPhase.ALL})
"""The phases that dump update_actor, whose forward an earlier optimizer step can spoil."""
COLLECTION_ONLY: frozenset[RunKind] = frozenset({RunKind.COLLECTION})
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
    """Run kinds the row applies to; a collection run's rows do not apply to a triage run."""
    sets: frozenset[str] = PIN_SETS
    """Pin sets the row applies to: a row both verl releases need is written once."""
    why: str

    def applies(
        self, mode: Mode, phase: DumpPhase, kind: RunKind = RunKind.COLLECTION, set_name: str = CURRENT
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


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------

ENV: tuple[EnvVar, ...] = (
    EnvVar(name=hook_env.DUMP_ON, value="1", why="turns the training-side msprobe dump on (recipe name)"),
    EnvVar(
        name=hook_env.PROMPTS_ONLY,
        value="1",
        why="the training forward covers the prompt only, which is what vLLM's prefill step computed",
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
        "log-probs (patches/verl/0005-token-records); in a PROMPTS_ONLY collection run, the "
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
        why="dynamic batch size packs several samples into one micro batch, so a training dump "
        "no longer belongs to one request",
    ),
    Override(
        key="actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
        value=False,
        why="verl asserts it equals actor.use_dynamic_bsz; dynamic packing mixes samples in a "
        "log-prob micro batch",
    ),
    Override(
        key="actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        value=1,
        why="one sample per log-prob micro batch: each training dump step pairs with one request",
    ),
    Override(
        key="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        value=1,
        why="one sample per update micro batch: each update_actor dump step pairs with one request",
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
        why="balance_batch reorders and re-partitions samples across ranks by token count, "
        "as the recipe notes; micro batches must follow the rollout order",
    ),
    Override(
        key="algorithm.rollout_correction",
        value=None,
        why="null turns bypass mode off, so verl recomputes old log-probs (bypass mode skips that "
        "forward and leaves the log_prob training dump empty; the PROMPTS_ONLY trim refuses it in "
        "every phase, since bypass mode would train on rollout log-probs that the trim drops), and "
        "it skips rollout-correction IS/RS on prompt-only batches (verl 0.8.0 ray_trainer.py; "
        "0.9.1 trainer/ppo/v1/trainer_base.py _compute_old_log_prob and _compute_advantage)",
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
        why="with shuffle on and no data.seed every run draws a different prompt order, so two "
        "collection runs cannot be compared step for step (recipe setting)",
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
        kinds=ALL_KINDS,
        sets=ONLY_CURRENT,
        why="every sample must be generated by the weights the trainer holds when it takes the sample "
        "(0.8.0's default 0.1 lets the rollouter run ahead). The rollouter submits at most "
        "ppo_mini_batch_size * require_batches * (staleness_threshold + 1) * trigger_parameter_sync_step "
        "samples per weight version (fully_async_rollouter.py:529-543, paused at :1090) and the trainer "
        "syncs after consuming exactly ppo_mini_batch_size * require_batches * trigger_parameter_sync_step "
        "(fully_async_trainer.py:150-151, :495-499); with 0 the two are equal, so at each sync the queue "
        "is empty and no request is in flight: nothing generated by an older version is trained after "
        "it, and partial rollout never resumes a request with newer weights",
    ),
    Override(
        key="async_training.trigger_parameter_sync_step",
        value=1,
        modes=frozenset({Mode.FULLY_ASYNC}),
        phases=UPDATE_PHASES,
        sets=ONLY_CURRENT,
        why="the k-th trainer step of a sync cycle updates the actor with weights already updated k-1 "
        "times, which the rollout never had (verl restores the cycle's first version for old "
        "log-probs only: fully_async_trainer.py:476-485), so update_actor dumps pair only when every "
        "step syncs",
    ),
    Override(
        key="async_training.require_batches",
        value=1,
        modes=frozenset({Mode.FULLY_ASYNC}),
        phases=UPDATE_PHASES,
        sets=ONLY_CURRENT,
        why="a trainer step takes require_batches mini batches (fully_async_trainer.py:150-151) and "
        "update_actor steps the optimizer after each (ray_trainer.py:1310-1326), so the second mini "
        "batch's forward runs on weights the rollout never had",
    ),
    *_v1_rows(),
    Override(
        key="trainer.v1.sampler.max_off_policy_threshold",
        value=1,
        modes=ASYNC_MODES,
        kinds=ALL_KINDS,
        sets=ONLY_NEXT,
        why="a prompt may be trained on only in the step it was submitted in, i.e. by the weights "
        "that generated it: the async replay buffer drops a finished prompt whose span "
        "(global step - submission step + 1) exceeds this (replay_buffer.py:520-529, asserted at "
        "sampling, :600-611). A prompt still generating at a weight sync is resumed with the new "
        "weights (partial rollout) and so dropped, instead of pairing a prefill of one weight "
        "version with a training forward of another; the V1 form of 0.8.0's async_training "
        "staleness knobs",
    ),
    Override(
        key="trainer.v1.sampler.max_off_policy_strategy",
        value="drop",
        modes=ASYNC_MODES,
        kinds=ALL_KINDS,
        sets=ONLY_NEXT,
        why="'wait' trains on prompts that reached the staleness threshold instead of dropping "
        "them (replay_buffer.py:541-556), i.e. on trajectories of older weights",
    ),
    Override(
        key="trainer.v1.colocate_async.num_warmup_batches",
        value=0,
        modes=frozenset({Mode.COLOCATE_ASYNC}),
        kinds=ALL_KINDS,
        sets=ONLY_NEXT,
        why="a warm-up batch keeps prompts generating while the trainer takes its batch; "
        "colocate_async aborts them at sample end and resumes them after the weight update "
        "(trainer_colocate_async.py:34-48), so their prefill and their training forward would see "
        "different weights. With none, each step generates exactly the batch it trains on",
    ),
    Override(
        key="trainer.v1.separate_async.parameter_sync_step",
        value=1,
        modes=frozenset({Mode.FULLY_ASYNC}),
        phases=UPDATE_PHASES,
        sets=ONLY_NEXT,
        why="within a sync cycle the k-th mini batch is trained by weights already updated k times, "
        "while the rollout still has the cycle's first version (verl restores that version for "
        "old log-probs only: trainer_separate_async.py:187-211), so update_actor dumps pair only "
        "when every mini batch syncs",
    ),
)

_GRPO_N = "GRPO needs more than one response per prompt"

DEFAULTS: tuple[Override, ...] = (
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
        why="responses are trimmed before the training forward; short ones keep a run fast",
    ),
    Override(
        kinds=ALL_KINDS,
        key="reward.custom_reward_function.path",
        value=FromRun(run="reward_fn"),
        why="a rule-based reward for the generated prompt set (no reward model)",
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
        kinds=ALL_KINDS,
        key="rollout.total_rollout_steps",
        value=64,
        modes=frozenset({Mode.FULLY_ASYNC}),
        sets=ONLY_CURRENT,
        why="as many prompts as the generated prompt set holds",
    ),
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
        why="with shuffle on and no data.seed every run draws a different prompt order; "
        "set data.seed too if you need a shuffled order",
    ),
    Refusal(
        key="async_training",
        match="subtree",
        kinds=ALL_KINDS,
        sets=ONLY_NEXT,
        why=_LEGACY_FULLY_ASYNC + ". Its knobs map to: staleness_threshold -> "
        "trainer.v1.sampler.max_off_policy_threshold (the run sets 1), trigger_parameter_sync_step -> "
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

# --------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------

_UNQUOTED = re.compile(r"^[A-Za-z0-9_./-]+$")
_HYDRA_WORDS = {"true", "false", "null", "nan", "inf", "-inf", "+inf"}


def hydra_value(value: Any) -> str:
    """Spell a Python value as a Hydra override value that parses back to the same value.

    Strings are single-quoted unless they are plain words that Hydra would read as strings
    anyway, so that a path or a number-like string never turns into another type.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        if _UNQUOTED.match(value) and value.lower() not in _HYDRA_WORDS and not _looks_numeric(value):
            return value
        # Hydra reads a backslash as an escape only before a quote or at the end of the string.
        escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'")
        return f"'{escaped}'"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    raise TypeError(f"cannot spell {value!r} as a Hydra value")


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def resolve(value: Value, run: Mapping[str, str]) -> Any:
    """Replace every :class:`FromRun` in ``value`` by the run's value."""
    if isinstance(value, FromRun):
        return run[value.run]
    if isinstance(value, Mapping):
        return {k: resolve(v, run) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, run) for v in value]
    return value


_C = RunKind.COLLECTION


def env_rows(mode: Mode, phase: DumpPhase, kind: RunKind = _C, set_name: str | None = None) -> list[EnvVar]:
    name = set_name or pin_set()
    return [row for row in ENV if row.applies(mode, phase, kind, name)]


def required_rows(
    mode: Mode, phase: DumpPhase, kind: RunKind = _C, set_name: str | None = None
) -> list[Override]:
    """REQUIRED rows for this run, plus one ``+ray_kwargs...env_vars.<NAME>`` row per Ray env var."""
    name = set_name or pin_set()
    rows = [row for row in REQUIRED if row.applies(mode, phase, kind, name)]
    for var in env_rows(mode, phase, kind, name):
        if not var.driver_only:
            rows.append(
                Override(
                    key=f"{RUNTIME_ENV_PREFIX}.{var.name}",
                    value=var.value,
                    add=True,
                    modes=var.modes,
                    phases=var.phases,
                    kinds=var.kinds,
                    sets=var.sets,
                    why=f"environment variable {var.name} must reach the Ray workers: {var.why}",
                )
            )
    return rows


def default_rows(
    mode: Mode, phase: DumpPhase, kind: RunKind = _C, set_name: str | None = None
) -> list[Override]:
    name = set_name or pin_set()
    return [row for row in DEFAULTS if row.applies(mode, phase, kind, name)]


def refusal_rows(
    mode: Mode, phase: DumpPhase, kind: RunKind = _C, set_name: str | None = None
) -> list[Refusal]:
    name = set_name or pin_set()
    return [row for row in REFUSALS if row.applies(mode, phase, kind, name)]


def matched_rows(
    mode: Mode, phase: DumpPhase, kind: RunKind = _C, set_name: str | None = None
) -> list[Matched]:
    name = set_name or pin_set()
    return [row for row in MATCHED if row.applies(mode, phase, kind, name)]


def spell(row: Override, run: Mapping[str, str]) -> str:
    return f"{'+' if row.add else ''}{row.key}={hydra_value(resolve(row.value, run))}"


def environment(
    mode: Mode, phase: DumpPhase, run: Mapping[str, str], kind: RunKind = _C, set_name: str | None = None
) -> dict[str, str]:
    return {row.name: str(resolve(row.value, run)) for row in env_rows(mode, phase, kind, set_name)}


# --------------------------------------------------------------------------------------------
# Conflicts
# --------------------------------------------------------------------------------------------


class UserOverride(BaseModel):
    """One user override, as Hydra's own parser reads it."""

    model_config = ConfigDict(frozen=True)
    text: str
    key: str
    value: Any = None
    delete: bool = False


class Conflict(BaseModel):
    override: str
    message: str


def parse_user_overrides(texts: Iterable[str]) -> list[UserOverride]:
    """Parse with Hydra's override grammar (the one verl will use); bad syntax raises ValueError."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out: list[UserOverride] = []
    for text in texts:
        try:
            (parsed,) = parser.parse_overrides([text])
        except HydraException as exc:
            raise ValueError(f"override {text!r} is not valid Hydra syntax: {exc}") from None
        try:
            value = parsed.value()
        except Exception:  # a sweep or another construct we do not interpret
            value = text.partition("=")[2]
        out.append(UserOverride(text=text, key=parsed.key_or_group, value=value, delete=parsed.is_delete()))
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _under(key: str, prefix: str) -> bool:
    return key.startswith(prefix + ".")


def find_conflicts(
    user: Iterable[UserOverride],
    mode: Mode,
    phase: DumpPhase,
    run: Mapping[str, str],
    kind: RunKind = _C,
    set_name: str | None = None,
) -> list[Conflict]:
    """Every user override that would spoil the data, each with a message naming it and why."""
    conflicts: list[Conflict] = []
    required = required_rows(mode, phase, kind, set_name)
    refusals = refusal_rows(mode, phase, kind, set_name)
    user = list(user)
    for ov in user:
        message = _conflict_with_required(ov, required, run) or _refused(ov, refusals)
        if message is not None:
            conflicts.append(Conflict(override=ov.text, message=f"refused `{ov.text}`: {message}"))
    composed = [*default_rows(mode, phase, kind, set_name), *required]
    for row in matched_rows(mode, phase, kind, set_name):
        conflict = _unmatched(row, user, composed, run)
        if conflict is not None:
            conflicts.append(conflict)
    return conflicts


_DELETED = object()
"""A key the user deleted (``~key``): verl's own default then applies, which we do not assume."""


def _unmatched(
    row: Matched, user: list[UserOverride], composed: list[Override], run: Mapping[str, str]
) -> Conflict | None:
    """The user's overrides of ``row.keys`` when they leave the two values unequal."""
    mine = [ov for ov in user if ov.key in row.keys]
    if not mine:
        return None  # ours are equal (tests/entrypoints checks every mode and phase)
    values: dict[str, Any] = {}
    for key in row.keys:
        given = [ov for ov in mine if ov.key == key]
        if given:
            values[key] = _DELETED if given[-1].delete else given[-1].value
        else:
            values[key] = next((resolve(r.value, run) for r in composed if r.key == key), _DELETED)
    a, b = (values[k] for k in row.keys)
    if a is not _DELETED and _same(a, b):
        return None
    shown = ", ".join(f"{k}={'<deleted>' if v is _DELETED else hydra_value(v)}" for k, v in values.items())
    texts = " ".join(f"`{ov.text}`" for ov in mine)
    return Conflict(
        override=" ".join(ov.text for ov in mine),
        message=f"refused {texts}: the run needs {row.keys[0]} == {row.keys[1]} (here {shown}); "
        f"set both to the same value: {row.why}",
    )


def _conflict_with_required(ov: UserOverride, required: list[Override], run: Mapping[str, str]) -> str | None:
    for row in required:
        want = resolve(row.value, run)
        shown = f"{row.key}={hydra_value(want)}"
        if ov.key == row.key:
            if ov.delete or not _same(ov.value, want):
                return f"the run requires {shown}: {row.why}"
            return None
        if _under(row.key, ov.key):
            return f"it replaces {row.key}, and the run requires {shown}: {row.why}"
        if _under(ov.key, row.key):
            child = ov.key[len(row.key) + 1 :].split(".")[0]
            if isinstance(want, Mapping) and child not in want:
                continue  # e.g. another vLLM additional_config entry: allowed
            return f"the run requires {shown}: {row.why}"
    return None


def _refused(ov: UserOverride, refusals: list[Refusal]) -> str | None:
    for row in refusals:
        hit = {
            "exact": ov.key == row.key,
            "subtree": ov.key == row.key or _under(ov.key, row.key),
            "suffix": ov.key == row.key or ov.key.endswith("." + row.key),
        }[row.match]
        if not hit:
            continue
        if row.bad is not None:
            refused = any(_same(ov.value, bad) for bad in row.bad)
        elif row.allowed is not None:
            refused = ov.delete or not any(_same(ov.value, ok) for ok in row.allowed)
        else:
            refused = True
        if refused:
            return row.why
    return None


class EnvConflict(BaseModel):
    name: str
    message: str


def find_env_conflicts(
    environ: Mapping[str, str],
    mode: Mode,
    phase: DumpPhase,
    run: Mapping[str, str],
    kind: RunKind = _C,
    set_name: str | None = None,
) -> list[EnvConflict]:
    """Variables in the caller's environment that disagree with what the run sets."""
    out = []
    for row in env_rows(mode, phase, kind, set_name):
        want = str(resolve(row.value, run))
        have = environ.get(row.name)
        if have is not None and have != want:
            out.append(
                EnvConflict(
                    name=row.name,
                    message=(
                        f"refused environment {row.name}={have!r}: "
                        f"the run sets {row.name}={want!r}: {row.why}"
                    ),
                )
            )
    return out


class Table(BaseModel):
    """The whole table, every pin set, as one JSON document (``verl-consistency run --table``).

    Each row names its ``sets``; ``pin_set`` and ``modules`` are the set in force's (a mode the set
    refuses is absent from ``modules``); ``launch`` holds every set's modes."""

    pin_set: str = Field(default_factory=pin_set)
    env: tuple[EnvVar, ...] = ENV
    required: tuple[Override, ...] = REQUIRED
    defaults: tuple[Override, ...] = DEFAULTS
    refusals: tuple[Refusal, ...] = REFUSALS
    matched: tuple[Matched, ...] = MATCHED
    launch: dict[str, dict[Mode, Launch | Unsupported]] = LAUNCH
    modules: dict[str, str] = Field(
        default_factory=lambda: {
            m.value: how.module for m, how in LAUNCH[pin_set()].items() if isinstance(how, Launch)
        }
    )


def main() -> int:
    """``python -m verl_consistency.entrypoints.overrides`` prints the table as JSON (manifests' tests)."""
    print(Table().model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
