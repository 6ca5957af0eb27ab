"""THE table of what a collection run needs from verl, per pin set and mode, and the engine that applies it.

Everything that decides how ``verl-consistency run`` launches verl is data, so that the CLI,
the k8s manifests' tests and the image defaults read one table and cannot drift. The data lives
in its own modules, read through this one (every name below is importable from here):

* :mod:`.run_modes` — the modes, the run kinds, and :data:`LAUNCH`: per set, which verl module
  each mode runs and, on verl 0.9's V1 trainer, which ``trainer.v1.trainer_mode``;
* :mod:`.override_schema` — the row types and their scopes;
* :mod:`.override_rows` — :data:`ENV` and :data:`REQUIRED`: what the run sets and the data depends on;
* :mod:`.override_defaults` — :data:`DEFAULTS`: what the run sets and the user may override;
* :mod:`.override_refusals` — :data:`REFUSALS` and :data:`MATCHED`: what it refuses but leaves to verl;
* :mod:`.hydra_syntax` — how a value is spelt for Hydra and how a user's override is read.

This module composes the rows for one run (:func:`required_rows`, :func:`environment`, ...)
and finds the user's overrides and environment variables that would spoil the data
(:func:`find_conflicts`, :func:`find_env_conflicts`). Adding a required override is one row
in ``override_rows.REQUIRED``.

There is one table for every pin set of ``patches/pins.toml``: a row names the sets it applies
to (``sets``, every set unless it says otherwise), so a row that both verl releases
need is written once, and only what differs between them is a row of its own. The set in force
is ``pins.load().set.name`` (``VERL_CONSISTENCY_PIN_SET``).

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

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, Field

from verl_consistency.contracts.env import DumpPhase
from verl_consistency.entrypoints.run.hydra_syntax import UserOverride, hydra_value, parse_user_overrides
from verl_consistency.entrypoints.run.modes import (
    CURRENT,
    LAUNCH,
    MAIN_PPO,
    NEXT,
    PIN_SETS,
    Launch,
    Mode,
    RunKind,
    Unsupported,
    launch,
    pin_set,
)
from verl_consistency.entrypoints.run.override_defaults import DEFAULTS
from verl_consistency.entrypoints.run.override_refusals import MATCHED, REFUSALS
from verl_consistency.entrypoints.run.override_rows import ENV, REQUIRED
from verl_consistency.entrypoints.run.override_schema import (
    ALL_KINDS,
    ALL_MODES,
    ALL_PHASES,
    ASYNC_MODES,
    COLLECTION_ONLY,
    MODEL_PATH_KEY,
    MODEL_SHORTCUT,
    NOT_RIDE_ALONG,
    ONLY_CURRENT,
    ONLY_NEXT,
    PROMPTS_ONLY_KIND,
    RIDE_ALONG_ONLY,
    RUNTIME_ENV_PREFIX,
    SHARED_POOL_MODES,
    TOKEN_LEVEL_ONLY,
    UPDATE_PHASES,
    EnvVar,
    FromRun,
    Matched,
    Override,
    Refusal,
    RunField,
    Value,
)

# The table's public face: the rows, their vocabulary and the engine, importable from here.
__all__ = [
    "ALL_KINDS",
    "ALL_MODES",
    "ALL_PHASES",
    "ASYNC_MODES",
    "COLLECTION_ONLY",
    "CURRENT",
    "DEFAULTS",
    "ENV",
    "LAUNCH",
    "MAIN_PPO",
    "MATCHED",
    "MODEL_PATH_KEY",
    "MODEL_SHORTCUT",
    "NEXT",
    "NOT_RIDE_ALONG",
    "ONLY_CURRENT",
    "ONLY_NEXT",
    "PIN_SETS",
    "PROMPTS_ONLY_KIND",
    "REFUSALS",
    "REQUIRED",
    "RIDE_ALONG_ONLY",
    "RUNTIME_ENV_PREFIX",
    "SHARED_POOL_MODES",
    "TOKEN_LEVEL_ONLY",
    "UPDATE_PHASES",
    "Conflict",
    "EnvConflict",
    "EnvVar",
    "FromRun",
    "Launch",
    "Matched",
    "Mode",
    "Override",
    "Refusal",
    "RunField",
    "RunKind",
    "Table",
    "Unsupported",
    "UserOverride",
    "Value",
    "environment",
    "find_conflicts",
    "find_env_conflicts",
    "hydra_value",
    "launch",
    "main",
    "parse_user_overrides",
    "pin_set",
    "required_rows",
    "resolve",
    "rows_for",
    "spell",
]

# --------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------


def resolve(value: Value, run: Mapping[str, str]) -> Any:
    """Replace every :class:`FromRun` in ``value`` by the run's value."""
    if isinstance(value, FromRun):
        return run[value.run]
    if isinstance(value, Mapping):
        return {k: resolve(v, run) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, run) for v in value]
    return value


