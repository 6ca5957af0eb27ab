"""The weight check's records: one line per weight sync and process, under ``<run>/weights/``.

Issue 42. The layer view finds a bad weight sync through the activations it spoils: the module,
after a dumped step. These records check the weights themselves, tensor by tensor, at every
sync, dumped or not:

* ``export-<pid>.jsonl``, written by each trainer rank (``patches/hooks/training/weight_export.py``): the
  fingerprint of every tensor verl hands to the sync, after the FSDP/Megatron → HF conversion
  (``engine.get_per_tensor_param()``), under the sync's label; by default cast to the dtype vLLM
  holds it in (verl's ``rollout.dtype``: ``sent_dtype`` names the dtype it was sent in);
* ``held-<pid>.jsonl``, written by each vLLM worker (``patches/hooks/rollout/weight_held.py``): the
  shape and dtype of every tensor as it arrived (``arrived``; with
  ``$VERL_CONSISTENCY_WEIGHT_CHECK_ARRIVALS=1`` its fingerprints instead, ``received`` and
  ``expected``), the fingerprint of the region of vLLM's own parameter that holds it once loaded
  (``qkv_proj`` holds ``q_proj``, ``k_proj`` and ``v_proj`` one after the other, as vLLM's
  ``packed_modules_mapping`` of the model says), and the tensors it could not map.

A fingerprint is two exact integer sums over the tensor's bytes as words (row sums and column sums,
each weighted by position; ``patches/hooks/weights/fingerprint.py`` says why), so an exact copy gives the same
two numbers on any device and in any reduction order, and nothing else is compared approximately.
``postprocess/compare/weight_check.py`` reads both and names each tensor that differs.

Nothing here imports torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from verl_consistency.contracts.records import RecordHeader

WEIGHTS_DIR = "weights"
"""Run-relative folder of the weight check's logs (``hooks/weights/sync_log.weights_dir``)."""
EXPORT_PREFIX = "export-"
HELD_PREFIX = "held-"


def log_name(side: Literal["export", "held"], pid: int) -> str:
    """``export-<pid>.jsonl`` or ``held-<pid>.jsonl``: one file per process, as msprobe's folders are."""
    return f"{EXPORT_PREFIX if side == 'export' else HELD_PREFIX}{pid}.jsonl"


class TensorPrint(BaseModel):
    """One tensor's fingerprint: its shape, dtype and the two sums (``hooks/weights/fingerprint.py``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    shape: list[int]
    dtype: str = Field(description="torch's name without 'torch.', e.g. bfloat16")
    rows: int = Field(
        description="sum over rows of (row's sum of 32-bit words mod 2^32, x position weight), mod 2^64"
    )
    cols: int | None = Field(
        default=None,
        description=(
            "sum over rows of (row's words weighted by column 1, 3, 5, ...), mod 2^32 (2^64 for 8-byte"
            " words); None where only the row sums were taken (a transport's print)"
        ),
    )

    sent_dtype: str | None = Field(
        default=None,
        description="the dtype it was sent in, where this print is of it cast to the dtype vLLM holds",
    )

    def same_values(self, other: TensorPrint) -> bool:
        """Bit-identical contents as far as both prints tell: shape and row sums, and the column
        sums where both have them (a print of the trainer's export or of an arrival that is cast
        before loading has row sums alone: it only checks the transport). dtype is compared apart."""
        if self.shape != other.shape or self.rows != other.rows:
            return False
        return self.cols is None or other.cols is None or self.cols == other.cols


class TensorMeta(BaseModel):
    """A tensor as it arrived, without sums: its shape and dtype (the default check compares its
    values where vLLM holds them, against the trainer's print in that dtype)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    shape: list[int]
    dtype: str


class WeightSyncRecord(RecordHeader):
    """One process's view of one weight sync."""

    side: Literal["export", "held"]
    rank: int = 0
    version: int | None = Field(
        description="the sync's label (verl's global_steps), as weight_version elsewhere"
    )
    tensors: dict[str, TensorPrint] = Field(
        description="export: what the trainer sent; held: where vLLM's parameters hold each tensor"
    )
    received: dict[str, TensorPrint] | None = Field(
        default=None, description="held only: each tensor of this sync as it arrived, before loading"
    )
    expected: dict[str, TensorPrint] | None = Field(
        default=None,
        description="held only: each arrival cast to its parameter's dtype, where the two differ",
    )
    arrived: dict[str, TensorMeta] | None = Field(
        default=None,
        description=(
            "held only, without arrival prints: each tensor of this sync as it arrived (shape, dtype);"
            " its values are compared where vLLM holds them"
        ),
    )
    unmapped: dict[str, str] = Field(
        default_factory=dict, description="held only: tensor -> why its region in vLLM's model was not found"
    )
    seconds: float = Field(
        default=0.0,
        description="time the sync's own thread spent fingerprinting in this process for this sync",
    )
    read_s: float | None = Field(
        default=None,
        description=(
            "time spent reading the prints back from the device, off the sync's path (the process's"
            " writer thread: ``hooks/weights/sync_log.write_later``); None in records before it"
        ),
    )
