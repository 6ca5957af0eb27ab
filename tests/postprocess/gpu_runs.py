"""The committed GPU run folders, unpacked and re-paired through the real CLI (no tests here).

Every ``*_h100_next`` / ``*_h200_next`` fixture test starts the same way: one run folder packed as
``fixtures/<archive>.tar.xz``, unpacked safely, then ``postprocess``, ``verify`` and ``extract`` as a
user runs them (:func:`~tests.fixtures.subprocess_run.bundle_through_cli`). A planted weight-sync
fault is judged the same way in every mode (:func:`assert_fault_pairs`).
"""

from __future__ import annotations

import json
import math
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.subprocess_run import bundle_through_cli
from verl_consistency.postprocess.compare.verdict import DIVERGED_REL_ERR, HEALTHY_REL_ERR

FIXTURES = Path(__file__).parent / "fixtures"


def unpack(archive: str, run_id: str, dest: Path) -> Path:
    """``fixtures/<archive>`` holds exactly one run folder, ``run_id``; unpacked under ``dest``."""
    with tarfile.open(FIXTURES / archive) as tar:
        names = tar.getnames()
        assert all(n == run_id or n.startswith(f"{run_id}/") for n in names), "one run folder"
        tar.extractall(dest, filter="data")
    return dest / run_id


@dataclass(frozen=True)
class Repaired:
    """A fixture's run folder and what the CLI made of it."""

    run_dir: Path
    results: Path
    """The bundle's ``results/``, extracted."""
    run: dict[str, Any]
    manifest: dict[str, Any]
    summary: dict[str, Any]
    summary_md: str
    report: str


def repair(archive: str, run_id: str, tmp: pytest.TempPathFactory) -> Repaired:
    """The fixture through postprocess, verify and extract (~30 s on two cores)."""
    run_dir = unpack(archive, run_id, tmp.mktemp(run_id))
    out = bundle_through_cli(run_dir, tmp.mktemp(f"{run_id}-bundle"))
    results = out.extracted / "results"
    return Repaired(
        run_dir=run_dir,
        results=results,
        run=json.loads((run_dir / "run.json").read_text()),
        manifest=out.manifest(),
        summary=json.loads((results / "summary.json").read_text()),
        summary_md=(results / "summary.md").read_text(),
        report=(results / "report.html").read_text(),
    )


def assert_fault_pairs(manifest: dict[str, Any], module: str, layer: int) -> None:
    """A sync that skipped one tensor of ``layer``: a pair of weights 0 (the first, whole sync) is
    healthy everywhere; every later one diverges first at ``module``, the layers before it agree."""
    version = {pair["pair_id"]: pair["weight_version"] for pair in manifest["pairs"]}
    before = ["embed", *(str(i) for i in range(layer))]
    for c in manifest["comparisons"]:
        assert (c["status"], c["task"]) == ("ok", "statistics")
        profile = {x["label"]: x["rel_err"] for x in c["layer_profile"]}
        if version[c["pair_id"]] == 0:
            assert (c["verdict"], c["first_divergence"]) == ("healthy", None)
            assert max(profile.values()) <= HEALTHY_REL_ERR
            continue
        assert (c["verdict"], c["first_divergence"]) == ("diverged", module)
        assert c["first_divergence_row"]["layer"] == layer
        assert max(profile[k] for k in before) <= HEALTHY_REL_ERR, "the layers before it agree"
        assert profile[str(layer)] > DIVERGED_REL_ERR


def assert_weights_move(steps: list[dict[str, Any]], count: int) -> None:
    """A ride-along's per-step table (``run.json``'s ``steps``): steps 1..count, each with a finite
    grad_norm above 0."""
    assert [s["step"] for s in steps] == list(range(1, count + 1))
    for s in steps:
        assert math.isfinite(s["grad_norm"])
        assert s["grad_norm"] > 0, "the weights move at every step"
