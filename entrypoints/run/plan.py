"""From the options of ``verl-consistency run`` to the exact verl command: a pure function.

No file is written and nothing is started here, so ``--dry-run``, the real run and the k8s
manifests' tests all see the same plan for the same settings.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from verl_consistency.contracts import capture as capture_mod
from verl_consistency.contracts import env, token_records
from verl_consistency.contracts.env import DUMP_PHASE, DumpPhase
from verl_consistency.contracts.layout import (
    ACTOR_CONFIG,
    ACTOR_DIR,
    CAPTURE_PROMPTS,
    REWARD_FN,
    ROLLOUT_CONFIG,
    ROLLOUT_DIR,
    RUN_MANIFEST,
    TRAIN_DATA,
    RunLayout,
)
from verl_consistency.entrypoints.msprobe.config import (
    DataMode,
    DumpOptions,
    Level,
    RunConfigs,
    Task,
    build,
    default_data_mode,
    default_modules,
    parse_data_mode,
    parse_modules,
    parse_selection,
)
from verl_consistency.entrypoints.run import bypass, megatron, override_checks
from verl_consistency.entrypoints.run import overrides as table
from verl_consistency.entrypoints.run.overrides import Conflict, EnvConflict, Mode, RunKind, UserOverride
from verl_consistency.entrypoints.run.plan_options import (
    DEFAULT_MODEL,
    DEVICE_KEY,
    Device,
    PlanError,
    PlanOptions,
    split_extra_args,
)


class RunPlan(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    mode: Mode
    pin_set: str
    """The pin set in force when the plan was built (``VERL_CONSISTENCY_PIN_SET``): it picks the table."""
    trainer_mode: str | None = None
    """verl 0.9's ``trainer.v1.trainer_mode`` for this mode; None on verl 0.8.0 (the current set)."""
    kind: RunKind = RunKind.RIDE_ALONG
    """ride-along (the default), prompts-only (``--prompts-only``) or token-level (``--token-level``)."""
    run_id: str
    device: Device = Device.NPU
    dump_root: str
    run_dir: str
    phase: DumpPhase
    phase_reason: str | None = None
    """Why the run chose ``phase`` itself (bypass mode in force); None when given, or log_prob."""
    capture: str
    capture_source: str | None = None
    """``--capture prompts:FILE``: the user's FILE, copied to ``layout.CAPTURE_PROMPTS`` by the run."""
    dump: DumpOptions
    python: str
    module: str
    env: dict[str, str]
    overrides: list[str]
    """Defaults the user did not override, then every required override, then the user's."""
    user_overrides: list[str]
    hydra_flags: list[str]
    invocation: list[str]
    msprobe: RunConfigs
    paths: dict[str, str]

    @property
    def layout(self) -> RunLayout:
        return RunLayout(Path(self.dump_root), self.run_id)

    @property
    def argv(self) -> list[str]:
        return [self.python, "-m", self.module, *self.overrides, *self.hydra_flags]

    def child_env(self, base: Mapping[str, str]) -> dict[str, str]:
        return {**base, **self.env}

    def as_json(self) -> dict[str, object]:
        return {
            "mode": self.mode.value,
            "kind": self.kind.manifest_kind,
            "collection": self.kind.collection,
            "pin_set": self.pin_set,
            "trainer_mode": self.trainer_mode,
            "run_id": self.run_id,
            "device": self.device.value,
            "dump_root": self.dump_root,
            "run_dir": self.run_dir,
            "phase": self.phase.value,
            "phase_reason": self.phase_reason,
            "capture": self.capture,
            "task": self.dump.task.value,
            "level": self.dump.level.value,
            "steps": self.dump.steps,
            "ranks": self.dump.ranks,
            "modules": self.dump.modules,
            "data_mode": self.dump.data_mode,
            "python": self.python,
            "module": self.module,
            "env": self.env,
            "overrides": self.overrides,
            "user_overrides": self.user_overrides,
            "argv": self.argv,
            "invocation": self.invocation,
            "paths": self.paths,
            "msprobe": self.msprobe.model_dump(mode="json", by_alias=True, exclude_none=True),
        }


def _run_values(layout: RunLayout, phase: DumpPhase, capture: str) -> dict[str, str]:
    return {
        "run_dir": str(layout.run_dir),
        "run_id": layout.run_id,
        "rollout_config": str(layout.rollout_config),
        "actor_config": str(layout.actor_config),
        "train_data": str(layout.train_data),
        "reward_fn": str(layout.reward_fn),
        "dump_phase": phase.value,
        "capture": capture,
    }


