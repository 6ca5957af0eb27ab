"""``run.json``: what a collection run was, written into its run folder before verl starts.

The postprocess puts it into the bundle, so that a bundle says which versions produced it,
with which command and which msprobe configs. Versioned: readers check ``schema_version``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from verl_consistency.contracts import __version__, pins
from verl_consistency.contracts.atomic import write_json_atomic

SCHEMA_VERSION = 1

INSTALLED_DISTRIBUTIONS = (
    "verl",
    "vllm",
    "vllm-ascend",
    "mindstudio-probe",
    "torch",
    "torch-npu",
    "ray",
    "transformers",
)
"""Distributions whose installed version is recorded next to the pins (None: not installed here)."""


def installed_versions(names: tuple[str, ...] = INSTALLED_DISTRIBUTIONS) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class MsprobeConfigs(BaseModel):
    rollout: dict[str, Any]
    actor: dict[str, Any]


class StepMetrics(BaseModel):
    """One training step as verl's console logger reported it: did the weights move, and how far apart
    were vLLM and the trainer. ``entrypoints/run/step_metrics.py`` reads it from the driver's output.

    None: verl did not log the metric at that step (another verl, another mode), or logged a
    value that is not finite (named in ``not_finite``: a NaN ``rollout_probs_diff_mean`` is what
    one-token responses give, a NaN grad norm a broken step).
    """

    model_config = ConfigDict(extra="forbid")

    step: int
    """verl's global step (``step:N`` of the console line; the weight version in fully async)."""
    grad_norm: float | None = None
    """``actor/grad_norm``: 0 at every step means that the weights never moved."""
    reward_mean: float | None = None
    """``critic/score/mean``, else ``critic/rewards/mean``."""
    rollout_probs_diff_mean: float | None = None
    """``training/rollout_probs_diff_mean``: verl's mean abs(p_vLLM - p_trainer) over response tokens."""
    rollout_corr_kl: float | None = None
    """``rollout_corr/kl``: verl's KL between vLLM's and the trainer's token distributions."""
    rollout_corr_log_ppl_abs_diff: float | None = None
    """``rollout_corr/log_ppl_abs_diff``."""
    step_time_s: float | None = None
    """``timing_s/step``: the step's wall time in seconds."""
    not_finite: list[str] = Field(default_factory=list)
    """The fields above whose logged value was NaN or infinite (stored as None: JSON has neither)."""


class RunManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    run_id: str
    mode: str
    device: str = "npu"
    """``verl-consistency run --device``: npu (Ascend) or cuda (NVIDIA)."""
    verl_module: str
    trainer_mode: str | None = None
    """verl 0.9's ``trainer.v1.trainer_mode`` the mode ran as; None on a verl without the V1 trainer."""
    bundle_version: str = __version__
    pin_set: str | None = None
    """The pin set of ``pinned`` (``VERL_CONSISTENCY_PIN_SET``); None in a manifest written before sets."""
    pinned: dict[str, str] = Field(default_factory=lambda: pins.load().upstream.model_dump())
    installed: dict[str, str | None] = Field(default_factory=installed_versions)
    invocation: list[str]
    """The ``verl-consistency run ...`` arguments that reproduce this run."""
    command: list[str]
    """What was executed: python, ``-m``, the verl module and every override."""
    overrides: list[str]
    user_overrides: list[str]
    env: dict[str, str]
    """The variables this tool set (not the whole environment: it may hold secrets)."""
    dump_phase: str
    phase_reason: str | None = None
    """Why the run chose ``dump_phase`` itself (bypass mode in force: update_actor); None when the
    phase was given, or is the default log_prob."""
    capture: str
    kind: str = "collection"
    """``collection`` (msprobe dumps) or ``token-level`` (``--token-level``: token records only)."""
    collection: Literal["ride-along", "prompts-only"] | None = None
    """A collection run's kind: ``ride-along`` (the default: the job's own training step, full
    responses) or ``prompts-only`` (``--prompts-only``: the recipe's ``PROMPTS_ONLY=1`` trim). None
    for a token-level run. A ``run.json`` written before this field reads as ``prompts-only`` when it
    is a collection run: every collection run was, then."""
    msprobe: MsprobeConfigs
    paths: dict[str, str]
    """Run-folder-relative paths of what the run wrote (configs, data, dump folders)."""
    started_at: str = Field(default_factory=now_utc)
    finished_at: str | None = None
    exit_code: int | None = None
    steps: list[StepMetrics] = Field(default_factory=list)
    """verl's per-step metrics, in step order, from its console output (``trainer.logger`` with
    ``console``, the run's default). Empty in a manifest written before verl's first step, or by a
    version before this field."""

    @model_validator(mode="before")
    @classmethod
    def _collection_of_older_manifests(cls, data: Any) -> Any:
        """Fill ``collection`` for a ``run.json`` written before it (module docstring of the field)."""
        if isinstance(data, dict) and "collection" not in data:
            older = None if data.get("kind", "collection") == "token-level" else "prompts-only"
            return {**data, "collection": older}
        return data

    def write(self, path: Path) -> None:
        """Atomically (temp + rename): a reader never sees half a manifest."""
        write_json_atomic(path, self.model_dump(mode="json"))

    @classmethod
    def read(cls, path: Path) -> RunManifest:
        """The manifest at ``path``, validated; ValueError naming the file and what is wrong."""
        data = read_object(path)
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"{path}: run manifest schema_version {version!r}; this tool reads {SCHEMA_VERSION}"
            )
        return cls.model_validate(data)


def read_object(path: Path) -> dict[str, Any]:
    """``run.json`` as the JSON object it holds, before any schema check: the one read of the file.

    :meth:`RunManifest.read` validates what it returns; the postprocess takes it as it is, field by
    field, because a run folder made by hand or by an older version may carry only some fields
    (``run_id``, ``overrides``, ``kind``, ``steps``) and pairing needs none of them. ValueError
    naming the file when it cannot be read or holds no JSON object."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path}: unreadable run manifest ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: run manifest is not a JSON object")
    return data
