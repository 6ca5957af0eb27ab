"""pair → compare → bundle → verify/extract → report, through the real CLI, on real msprobe dumps.

The dumps come from :mod:`bench.support.realdumps` (real FSDP1 training side, vLLM stand-in
inference side, real JSONL logs, one planted numeric difference).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from bench.support import realdumps
from tests.fixtures.subprocess_run import bundle_through_cli
from verl_consistency.postprocess.output.bundle_manifest import MANIFEST_NAME, RESULTS_DIR, BundleManifest

pytestmark = pytest.mark.msprobe


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> realdumps.RealRuns:
    return realdumps.build_runs(tmp_path_factory.getbasetemp() / "realdumps")


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def _postprocess(spec: realdumps.RunSpec, tmp: Path) -> tuple[BundleManifest, Path, str]:
    before = _digest(spec.run_dir)
    done = bundle_through_cli(spec.run_dir, tmp)
    assert _digest(spec.run_dir) == before, "the postprocess modified its inputs"
    assert spec.run_dir.name in done.bundle.name
    manifest = BundleManifest.model_validate_json((done.extracted / MANIFEST_NAME).read_text())
    return manifest, done.extracted, done.stdout + done.stderr


def test_statistics_run_end_to_end(runs: realdumps.RealRuns, tmp_path: Path) -> None:
    spec = runs.stats
    manifest, dest, _ = _postprocess(spec, tmp_path)

    assert sorted(p.request_id for p in manifest.pairs) == sorted(spec.paired_requests)
    for p in manifest.pairs:
        assert p.rollout.rank == 0  # vLLM TP=2 against unsharded FSDP: the lowest rank pairs
        for side in (p.rollout, p.actor):
            for name in ("dump.json", "stack.json", "construct.json"):
                assert (dest / side.dir / name).is_file(), f"{side.dir}/{name} missing from the bundle"
    reasons = {r for by_reason in manifest.pairing.unpaired_counts.values() for r in by_reason}
    assert spec.unpaired_reasons <= reasons, spec.unpaired_reasons - reasons
    # The step that reuses 4 cached prompt tokens and schedules the other 3: either name is honest.
    assert reasons & {"prefix_cache_hit", "chunked_prefill"}

    assert len(manifest.comparisons) == len(manifest.pairs)
    for c in manifest.comparisons:
        assert c["status"] == "ok", c.get("error")
        assert c["first_divergence"] == spec.changed_module
        assert c["task"] == "statistics"
        assert (dest / RESULTS_DIR / c["csv"]).is_file()

    html = (dest / RESULTS_DIR / "report.html").read_text()
    assert spec.changed_module in html
    for reason in spec.unpaired_reasons:
        assert reason in html, reason
    summary = (dest / RESULTS_DIR / "summary.md").read_text()
    assert spec.changed_module in summary
    assert "no_training_micro_batch" in summary


def test_request_scoped_tensor_run_end_to_end(runs: realdumps.RealRuns, tmp_path: Path) -> None:
    spec = runs.tensor
    manifest, dest, _ = _postprocess(spec, tmp_path)

    (pair,) = manifest.pairs
    assert pair.request_id == realdumps.R2
    assert pair.scoped, "R2 was cut out of a step that also held R3"
    assert pair.task == "tensor"
    (c,) = manifest.comparisons
    assert c["status"] == "ok", c.get("error")
    assert c["task"] == "tensor"
    assert c["first_divergence"] == spec.changed_module
    assert c["min_cosine"] < 0.999
    prof = {p["label"]: p for p in c["layer_profile"]}
    assert prof["0"]["cosine"] > 0.99999
    html = (dest / RESULTS_DIR / "report.html").read_text()
    assert "Cosine" in html
    assert json.loads((dest / RESULTS_DIR / c["rows_csv"]).with_name("comparison.json").read_text())["scoped"]