def _expand_shortcut(text: str) -> str:
    key, eq, value = text.partition("=")
    if eq and key == table.MODEL_SHORTCUT:
        return f"{table.MODEL_PATH_KEY}={value}"
    return text


def _touches(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


@dataclass(frozen=True)
class _Checked:
    """What :func:`_check` established, every value valid: what :func:`_compose` needs beyond the options."""

    kind: RunKind
    set_name: str
    launch: table.Launch
    phase: bypass.Phase
    """The phase dumped (the user's, else the run's choice: :mod:`.bypass`)."""
    layout: RunLayout
    rule: capture_mod.CaptureRule
    capture_source: str | None
    dump: DumpOptions
    user_texts: list[str]
    """The user's overrides as given (``model=`` expanded), in their order."""
    flags: list[str]
    parsed: list[UserOverride]
    run: dict[str, str]
    required: list[table.Override]
    """The run's required rows, as the user's overrides adjust them (:func:`.megatron.required`)."""


def build_plan(mode: Mode, options: PlanOptions) -> RunPlan:
    """Check everything and return the plan, or raise :class:`PlanError` listing every problem.

    ``options.token_level``: a triage run (``--token-level``): normal responses, no msprobe dump,
    one token record per response; the msprobe options of a collection run are refused with it.
    Two steps: :func:`_check` holds every refusal, :func:`_compose` builds the plan from what passed.
    """
    return _compose(mode, options, _check(mode, options))


def _check(mode: Mode, o: PlanOptions) -> _Checked:
    """Every refusal, each problem one line; raise :class:`PlanError` unless all pass.

    Most problems are collected so that one try shows them all; a problem that leaves nothing
    to check after it (an unknown mode on this set, a bad run id, bad Hydra syntax) ends it early.
    """
    problems: list[str] = []
    kind = _kind(o, problems)
    set_name = table.pin_set()
    try:
        launch = table.launch(mode, set_name)
    except ValueError as exc:
        raise PlanError([str(exc)]) from None
    if o.token_level:
        problems += _collection_options_given(o)
    try:
        layout = RunLayout(Path(o.dump_root), o.run_id)
    except ValueError as exc:
        raise PlanError([str(exc)]) from None
    if not Path(o.dump_root).is_absolute():
        problems.append(f"--dump-root {o.dump_root!s}: must be an absolute path (every Ray worker reads it)")
    rule, capture_source = _capture_rule(o.capture, layout, problems)
    dump = _dump_options(o, rule, problems)

    user_texts, flags = split_extra_args(o.extra_args)
    user_texts = [_expand_shortcut(t) for t in user_texts]
    try:
        parsed = table.parse_user_overrides(user_texts)
    except ValueError as exc:
        raise PlanError([*problems, str(exc)]) from None
    phase = bypass.choose(o.phase, kind, bypass.in_force(mode, set_name, parsed))
    problems += [phase.problem] if phase.problem else []
    run = _run_values(layout, phase.phase, rule.spec())
    required = megatron.required(table.required_rows(mode, phase.phase, kind, set_name), parsed)
    problems += _conflicts(mode, o, phase.phase, parsed, run, kind, set_name, required)
    problems += override_checks.given_twice(parsed) + override_checks.ray_env_not_strings(parsed)
    if problems:
        raise PlanError(problems)
    _check_clashes(o, parsed)
    return _Checked(
        kind=kind,
        set_name=set_name,
        launch=launch,
        phase=phase,
        layout=layout,
        rule=rule,
        capture_source=capture_source,
        dump=dump,
        user_texts=user_texts,
        flags=flags,
        parsed=parsed,
        run=run,
        required=required,
    )


def _kind(o: PlanOptions, problems: list[str]) -> RunKind:
    """The run kind the options ask for; ``--prompts-only`` with ``--token-level`` is a problem."""
    if o.token_level and o.prompts_only:
        problems.append(
            "--prompts-only and --token-level: a token-level run trains on normal responses and "
            "dumps nothing with msprobe, so there is nothing to trim; drop one of them"
        )
    if o.token_level:
        return RunKind.TOKEN_LEVEL
    return RunKind.PROMPTS_ONLY if o.prompts_only else RunKind.RIDE_ALONG


def _collection_options_given(o: PlanOptions) -> list[str]:
    """A --token-level run's refusals: the msprobe options of a collection run that were given."""
    given = {
        "--capture": o.capture != capture_mod.RUN_DEFAULT,
        "--phase": o.phase not in (None, DumpPhase.LOG_PROB),
        "--task": o.task is not None,
        "--level": o.level is not Level.L0,
        "--steps": o.steps is not None,
        "--ranks": o.ranks is not None,
        "--modules": o.modules is not None,
        "--data-mode": o.data_mode is not None,
    }
    return [
        f"{name} chooses what a collection run dumps with msprobe; a --token-level run dumps "
        "nothing (leave it out, or drop --token-level)"
        for name, on in given.items()
        if on
    ]


def _capture_rule(
    capture: str, layout: RunLayout, problems: list[str]
) -> tuple[capture_mod.CaptureRule, str | None]:
    """The --capture rule, and for ``prompts:FILE`` the user's FILE (the rule reads the run's copy)."""
    try:
        rule = capture_mod.parse(capture)
    except ValueError as exc:
        problems.append(f"--capture: {exc}")
        rule = capture_mod.CaptureRule()
    if rule.prompts is not None and rule.path is not None:
        source = str(Path(rule.path).resolve())
        return capture_mod.CaptureRule(
            prompts=rule.prompts, path=str(layout.run_dir / CAPTURE_PROMPTS)
        ), source
    return rule, None


def _dump_options(o: PlanOptions, rule: capture_mod.CaptureRule, problems: list[str]) -> DumpOptions:
    """What msprobe dumps on both sides; a bad option adds its problem and keeps the default."""
    task = o.task
    if task is None:
        # tensor mode's bytes grow with every captured prompt's length: a sample, not coverage
        task = Task.TENSOR if rule.is_sample else Task.STATISTICS
    module_list: list[str] | None = None
    modes: list[DataMode] | None = None
    try:
        module_list = parse_modules(o.modules)
    except ValueError as exc:
        problems.append(str(exc))
    try:
        modes = parse_data_mode(o.data_mode)
    except ValueError as exc:
        problems.append(str(exc))
    what = DumpOptions(
        task=task,
        level=o.level,
        modules=default_modules(task, o.level) if module_list is None else module_list,
        data_mode=default_data_mode(task) if modes is None else modes,
        request_scoped=not rule.is_all,
    )
    try:
        selection = {"steps": parse_selection(o.steps, "step"), "ranks": parse_selection(o.ranks, "rank")}
        return DumpOptions.model_validate({**what.model_dump(), **selection})
    except ValueError as exc:
        problems.append(str(exc))
        return what


def _conflicts(
    mode: Mode,
    o: PlanOptions,
    phase: DumpPhase,
    parsed: list[UserOverride],
    run: dict[str, str],
    kind: RunKind,
    set_name: str,
    required: list[table.Override],
) -> list[str]:
    """The user's overrides and environment that would spoil the data, and a bad token threshold."""
    conflicts: list[Conflict] = table.find_conflicts(parsed, mode, phase, run, kind, set_name, required)
    # DUMP_PHASE and VERL_CONSISTENCY_CAPTURE are the sources of --phase and --capture: the option wins.
    option_sources = {DUMP_PHASE, env.CAPTURE}
    caller_env = {k: v for k, v in o.environ.items() if k not in option_sources}
    env_conflicts: list[EnvConflict] = table.find_env_conflicts(caller_env, mode, phase, run, kind, set_name)
    problems = [c.message for c in conflicts] + [c.message for c in env_conflicts]
    trim = o.environ.get(env.PROMPTS_ONLY)
    if kind is RunKind.RIDE_ALONG and trim not in (None, "", "0"):
        problems.append(
            f"refused environment {env.PROMPTS_ONLY}={trim!r}: a ride-along run (the default) trains "
            "on the job's full responses, and the trim would reach the driver (and a local Ray's "
            f"workers) although run.json says ride-along. Pass --prompts-only for the recipe, or unset "
            f"{env.PROMPTS_ONLY}"
        )
    problems += megatron.refusals(parsed, kind)
    if o.environ.get(env.TOKEN_THRESHOLD):
        try:
            token_records.threshold(o.environ)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


def _check_clashes(o: PlanOptions, parsed: list[UserOverride]) -> None:
    """An option and an override that both set one thing (--device, --model): keep one."""
    if o.device is Device.CUDA:
        device_given = [ov for ov in parsed if ov.key == DEVICE_KEY]
        if any(str(ov.value) != Device.CUDA.value for ov in device_given):
            clash = device_given[0].text
            raise PlanError([f"--device cuda but {clash} was given: drop one (verl runs on one device)"])
    if o.model is not None and table.MODEL_PATH_KEY in [ov.key for ov in parsed]:
        raise PlanError([f"--model and {table.MODEL_PATH_KEY}=... (or model=...) both given; keep one"])


def _compose(mode: Mode, o: PlanOptions, c: _Checked) -> RunPlan:
    """The plan from checked input: verl's command line, environment, msprobe configs and paths."""
    user_keys = [ov.key for ov in c.parsed]
    device_rows: list[str] = []
    if o.device is Device.CUDA and DEVICE_KEY not in user_keys:
        device_rows = [f"{DEVICE_KEY}={Device.CUDA.value}"]
    model_path = o.model or o.environ.get(env.MODEL) or DEFAULT_MODEL
    model_rows: list[str] = []
    if table.MODEL_PATH_KEY not in user_keys:
        model_rows = [f"{table.MODEL_PATH_KEY}={table.hydra_value(model_path)}"]

    defaults = [
        table.spell(row, c.run)
        for row in table.rows_for(table.DEFAULTS, mode, c.phase.phase, c.kind, c.set_name)
        if not any(_touches(row.key, k) for k in user_keys)
    ]
    required_keys = {row.key for row in c.required}
    required = [table.spell(row, c.run) for row in c.required]
    # A user override that equals a required one is already in `required`: drop the repeat.
    user_kept = [ov.text for ov in c.parsed if ov.key not in required_keys]

    return RunPlan(
        mode=mode,
        pin_set=c.set_name,
        trainer_mode=c.launch.trainer_mode,
        kind=c.kind,
        run_id=o.run_id,
        device=o.device,
        dump_root=str(o.dump_root),
        run_dir=str(c.layout.run_dir),
        phase=c.phase.phase,
        phase_reason=c.phase.reason,
        capture=c.rule.spec(),
        capture_source=c.capture_source,
        dump=c.dump,
        python=o.python or sys.executable,
        module=c.launch.module,
        env=table.environment(mode, c.phase.phase, c.run, c.kind, c.set_name),
        overrides=[*model_rows, *device_rows, *defaults, *required, *user_kept],
        user_overrides=c.user_texts,
        hydra_flags=c.flags,
        invocation=_invocation(mode, o, c),
        msprobe=build(c.layout, c.dump),
        paths={
            "run_manifest": RUN_MANIFEST,
            "rollout_config": ROLLOUT_CONFIG,
            "actor_config": ACTOR_CONFIG,
            "train_data": TRAIN_DATA,
            "reward_fn": REWARD_FN,
            "rollout_dir": ROLLOUT_DIR,
            "actor_dir": ACTOR_DIR,
        },
    )


def _invocation(mode: Mode, o: PlanOptions, c: _Checked) -> list[str]:
    """The ``verl-consistency run`` command that makes this plan again (``run.json`` keeps it)."""
    invocation = [
        "verl-consistency",
        "run",
        mode.value,
        "--dump-root",
        str(o.dump_root),
        "--run-id",
        o.run_id,
    ]
    if o.token_level:
        invocation += ["--token-level"]
    else:
        shown = f"prompts:{c.capture_source}" if c.capture_source else c.rule.spec()
        phase = "auto" if o.phase is None else o.phase.value
        invocation += [f"--{c.kind.value}", *collection_options(phase, shown, c.dump)]
    if o.steps:
        invocation += ["--steps", o.steps]
    if o.ranks:
        invocation += ["--ranks", o.ranks]
    if o.model is not None:
        invocation += ["--model", o.model]
    if o.device is not Device.NPU:
        invocation += ["--device", o.device.value]
    return [*invocation, *c.user_texts, *c.flags]


def collection_options(phase: str, capture: str, dump: DumpOptions) -> list[str]:
    """The msprobe options of a collection run, as ``--option value`` words (``--phase auto``:
    the run chooses the phase, as when it was left out)."""
    return [
        "--phase",
        phase,
        "--capture",
        capture,
        "--task",
        dump.task.value,
        "--level",
        dump.level.value,
        "--modules",
        ",".join(dump.modules) or "all",
        "--data-mode",
        ",".join(dump.data_mode),
    ]
