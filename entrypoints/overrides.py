"""THE table of what a collection run needs from verl, per mode: env, overrides, defaults, refusals.

Everything that decides how ``verl-consistency run`` launches verl lives here as data, so that
the CLI, the k8s manifests' tests and the image defaults read one table and cannot drift.
Adding a required override is one line in :data:`REQUIRED`.

Every key was checked against verl 0.8.0's real Hydra config
(``python -m verl.trainer.main_ppo --cfg job`` and the fully-async equivalent); the tests in
``tests/entrypoints`` compose both modes again from the command this table produces.

Three kinds of rows:

* :data:`ENV` — environment variables. They are set on the verl driver *and* passed as
  ``+ray_kwargs.ray_init.runtime_env.env_vars.<NAME>``: verl 0.8.0's ``run_ppo`` hands that
  dict to ``ray.init(runtime_env=...)``, Ray makes it the job's runtime env, and every actor
  verl creates (TaskRunner, the worker groups in ``single_controller/ray/base.py``, the vLLM
  servers in ``vllm_async_server.py``) adds its own ``env_vars`` on top — Ray merges
  ``env_vars`` per key. A variable only in the driver's environment reaches Ray workers only
  when the driver starts a local Ray; on a RayJob (an existing cluster) it does not.
* :data:`REQUIRED` — overrides the data depends on. A user override that contradicts one is refused.
* :data:`DEFAULTS` — what makes a run work out of the box (the generated prompt set, a small
  batch, console logging). The user may override any of them.
* :data:`REFUSALS` — user overrides refused although we do not set the key ourselves.
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

    @property
    def module(self) -> str:
        """The verl entry module this mode wraps."""
        return _MODULES[self]


_MODULES = {
    Mode.HYBRID: "verl.trainer.main_ppo",
    Mode.FULLY_ASYNC: "verl.experimental.fully_async_policy.fully_async_main",
}


class RunKind(StrEnum):
    """What a run is for: a msprobe collection run, or a cheap token-level triage run (``--token-level``)."""

    COLLECTION = "collection"
    TOKEN_LEVEL = "token-level"


ALL_MODES: frozenset[Mode] = frozenset(Mode)
ALL_PHASES: frozenset[DumpPhase] = frozenset(DumpPhase)
COLLECTION_ONLY: frozenset[RunKind] = frozenset({RunKind.COLLECTION})
TOKEN_LEVEL_ONLY: frozenset[RunKind] = frozenset({RunKind.TOKEN_LEVEL})
ALL_KINDS: frozenset[RunKind] = frozenset(RunKind)

RUNTIME_ENV_PREFIX = "ray_kwargs.ray_init.runtime_env.env_vars"
"""Where verl 0.8.0 takes the Ray job's env vars from (``verl/trainer/main_ppo.py`` ``run_ppo``)."""

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
    why: str

    def applies(self, mode: Mode, phase: DumpPhase, kind: RunKind = RunKind.COLLECTION) -> bool:
        return mode in self.modes and phase in self.phases and kind in self.kinds


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
        modes=frozenset({Mode.FULLY_ASYNC}),
        why="the recipe turns TorchDynamo off for fully async: compiled regions bypass msprobe's "
        "module hooks",
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
        "it skips rollout-correction IS/RS on prompt-only batches (verl 0.8.0 ray_trainer.py)",
    ),
    Override(
        key="actor_rollout_ref.hybrid_engine",
        value=False,
        modes=frozenset({Mode.FULLY_ASYNC}),
        kinds=ALL_KINDS,
        why="fully async runs rollout and training on separate pools; verl asserts "
        "hybrid_engine is False there",
    ),
    Override(
        key="data.shuffle",
        value=False,
        modes=frozenset({Mode.FULLY_ASYNC}),
        why="with shuffle on and no data.seed every run draws a different prompt order, so two "
        "collection runs cannot be compared step for step (recipe setting)",
    ),
    Override(
        key="actor_rollout_ref.rollout.calculate_log_probs",
        value=True,
        modes=frozenset({Mode.FULLY_ASYNC}),
        why="the fully-async rollouter asserts it ('must rollout calculate log_probs')",
    ),
    Override(
        key="actor_rollout_ref.rollout.calculate_log_probs",
        value=True,
        modes=frozenset({Mode.HYBRID}),
        why="vLLM's log-probs of the first response token are the vLLM side of the output row "
        "(the PROMPTS_ONLY trim keeps them for the trainer's next-token record)",
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
)

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
        modes=frozenset({Mode.HYBRID}),
        why="verl's default (1024) exceeds the generated prompt set",
    ),
    Override(
        kinds=ALL_KINDS,
        key="actor_rollout_ref.rollout.n",
        value=2,
        modes=frozenset({Mode.HYBRID}),
        why="GRPO needs more than one response per prompt",
    ),
    Override(
        kinds=ALL_KINDS,
        key="data.train_batch_size",
        value=0,
        modes=frozenset({Mode.FULLY_ASYNC}),
        why="fully async draws prompts one by one (data.gen_batch_size=1); recipe setting",
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
        why="...and 4 NPUs roll out",
    ),
    Override(
        kinds=ALL_KINDS,
        key="rollout.total_rollout_steps",
        value=64,
        modes=frozenset({Mode.FULLY_ASYNC}),
        why="as many prompts as the generated prompt set holds",
    ),
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
        allowed=(-1, 0),
        why="validation during training runs vLLM generations that have no training "
        "counterpart and use up msprobe's dump steps; keep trainer.test_freq=-1",
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


