"""``verl-consistency check`` for real: vLLM + verl + msprobe of the pin set in force on CPU.

One check run in the set's demo venv, with two planted faults that the check must tell apart:

* a training-side weight changed (``--training-model``: the demo's perturbed copy, ``PERTURBED``
  scaled and jittered): the **engine gap** (vLLM alone vs training) must put its first divergence
  there, in every pair;
* a vLLM-only batch effect (``batch_effect/sitecustomize.py``, a named stand-in for a
  batch-variant kernel: ``model.layers.0.mlp``'s output scaled only in steps that pack several
  prompts): the **batch variance** (vLLM batched vs alone) must put its first divergence there,
  and the engine gap must not see it (its first divergence stays in layer 1).

Then: the bundle verifies, its manifest and report carry both columns per request, and the head
(vLLM's top-k at the last prompt position against the training softmax) is in the output rows.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

from verl_consistency.postprocess.output.bundle_manifest import MANIFEST_NAME

# current set only (CI time): the next set's check is proven on the H200 (bench/results/check-h200-next.log)
pytestmark = [pytest.mark.demo, pytest.mark.timeout(1200)]

PERTURBED = "model.layers.1.mlp.down_proj"
BATCH_EFFECT = "model.layers.0.mlp"
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def check(
    demo_python: Path, tmp_path_factory: pytest.TempPathFactory, repo: Path, request: pytest.FixtureRequest
) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("check")
    run = [str(demo_python), "-m", "verl_consistency.entrypoints"]
    # the demo's random model and its perturbed copy (what `demo --perturb` trains on)
    build = (
        "import sys; from pathlib import Path; "
        "from verl_consistency.entrypoints.engines import tiny_model as d; "
        "m = Path(sys.argv[1]); d.build_model(m, d.prompt_texts(64)); d.perturbed_copy(m, Path(sys.argv[2]))"
    )
    model, bad = root / "models" / "tiny-qwen2", root / "models" / "tiny-qwen2-perturbed"
    subprocess.run([str(demo_python), "-c", build, str(model), str(bad)], cwd=repo, check=True, timeout=300)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE / "batch_effect"), os.environ.get("PYTHONPATH", "")]),
    }
    res = subprocess.run(
        [
            *run,
            "check",
            "--model",
            str(model),
            "--training-model",
            str(bad),
            "--num-prompts",
            "6",
            "--micro-batch",
            "3",
            "--dump-root",
            str(root),
            "--run-id",
            "check-planted",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + "\n".join(f"[check] {line}" for line in res.stdout.splitlines()[-10:]), flush=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((root / "check-planted-summary.json").read_text())
    with zstandard.open(summary["bundle"], "rb") as fh:
        import tarfile

        with tarfile.open(fileobj=fh, mode="r|") as tar:
            manifest = next(orjson.loads(tar.extractfile(m).read()) for m in tar if m.name == MANIFEST_NAME)
    return {
        "root": root,
        "summary": summary,
        "manifest": manifest,
        "stdout": res.stdout,
        "python": demo_python,
        "run": run,
    }


def test_bundle_verifies(check):
    res = subprocess.run(
        [*check["run"], "verify", check["summary"]["bundle"]], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "(verified)" in check["stdout"]


def test_engine_gap_localises_the_training_weight(check):
    comps = check["manifest"]["comparisons"]
    assert len(comps) == 6, check["summary"].get("unpaired_requests")
    assert {c["first_divergence"] for c in comps} == {PERTURBED}
    assert {c["verdict"] for c in comps} == {"diverged"}


def _packed(run_dir: Path) -> set[str]:
    """Request ids that vLLM computed in a step together with other requests (its dispatch log)."""
    out: set[str] = set()
    for log in run_dir.glob("rollout/*/dispatch_log.jsonl"):
        for line in log.read_text().splitlines():
            lanes = json.loads(line).get("lane_request_ids") or []
            if len(lanes) > 1:
                out |= {rid[:32] for rid in lanes}  # verl's uuid4().hex; vLLM appends "-<8 hex>"
    return out


def test_batch_variance_localises_the_vllm_batch_effect(check):
    rows = check["manifest"]["batch_variance"]
    assert len(rows) == 6
    packed = _packed(Path(check["summary"]["run_dir"]))
    together = [r for r in rows if r["batched_request_id"] in packed]
    # vLLM packs most of the six in its first batched step (a request it scheduled alone is
    # computed as in the alone pass: no batch effect, and the column must say healthy)
    assert len(together) >= 4, rows
    for r in rows:
        if r in together:
            assert (r["verdict"], r["first_divergence"]) == ("diverged", BATCH_EFFECT), r
        else:
            assert r["verdict"] == "healthy", r
    # the same prompt's engine gap does not start where the batch effect is: the columns separate them
    gap = {c["request_id"]: c for c in check["manifest"]["comparisons"]}
    for r in rows:
        assert gap[r["alone_request_id"]]["first_divergence"] == PERTURBED


def test_report_shows_both_columns_and_the_head(check):
    html = Path(check["summary"]["report"]).read_text()
    assert "batch variance" in html.lower()
    assert "engine gap" in html.lower()
    heads = [c.get("output") or {} for c in check["manifest"]["comparisons"]]
    assert all(h.get("topk_tv") is not None for h in heads), heads
