"""The two msprobe configs of a run (inference side, training side), from one small option set.

The model mirrors what mindstudio-probe 26.2.0 reads (``msprobe/core/dump/common_config.py``
``CommonConfig``/``BaseConfig`` and ``msprobe/pytorch/dump/pt_config.py``): the common keys,
then one section named after the task. Values msprobe would reject are rejected here first, so
that a bad ``--steps`` fails before a cluster is started and not inside a vLLM worker.

Both sides get the same ``list`` and ``data_mode``, so the two dumps hold the same modules and
``msprobe compare`` finds a counterpart for each. When the run captures a fraction of requests,
the rollout config is written through ``msprobe_scope.scoped_msprobe_config``: it carries the
sentinel ``request_id`` that the vLLM dispatch hook requires at start-up (and that survives
msprobe's config hot-reload). The training side is not scoped: each of its micro batches holds
one sample already.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from verl_consistency.contracts import msprobe_scope
from verl_consistency.contracts.atomic import write_json_atomic
from verl_consistency.contracts.layout import RunLayout

STEP_RANK_MAX = 1_000_000
"""msprobe's ``Const.STEP_RANK_MAXIMUM_VALUE``."""

DataMode = Literal["all", "input", "output", "forward", "backward"]
DATA_MODES: tuple[DataMode, ...] = ("all", "input", "output", "forward", "backward")


def _all_modes() -> list[DataMode]:
    return ["all"]


class Task(StrEnum):
    STATISTICS = "statistics"
    TENSOR = "tensor"


class Level(StrEnum):
    L0 = "L0"
    L1 = "L1"
    MIX = "mix"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    scope: list[str] = Field(default_factory=list)
    list_: list[str] = Field(default_factory=list, alias="list")
    data_mode: list[DataMode] = Field(default_factory=_all_modes)
    request_id: str | None = None
    """msprobe 26.2.0 request scoping; only the rollout config of a capture-fraction run has it."""


class StatisticsSection(_Section):
    tensor_list: list[str] = Field(default_factory=list)
    summary_mode: Literal["statistics", "md5", "xor"] = "statistics"


class TensorSection(_Section):
    pass


