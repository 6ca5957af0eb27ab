"""The bundle manifest: what a downloaded bundle holds and why, versioned, with a JSON schema.

Every path in it is relative to the bundle root, so it stays valid after extraction anywhere.
``verify`` trusts nothing else in the archive: each file it lists must be present with the same
size and sha256, and nothing unlisted may be present.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from verl_consistency.contracts import __version__
from verl_consistency.postprocess.compare.batch_variance import PromptVariance
from verl_consistency.postprocess.pairing.pair_types import Pair, Unpaired, printable_value

if TYPE_CHECKING:
    from verl_consistency.postprocess.pairing.pair import PairingResult

MANIFEST_VERSION = 1
MANIFEST_NAME = "manifest.json"
SCHEMA_NAME = "manifest.schema.json"
RESULTS_DIR = "results"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Paths from the file system may hold undecodable bytes; JSON cannot (see model.printable).
    _printable = field_validator("*", mode="after")(printable_value)


class FileEntry(_Model):
    path: str
    size: int
    sha256: str
    kind: Literal["dump", "log", "run_manifest", "result", "schema"]


class Source(_Model):
    """Where the inputs were read from (informational: the bundle does not need them)."""

    run_dir: str
    rollout_dir: str
    actor_dir: str
    layout: Literal["run", "custom"] = Field(
        description="'run': rollout/ and actor/ inside the run folder; 'custom': --rollout-dir/--actor-dir"
    )


class PairingSummary(_Model):
    dispatch_records: int
    actor_records: int
    pairs: int
    requests_seen: int = Field(
        description="distinct requests (verl's ids) in the valid log lines of both sides: "
        "requests_paired + requests_unpaired"
    )
    requests_paired: int = Field(description="distinct requests with at least one pair")
    requests_unpaired: int = Field(
        description="requests with one 'request' entry each in unpaired_counts (all reasons summed)"
    )
    tp_rule: str
    unpaired_counts: dict[str, dict[str, int]] = Field(
        description="subject -> reason -> number of log records (one per rank) or requests"
    )
    unpaired_truncated: bool = Field(
        description="True when some reason had more entries than are listed in 'unpaired'"
    )

    @classmethod
    def of(cls, result: PairingResult) -> PairingSummary:
        return cls(
            dispatch_records=result.dispatch_records,
            actor_records=result.actor_records,
            pairs=len(result.pairs),
            requests_seen=result.requests_seen,
            requests_paired=result.requests_paired,
            requests_unpaired=result.requests_unpaired,
            tp_rule=result.tp_rule,
            unpaired_counts=result.counts,
            unpaired_truncated=result.truncated,
        )


class BundleManifest(_Model):
    manifest_version: Literal[1] = MANIFEST_VERSION
    tool: Literal["verl-consistency"] = "verl-consistency"
    tool_version: str = __version__
    run_id: str
    created: str = Field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    source: Source
    run_manifest: str | None = Field(
        default=None, description="bundle path of run.json, when the run had one"
    )
    pairing: PairingSummary
    pairs: list[Pair]
    unpaired: list[Unpaired]
    results_dir: str | None = Field(
        default=None, description="bundle folder of the compare results and report; None with --no-compare"
    )
    comparisons: list[dict[str, Any]] = Field(
        default_factory=list,
        description="compare's PairComparison records; their file paths are relative to results_dir",
    )
    warnings: list[str] = Field(default_factory=list)
    files: list[FileEntry] = Field(description="every file in the bundle except manifest.json itself")
    # A check run's (`verl-consistency check`) additions. Left out of an ordinary run's manifest,
    # which keeps the shape it had before check runs existed.
    check_manifest: str | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="bundle path of check.json, for a check run (absent otherwise)",
    )
    batch_variance: list[PromptVariance] = Field(
        default_factory=list,
        exclude_if=lambda v: not v,
        description="a check run's batch variance per prompt: vLLM batched (target) against vLLM alone "
        "(golden), compared by msprobe and judged like the pairs; file paths relative to results_dir",
    )


def schema_bytes() -> bytes:
    import json

    return (json.dumps(BundleManifest.model_json_schema(), indent=1, sort_keys=True) + "\n").encode()
