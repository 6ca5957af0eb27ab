"""What the postprocess stages hand to each other. Pairing produces it; compare, report and
the bundle manifest consume it. Every path is relative to the run folder (``RunLayout.run_dir``),
which is also the bundle root, so a manifest stays valid after download and extraction.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


def printable(text: str) -> str:
    """``text`` as valid Unicode: the bytes of a file name that is not UTF-8 (which Python
    decodes to lone surrogates) become a visible ``\\xff``, any other lone surrogate (a
    ``\\ud800`` escape in a log line) a visible ``\\ud800``. JSON cannot
    carry lone surrogates, so every string bound for the manifest passes through here."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:  # a file name's raw bytes, shown as \\xff
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def printable_value(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [printable(v) if isinstance(v, str) else v for v in value]
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    _printable = field_validator("*", mode="after")(printable_value)


class DumpRef(_Model):
    """One msprobe step folder: ``<dump_path>/step{N}/<rank folder>``."""

    side: Literal["rollout", "actor"]
    pid: int
    rank: int
    step: int
    dir: str
    """Run-relative path of the folder holding dump.json (and stack.json, construct.json)."""


class Pair(_Model):
    """A vLLM prefill of one request, and a training micro batch of exactly that request."""

    pair_id: str
    """Stable, file-name safe: ``<request_id>[.c<n>1 child>].r<rollout rank>.a<actor rank>``."""
    request_id: str
    """The id verl sent (vLLM's suffix stripped)."""
    vllm_request_id: str
    rollout: DumpRef
    actor: DumpRef
    backend: Literal["fsdp", "megatron"]
    prompt_tokens: int
    scoped: bool = False
    """True when the rollout dump was cut out of a multi-request step (request-scoped mode)."""
    task: Literal["statistics", "tensor"] = "statistics"
    weight_version: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="the weights both sides ran (records' weight_version); absent when neither record "
        "carries one (older logs, the recipe's format)",
    )
    """What the report's per-step view groups by (``output/per_step.py``). Left out of the manifest
    when None, so a run without versions keeps the manifest it had."""
    trainer_weight_version: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="the weights of the training step whose call dumped this forward, when the forward "
        "ran the rollout's older ones (hooks/training/older_weights.py); absent when they are the same",
    )


class UnpairedReason(StrEnum):
    MULTI_REQUEST_STEP = "multi_request_step"
    DECODE_ONLY = "decode_only"
    CHUNKED_PREFILL = "chunked_prefill"
    PREFIX_CACHE_HIT = "prefix_cache_hit"
    NOT_DUMPED = "not_dumped"
    NO_TRAINING_MICRO_BATCH = "no_training_micro_batch"
    MULTI_REQUEST_MICRO_BATCH = "multi_request_micro_batch"
    NO_ROLLOUT_PREFILL = "no_rollout_prefill"
    DUMP_MISSING = "dump_missing"
    DUMP_UNREADABLE = "dump_unreadable"
    DUPLICATE_ID = "duplicate_id"
    OUTSIDE_RUN = "outside_run"
    BAD_LOG_LINE = "bad_log_line"
    SPEC_DECODING = "spec_decoding"
    TP_SHARDING_MISMATCH = "tp_sharding_mismatch"
    REPEATED_MICRO_BATCH = "repeated_micro_batch"
    LOG_UNREADABLE = "log_unreadable"
    NO_REQUEST_ID = "no_request_id"
    WEIGHTS_DIFFER = "weights_differ"


class Unpaired(_Model):
    """Why a request, a rollout step or a training step did not become a pair."""

    subject: Literal["request", "rollout_step", "actor_step", "log_line"]
    ref: str
    """A request id, a run-relative step folder, or ``file:line``."""
    reason: UnpairedReason
    detail: str = ""