class MsprobeConfig(BaseModel):
    """One msprobe config json, as ``PrecisionDebugger(config_path=...)`` reads it."""

    model_config = ConfigDict(extra="forbid")
    task: Task
    dump_path: str
    rank: list[int | str] = Field(default_factory=list)
    step: list[int | str] = Field(default_factory=list)
    level: Level
    async_dump: bool = False
    statistics: StatisticsSection | None = None
    tensor: TensorSection | None = None

    def to_json(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_selection(text: str | None, what: Literal["step", "rank"]) -> list[int | str]:
    """``"0,2,5-7"`` → ``[0, 2, "5-7"]`` (msprobe's own spelling); empty or ``all`` → ``[]`` (all)."""
    if text is None or text.strip() in ("", "all"):
        return []
    out: list[int | str] = []
    for part in (p.strip() for p in text.split(",")):
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"--{what}s {text!r}: {part!r} is not N or N-M (e.g. 0,2,5-7)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo > hi or hi > STEP_RANK_MAX:
            raise ValueError(f"--{what}s {text!r}: {part!r} must satisfy N <= M <= {STEP_RANK_MAX}")
        out.append(lo if m.group(2) is None else part)
    return out


def parse_modules(text: str | None) -> list[str] | None:
    """``--modules``: ``"Attention.forward,MLP.forward"`` → msprobe ``list``; ``all`` → ``[]``.

    None (option not given) stays None: the task's default applies (:func:`default_modules`).
    """
    if text is None:
        return None
    if text.strip() == "all":
        return []
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise ValueError(f"--modules {text!r}: an empty name; give comma-separated names or 'all'")
    return parts


def parse_data_mode(text: str | None) -> list[DataMode] | None:
    """``--data-mode``: ``"forward,output"`` → msprobe ``data_mode``, checked as msprobe checks it."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    bad = [p for p in parts if p not in DATA_MODES]
    if bad:
        raise ValueError(f"--data-mode {text!r}: {', '.join(map(repr, bad))} not in {', '.join(DATA_MODES)}")
    if "all" in parts and len(parts) != 1:
        raise ValueError(f"--data-mode {text!r}: 'all' cannot be combined with other modes")
    if len(set(parts)) != len(parts):
        raise ValueError(f"--data-mode {text!r}: a mode is repeated")
    return parts  # type: ignore[return-value]  # each checked against DATA_MODES above


def default_modules(task: Task, level: Level) -> list[str]:
    """msprobe ``list`` when ``--modules`` is not given.

    Tensor mode at L0: attention and MLP blocks (``msprobe_scope.BLOCK_TENSOR_LIST``); the full
    module tree would save every leaf module's weights on every dumped step (about 1 GB for a
    0.5B model, ``bench/README-selective.md``). L1/mix ``list`` entries name APIs, so there is no
    module default there. Statistics mode: everything (its cost is per call, not per token).
    """
    if task is Task.TENSOR and level is Level.L0:
        return list(msprobe_scope.BLOCK_TENSOR_LIST)
    return []


def default_data_mode(task: Task) -> list[DataMode]:
    """msprobe ``data_mode`` when ``--data-mode`` is not given: forward outputs for tensor mode."""
    if task is Task.TENSOR:
        return list(msprobe_scope.TENSOR_DATA_MODE)
    return ["all"]


class DumpOptions(BaseModel):
    """The one option set both configs come from."""

    model_config = ConfigDict(frozen=True)
    task: Task = Task.STATISTICS
    level: Level = Level.L0
    steps: list[int | str] = Field(default_factory=list)
    ranks: list[int | str] = Field(default_factory=list)
    modules: list[str] = Field(default_factory=list)
    """msprobe ``list`` (module or API names, matched as substrings); empty = everything."""
    data_mode: list[DataMode] = Field(default_factory=_all_modes)
    request_scoped: bool = False
    """Capture a fraction: scope the rollout config to the captured request (vLLM side only)."""

    @field_validator("steps", "ranks")
    @classmethod
    def _bounded(cls, value: list[int | str]) -> list[int | str]:
        for item in value:
            if isinstance(item, int) and not 0 <= item <= STEP_RANK_MAX:
                raise ValueError(f"{item} is outside 0..{STEP_RANK_MAX}")
        return value

    def config(self, dump_path: Path) -> MsprobeConfig:
        common = {"list": list(self.modules), "data_mode": list(self.data_mode)}
        section = (
            {"statistics": StatisticsSection.model_validate(common)}
            if self.task is Task.STATISTICS
            else {"tensor": TensorSection.model_validate(common)}
        )
        return MsprobeConfig(
            task=self.task,
            dump_path=str(dump_path),
            rank=list(self.ranks),
            step=list(self.steps),
            level=self.level,
            **section,
        )


class RunConfigs(BaseModel):
    rollout: MsprobeConfig
    actor: MsprobeConfig


def build(layout: RunLayout, options: DumpOptions) -> RunConfigs:
    """The inference side dumps under ``rollout/``, the training side under ``actor/``.

    The patched upstream appends ``<pid>`` to each (see ``verl_consistency.contracts.layout``). With
    ``request_scoped`` the rollout config goes through ``msprobe_scope.scoped_msprobe_config``,
    which raises ``ValueError`` for a task/level msprobe cannot scope.
    """
    rollout = options.config(layout.rollout_dir)
    if options.request_scoped:
        rollout = MsprobeConfig.model_validate(msprobe_scope.scoped_msprobe_config(rollout.to_json()))
    return RunConfigs(rollout=rollout, actor=options.config(layout.actor_dir))


def write(layout: RunLayout, configs: RunConfigs) -> None:
    write_json_atomic(layout.rollout_config, configs.rollout.to_json())
    write_json_atomic(layout.actor_config, configs.actor.to_json())


def write_single_node(layout: RunLayout, task: Task, *, request_scoped: bool) -> None:
    """The run folder and both configs of a single-node run (demo, ``check``, the benches).

    L0 modules at ``task`` on both sides, every step and rank: such a run is one prompt set
    through each engine once, so there is nothing to select. ``request_scoped`` is the capture
    rule's (every ``fraction:``/``prompts:`` rule; not ``all``).
    """
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    write(layout, build(layout, DumpOptions(task=task, level=Level.L0, request_scoped=request_scoped)))
