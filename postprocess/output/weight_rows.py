"""``summary.json``'s ``weights``: the weight check per sync version beside the layer view (issue 42).

The models only, so that ``per_step.RunSummary`` can carry them; ``weight_section`` fills them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TensorRow(_Model):
    tensor: str
    kind: str
    detail: str
    worker: int
    first_version: int | None = Field(description="the first version at which this tensor differed")


class WeightVersionRow(_Model):
    """One sync version in ``summary.json``'s ``weights``."""

    version: int | None
    exported: int = Field(description="tensors the trainer sent")
    compared: int = Field(description="tensor x vLLM worker comparisons made")
    not_checked: int = Field(description="tensors vLLM's worker could not map (weights.csv says why)")
    differing: list[TensorRow]
    pairs: int = Field(description="pairs computed at these weights (both sides)")
    diverged_pairs: int
    first_divergence: str | None = Field(
        description="the block most diverged pairs of this version name first"
    )
    fingerprint_s: float = Field(
        description="seconds fingerprinting this sync (slowest trainer rank + worker)"
    )


class WeightSummary(_Model):
    versions: list[WeightVersionRow]
    differing_tensors: list[str] = Field(
        description="every tensor that differed at some version, first seen first"
    )
    verdict: str = Field(description="one line: 'all N syncs exact' or what differed first, and where")
