"""``<run>/check.json``: what ``verl-consistency check`` ran, for the postprocess to split the gap.

A check run is a collection run folder (``layout``) with two vLLM passes over the same prompts
and one training pass. vLLM names every request by its own id, so the same prompt has two
rollout request ids: one from the batched pass (every prompt in flight at once, as verl's agent
loop sends them) and one from the alone pass (each prompt by itself). The training pass uses the
*alone* ids, so the unchanged pairing pairs alone-vs-training (the **engine gap**); this file
tells the postprocess which batched id goes with which alone id (the **batch variance**:
vLLM batched against vLLM alone, compared the same way).

Written once by the check's orchestrator (``entrypoints/check/command.py``) before any engine starts;
read by ``postprocess/compare/batch_variance.py``. A run folder without it is an ordinary collection run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from verl_consistency.contracts import records

CHECK_MANIFEST = "check.json"
"""Run-relative path of the check's manifest."""

DEFAULT_TOP_K = 20
"""Log-probs vLLM returns at the last prompt position (the head comparison), unless ``--top-k``."""


class CheckPrompt(BaseModel):
    """One prompt of the check: its two rollout request ids (verl's ids, no vLLM suffix)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(description="position in the check's prompt list")
    prompt_tokens: int
    batched_request_id: str = Field(description="the id it had in the batched pass (all prompts at once)")
    alone_request_id: str = Field(description="the id it had in the alone pass (the training pass uses it)")


class CheckRun(BaseModel):
    """What ran; ``prompts`` is filled once the rollout is back (ids are made by the rollout stage)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = records.SCHEMA_VERSION
    kind: Literal["check"] = "check"
    model: str
    training_model: str = Field(description="the weights the training engine loaded (the model unless told)")
    device: Literal["cpu", "cuda", "npu"]
    dtype: str
    tensor_parallel_size: int = 1
    engine: Literal["fsdp", "megatron"] = "fsdp"
    top_k: int = DEFAULT_TOP_K
    micro_batch: int = 1
    prompts: list[CheckPrompt] = Field(default_factory=list)


def read(run_dir: Path) -> CheckRun | None:
    """The run's check manifest, or None for an ordinary collection run.

    Raises ``ValueError`` naming the file when it exists but does not parse: a check run whose
    manifest is torn must not be postprocessed as if it were an ordinary run.
    """
    path = run_dir / CHECK_MANIFEST
    if not path.is_file():
        return None
    try:
        return CheckRun.model_validate_json(path.read_bytes())
    except ValueError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(
            f"{path}: not a valid check manifest ({first}); rerun `verl-consistency check` "
            "or remove the file to postprocess the folder as an ordinary run"
        ) from exc