_C = RunKind.RIDE_ALONG


class _Scoped(Protocol):
    """A row of any kind: it says which modes, phases, run kinds and pin sets it applies to."""

    def applies(self, mode: Mode, phase: DumpPhase, kind: RunKind, set_name: str) -> bool: ...


R = TypeVar("R", bound=_Scoped)


def rows_for(
    rows: Iterable[R], mode: Mode, phase: DumpPhase, kind: RunKind = _C, set_name: str | None = None
) -> list[R]:
    """The rows of one table (:data:`ENV`, :data:`DEFAULTS`, :data:`REFUSALS`, :data:`MATCHED`, ...)
    that apply to this run: its mode, phase, run kind and pin set (the set in force unless named)."""
    name = set_name or pin_set()
    return [row for row in rows if row.applies(mode, phase, kind, name)]


def required_rows(
    mode: Mode, phase: DumpPhase, kind: RunKind = _C, set_name: str | None = None
) -> list[Override]:
    """REQUIRED rows for this run, plus one ``+ray_kwargs...env_vars.<NAME>`` row per Ray env var."""
    name = set_name or pin_set()
    rows = rows_for(REQUIRED, mode, phase, kind, name)
    for var in rows_for(ENV, mode, phase, kind, name):
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


def spell(row: Override, run: Mapping[str, str]) -> str:
    return f"{'+' if row.add else ''}{row.key}={hydra_value(resolve(row.value, run))}"


def environment(
    mode: Mode, phase: DumpPhase, run: Mapping[str, str], kind: RunKind = _C, set_name: str | None = None
) -> dict[str, str]:
    return {row.name: str(resolve(row.value, run)) for row in rows_for(ENV, mode, phase, kind, set_name)}


# --------------------------------------------------------------------------------------------
# Conflicts
# --------------------------------------------------------------------------------------------


class Conflict(BaseModel):
    override: str
    message: str


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
    required: list[Override] | None = None,
) -> list[Conflict]:
    """Every user override that would spoil the data, each with a message naming it and why.

    ``required``: the run's required rows when the plan has adjusted them (a Megatron run's
    ``entrypoints.run.megatron.required``); :func:`required_rows` otherwise."""
    conflicts: list[Conflict] = []
    if required is None:
        required = required_rows(mode, phase, kind, set_name)
    refusals = rows_for(REFUSALS, mode, phase, kind, set_name)
    user = list(user)
    for ov in user:
        message = _conflict_with_required(ov, required, run) or _refused(ov, refusals)
        if message is not None:
            conflicts.append(Conflict(override=ov.text, message=f"refused `{ov.text}`: {message}"))
    composed = [*rows_for(DEFAULTS, mode, phase, kind, set_name), *required]
    for row in rows_for(MATCHED, mode, phase, kind, set_name):
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
    for row in rows_for(ENV, mode, phase, kind, set_name):
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
    """``python -m verl_consistency.entrypoints.run.overrides`` prints the table as JSON.

    The manifests' tests read it.
    """
    print(Table().model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