def env_rows(mode: Mode, phase: DumpPhase, kind: RunKind = _C) -> list[EnvVar]:
    return [row for row in ENV if row.applies(mode, phase, kind)]


def required_rows(mode: Mode, phase: DumpPhase, kind: RunKind = _C) -> list[Override]:
    """REQUIRED rows for this run, plus one ``+ray_kwargs...env_vars.<NAME>`` row per Ray env var."""
    rows = [row for row in REQUIRED if row.applies(mode, phase, kind)]
    for var in env_rows(mode, phase, kind):
        if not var.driver_only:
            rows.append(
                Override(
                    key=f"{RUNTIME_ENV_PREFIX}.{var.name}",
                    value=var.value,
                    add=True,
                    modes=var.modes,
                    phases=var.phases,
                    kinds=var.kinds,
                    why=f"environment variable {var.name} must reach the Ray workers: {var.why}",
                )
            )
    return rows


def default_rows(mode: Mode, phase: DumpPhase, kind: RunKind = _C) -> list[Override]:
    return [row for row in DEFAULTS if row.applies(mode, phase, kind)]


def refusal_rows(mode: Mode, phase: DumpPhase, kind: RunKind = _C) -> list[Refusal]:
    return [row for row in REFUSALS if row.applies(mode, phase, kind)]


def spell(row: Override, run: Mapping[str, str]) -> str:
    return f"{'+' if row.add else ''}{row.key}={hydra_value(resolve(row.value, run))}"


def environment(mode: Mode, phase: DumpPhase, run: Mapping[str, str], kind: RunKind = _C) -> dict[str, str]:
    return {row.name: str(resolve(row.value, run)) for row in env_rows(mode, phase, kind)}


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
) -> list[Conflict]:
    """Every user override that would spoil the data, each with a message naming it and why."""
    conflicts: list[Conflict] = []
    required = required_rows(mode, phase, kind)
    refusals = refusal_rows(mode, phase, kind)
    for ov in user:
        message = _conflict_with_required(ov, required, run) or _refused(ov, refusals)
        if message is not None:
            conflicts.append(Conflict(override=ov.text, message=f"refused `{ov.text}`: {message}"))
    return conflicts


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
) -> list[EnvConflict]:
    """Variables in the caller's environment that disagree with what the run sets."""
    out = []
    for row in env_rows(mode, phase, kind):
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
    """The whole table as one JSON document (``verl-consistency run --table``), for the k8s tests."""

    env: tuple[EnvVar, ...] = ENV
    required: tuple[Override, ...] = REQUIRED
    defaults: tuple[Override, ...] = DEFAULTS
    refusals: tuple[Refusal, ...] = REFUSALS
    modules: dict[str, str] = Field(default_factory=lambda: {m.value: m.module for m in Mode})


def main() -> int:
    """``python -m verl_consistency.entrypoints.overrides`` prints the table as JSON (manifests' tests)."""
    print(Table().model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
