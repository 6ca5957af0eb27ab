"""The JSONL log records: written by the hooks, read by the postprocess. Defined once, here.

Field names are the public recipe's (``source, timestamp, pid, rank, step, phase,
total_num_scheduled_tokens, requests[].request_id/type/tokens``; ``request_ids,
num_requests``), so that users' existing grep/jq scripts keep working. Everything else is an
addition; readers must ignore fields they do not know (``extra="allow"``), so that a newer
writer never breaks an older postprocess.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import IO, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

DISPATCH_LOG = "dispatch_log.jsonl"
"""File name of the vLLM-side log, one per worker pid (recipe name)."""

UPDATE_ACTOR_LOG = "update_actor_log.jsonl"
"""File name of the training-side log, one per trainer pid (recipe name)."""

LANE_PREFIX = "req"
"""A record with ``lane_request_ids`` keeps lane ``k`` (the k-th id's rows alone) in the folder
``req{k}`` inside msprobe's rank folder of its step (``hooks/lanes/msprobe_lanes.py`` writes it)."""


def lane_folder(k: int) -> str:
    return f"{LANE_PREFIX}{k}"


class RecordHeader(BaseModel):
    """What every JSONL line the hooks write begins with: its schema, when, and which process.

    Defined once so that the logs here and the token records (``token_records``) cannot drift
    apart; ``extra="allow"`` so that a newer writer never breaks an older reader."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    timestamp: str
    pid: int


class _Record(RecordHeader):
    """A line of the msprobe-side logs: the header, and the msprobe step (folder) it names."""

    rank: int
    step: int = Field(description="msprobe's service.current_iter: the N of the step{N} folder")
    dump_path: str | None = Field(
        default=None,
        description="msprobe's dump_path when this step was dumped; step{N}/ lies under it",
    )


WEIGHT_VERSION_DOC = (
    "the label (verl's global_steps) of the weight sync whose weights computed this record "
    "(dispatch: the last sync this vLLM worker loaded; training: the last sync the trainer sent, "
    "see unsynced_updates); absent in older logs and the recipe's (hooks/training/weight_sync.py)"
)


class ScheduledRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    request_id: str = Field(description="vLLM's internal id, with its -[0-9a-f]{8} suffix")
    type: Literal["new", "cached"]
    tokens: int = Field(description="tokens scheduled for this request in this step")
    prompt_tokens: int | None = Field(default=None, description="prompt length (new requests)")
    num_computed_tokens: int | None = Field(
        default=None, description=">0 on a new request means a prefix-cache hit"
    )
    spec_tokens: int | None = Field(
        default=None,
        description="speculative tokens scheduled for a cached request (a decode of 1 + spec_tokens)",
    )


class DispatchRecord(_Record):
    """One vLLM model-runner step, written where msprobe's ``debugger.start`` runs.

    ``weight_version`` is why a collection run under RL can be paired at all: the weights move,
    and a prefill only compares with a training forward that ran the same weights. vLLM's
    weights are those of the last sync it received, and in the async modes a request can be
    generated with step k's weights and trained at step k+1 or later (staleness). Both sides
    number the same weights the same: the sync that hands vLLM the weights that the trainer's
    forward of global step k runs with carries k, and so does that forward's
    :class:`UpdateActorRecord`. The pairing pairs equal versions only (``weights_differ``
    otherwise); a record without one (older logs, the recipe's format) pairs as before.
    """

    source: Literal["dispatch_logger"] = "dispatch_logger"
    phase: Literal["prefill", "decode"]
    attn_state: str | None = Field(default=None, description="AscendAttentionState member name")
    total_num_scheduled_tokens: int
    requests: list[ScheduledRequest]
    dumped: bool = Field(default=True, description="False when the selective mode skipped the dump")
    scoped_request_id: str | None = Field(
        default=None,
        description="selective mode: the vLLM id whose rows alone step{N} holds (request_scope.start_step)",
    )
    runner_step: int | None = Field(
        default=None,
        description="this worker's count of model-runner steps, dumped or not (orders the records "
        "when msprobe's step does not advance)",
    )
    lane_request_ids: list[str] | None = Field(
        default=None,
        description="per-request lanes (hooks/lanes/msprobe_lanes.py): lane k's dump is "
        "step{N}/<rank>/req{k}/ and holds the rows of the k-th id here alone",
    )
    weight_version: int | None = Field(default=None, description=WEIGHT_VERSION_DOC)


class UpdateActorRecord(_Record):
    """One training micro batch (FSDP) or ``forward_step`` (Megatron) that msprobe dumped.

    ``weight_version`` is the label of the last weight sync the trainer sent: the weights it ran
    with, numbered as :class:`DispatchRecord` numbers vLLM's (the pairing pairs equal versions
    only). ``unsynced_updates`` > 0 says the trainer has taken that many optimizer steps since
    that sync (a later mini-batch of update_actor, a fully-async trainer between syncs): its
    weights are then no sync's, and the record never pairs (``weights_differ``).

    In the async modes a request's rollout may have run older weights than the trainer's step:
    its lanes are then dumped by a second forward at those weights (``hooks/training/older_weights.py``), in a
    record of their own whose ``weight_version`` is the rollout's and whose
    ``trainer_weight_version`` is what verl's own computation of that call ran (the staleness is the
    difference). ``lanes_elsewhere`` names the micro batch's requests dumped in such another record,
    so that neither record counts them as mixed into its dump.
    """

    source: Literal["update_actor"] = "update_actor"
    phase: Literal["log_prob", "update_actor"] | None = None
    backend: Literal["fsdp", "megatron"] | None = None
    request_ids: list[str]
    num_requests: int
    lane_request_ids: list[str] | None = Field(
        default=None,
        description="per-request lanes (hooks/lanes/msprobe_lanes.py): lane k's dump is "
        "step{N}/<rank>/req{k}/ and holds the rows of the k-th id here alone",
    )
    weight_version: int | None = Field(default=None, description=WEIGHT_VERSION_DOC)
    unsynced_updates: int = Field(
        default=0,
        ge=0,
        description="optimizer steps the trainer took after the sync named by weight_version",
    )
    lanes_elsewhere: list[str] | None = Field(
        default=None,
        description="requests of this micro batch whose lanes are in another record of the same "
        "forward_backward_batch call (a forward at the weights of their rollout)",
    )
    trainer_weight_version: int | None = Field(
        default=None,
        description="present when this forward ran other weights than the trainer's step: the sync "
        "label of the weights verl's own computation of the call ran (weight_version: the rollout's)",
    )
    trainer_unsynced_updates: int = Field(
        default=0, ge=0, description="optimizer steps after trainer_weight_version (as unsynced_updates)"
    )


def now() -> str:
    """The recipe's timestamp format (local time, second resolution)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())


