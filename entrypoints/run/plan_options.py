"""What ``verl-consistency run`` is given, before anything is checked: :class:`PlanOptions`.

The options of the command (and of every test and manifest that builds a plan) as one frozen
object, so that :func:`.plan.build_plan` takes a mode and this rather than seventeen keyword
arguments, and the command fills it from its own parameters (:func:`..options.options_from`).
Here too: the vocabulary the options use (:class:`Device`), the error every refusal raises
(:class:`PlanError`), and how the command's extra arguments split into Hydra overrides and the
Hydra flags passed through (:func:`split_extra_args`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from verl_consistency.contracts import capture as capture_mod
from verl_consistency.contracts.env import DumpPhase
from verl_consistency.entrypoints.msprobe.config import Level, Task

DEFAULT_MODEL = "/models/Qwen2.5-0.5B-Instruct"

HYDRA_FLAGS: dict[str, tuple[str, ...] | None] = {
    "--cfg": ("job", "hydra", "all"),
    "-c": ("job", "hydra", "all"),
    "--resolve": None,
}
"""Hydra flags passed through to verl: only the print-the-config ones (they start no training)."""


class Device(StrEnum):
    """The accelerator of the cluster. The run's dump hooks and layout are the same on both."""

    NPU = "npu"
    CUDA = "cuda"


DEVICE_KEY = "trainer.device"
"""verl 0.8.0's device setting: ``cuda`` by default; ``auto_set_device`` switches it to ``npu``
when torch_npu finds an NPU. ``--device cuda`` pins it, so that a CUDA run never depends on that
probe; ``--device npu`` (the default) leaves it to verl, as before."""


class PhaseChoice(StrEnum):
    """``--phase``: a training phase, or ``auto`` (the default) to let the run choose.

    ``auto`` is ``log_prob``, except in a ride-along run with bypass mode in force, where the
    old-log-prob forward never runs and the run dumps ``update_actor`` (:mod:`.bypass`). A value
    of its own, so that the RayJob's entrypoint can spell the default (``--phase auto``).
    """

    AUTO = "auto"
    LOG_PROB = DumpPhase.LOG_PROB.value
    UPDATE_ACTOR = DumpPhase.UPDATE_ACTOR.value
    ALL = DumpPhase.ALL.value

    def dump_phase(self) -> DumpPhase | None:
        """The phase chosen, or None for ``auto``."""
        return None if self is PhaseChoice.AUTO else DumpPhase(self.value)


class PlanError(ValueError):
    """Bad input. ``messages`` holds one line per problem; the CLI exits with code 2."""

    def __init__(self, messages: Sequence[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = list(messages)


@dataclass(frozen=True)
class PlanOptions:
    """:func:`.plan.build_plan`'s input as given: ``verl-consistency run``'s options and overrides.

    Defaults are the command's. ``environ`` is the caller's environment (checked for variables
    that would spoil the data; ``os.environ`` unless a test gives its own), ``python`` the
    interpreter verl runs under (this one unless given), ``extra_args`` the command's arguments
    after its options: verl overrides and pass-through Hydra flags.
    """

    dump_root: str | os.PathLike[str]
    run_id: str
    phase: DumpPhase | None = None
    """The phase given (``--phase``, ``DUMP_PHASE``); None: the run chooses (:mod:`.bypass`)."""
    capture: str = capture_mod.RUN_DEFAULT
    task: Task | None = None
    level: Level = Level.L0
    steps: str | None = None
    ranks: str | None = None
    modules: str | None = None
    data_mode: str | None = None
    model: str | None = None
    extra_args: Sequence[str] = ()
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    python: str | None = None
    token_level: bool = False
    prompts_only: bool = False
    """``--prompts-only``: the recipe (``PROMPTS_ONLY=1``) instead of a ride-along collection."""
    device: Device = Device.NPU


def split_extra_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate Hydra overrides from the Hydra flags we pass through; refuse other options."""
    overrides: list[str] = []
    flags: list[str] = []
    problems: list[str] = []
    it = iter(args)
    for arg in it:
        if arg == "--":
            continue
        if arg.startswith("-"):
            name, eq, inline = arg.partition("=")
            if name not in HYDRA_FLAGS:
                problems.append(
                    f"unknown option {arg!r}: see `verl-consistency run --help`; verl overrides "
                    "are written key=value"
                )
                continue
            choices = HYDRA_FLAGS[name]
            if choices is None:
                flags.append(name)
                continue
            value = inline if eq else next(it, "")
            if value not in choices:
                problems.append(f"{name} takes one of {', '.join(choices)}, got {value!r}")
                continue
            flags.extend([name, value])
        else:
            overrides.append(arg)
    if problems:
        raise PlanError(problems)
    return overrides, flags