class JsonlWriter:
    """Append-only JSONL file, flushed per line so that a killed worker loses at most one line."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[bytes] | None = self.path.open("ab")

    def write(self, record: BaseModel) -> None:
        if self._fh is None:
            raise ValueError(f"{self.path} is closed")
        self._fh.write(orjson.dumps(record.model_dump(mode="json", exclude_none=True)) + b"\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


_VLLM_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
_CHILD_PREFIX = re.compile(r"^(\d+)_(.+)$")


def split_vllm_request_id(vllm_id: str) -> tuple[str, int | None]:
    """vLLM's internal id → (the id verl sent, n>1 child index or None).

    From vLLM 0.14 on the engine rewrites an external id to ``f"{external}-{8 hex}"``, and with
    n>1 the children are ``"{i}_{external}-{8 hex}"``. Only a trailing ``-[0-9a-f]{8}`` is
    stripped: verl's own ids are 32 hex characters with no dash, but a user's custom agent loop
    may use dashes, and a greedier rule would cut those.
    """
    base = _VLLM_SUFFIX.sub("", vllm_id)
    if base == vllm_id:
        return vllm_id, None
    m = _CHILD_PREFIX.match(base)
    if m:
        return m.group(2), int(m.group(1))
    return base, None


def base_request_id(vllm_id: str) -> str:
    return split_vllm_request_id(vllm_id)[0]
