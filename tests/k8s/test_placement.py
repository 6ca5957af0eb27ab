"""Pool pinning, proven on a real multi-node Ray 2.48 cluster on loopback.

The cluster mirrors the fully-async RayJob: a head with no NPUs, a `trainer` node and a
`rollout` node that declare the Ray resources of their worker group in
k8s/fully-async-rayjob.yaml (NPU counts scaled down; the trainer node deliberately has more
room). The runtime env is the RayJob's own ``runtimeEnvYAML``, handed to the driver the way
Ray's job supervisor does, and merged with verl's own ``ray.init`` runtime env. The pools are
verl 0.8.0's own (``create_resource_pool_manager`` and ``RolloutReplica.init_standalone``);
see placement_driver.py for the two thin stand-ins (no torch workers, no vLLM server).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.conftest import K8S
from tests.k8s.raycluster import LoopbackCluster, NodeSpec
from verl_consistency.patches.hooks import placement

pytestmark = [pytest.mark.ray, pytest.mark.verl, pytest.mark.timeout(900)]

DRIVER = Path(__file__).with_name("placement_driver.py")
NPUS = {"trainer": 4, "rollout": 2}  # the trainer node has room for a stray rollout replica


def manifest_rayjob() -> dict[str, Any]:
    docs = yaml.safe_load_all((K8S / "fully-async-rayjob.yaml").read_text())
    (job,) = [d for d in docs if d and d["kind"] == "RayJob"]
    return job


def node_resources(group: dict[str, Any]) -> dict[str, float]:
    """The group's Ray resources from the manifest, with the NPU count scaled down."""
    res = {k: float(v) for k, v in group["resources"].items()}
    res["NPU"] = float(NPUS[group["groupName"]])
    return res


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackCluster]:
    groups = manifest_rayjob()["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    c = LoopbackCluster(
        head_cpus=1,  # room for the driver-side actor only; no NPU on the head
        workers=[NodeSpec(g["groupName"], num_cpus=16, resources=node_resources(g)) for g in groups],
    )
    try:
        c.start()
        yield c
    finally:
        leftovers = c.stop()
        assert leftovers == [], f"ray processes left running: {leftovers}"


def run_driver(
    cluster: LoopbackCluster, scenarios: list[dict[str, Any]], tmp: Path, hook: bool
) -> dict[str, Any]:
    args = [sys.executable, str(DRIVER), cluster.address, json.dumps(scenarios)]
    if hook:
        runtime_env = tmp / "runtime_env.yaml"
        runtime_env.write_text(manifest_rayjob()["spec"]["runtimeEnvYAML"])
        args.append(str(runtime_env))
    res = subprocess.run(args, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    assert res.returncode == 0, f"driver failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    assert lines, f"driver failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    return dict(json.loads(lines[-1][len("RESULT ") :]))


FULL = {"name": "full", "trainer_nodes": 1, "trainer_npus": 2, "rollout_nodes": 1, "rollout_npus": 2}
# Three 1-NPU rollout replicas while the rollout node has two NPUs: one must go elsewhere or wait.
OVERFLOW = {
    "name": "overflow",
    "trainer": False,
    "trainer_nodes": 1,
    "trainer_npus": 2,
    "rollout_nodes": 1,
    "rollout_npus": 3,
    "ready_timeout_s": 8,
}


@pytest.fixture(scope="module")
def with_hook(cluster: LoopbackCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_driver(cluster, [FULL, OVERFLOW], tmp_path_factory.mktemp("hook"), hook=True)


@pytest.fixture(scope="module")
def without_hook(cluster: LoopbackCluster, tmp_path_factory: pytest.TempPathFactory, with_hook: Any) -> Any:
    return run_driver(cluster, [OVERFLOW], tmp_path_factory.mktemp("nohook"), hook=False)


def by_pool(report: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [r for r in report if r["pg"].startswith(prefix)]


def test_every_bundle_lands_on_its_group(with_hook: dict[str, Any]) -> None:
    report = with_hook["full"]
    trainer, rollout = by_pool(report, "trainer_pool"), by_pool(report, "rollout_pool_")
    # verl's real names: one trainer pool of 2 bundles, one pool per 1-NPU rollout replica
    assert [r["pg"] for r in trainer] == ["trainer_poolverl_group_2:0"]
    assert [r["pg"] for r in rollout] == ["rollout_pool_0verl_group_1:0", "rollout_pool_1verl_group_1:0"]
    assert all(r["state"] == "CREATED" for r in report)
    assert [n for r in trainer for n in r["nodes"]] == ["trainer", "trainer"]
    assert [n for r in rollout for n in r["nodes"]] == ["rollout", "rollout"]
    for r in trainer:
        assert all(b[placement.TRAINER_RESOURCE] == placement.BUNDLE_AMOUNT for b in r["bundles"])
    for r in rollout:
        assert all(b[placement.ROLLOUT_RESOURCE] == placement.BUNDLE_AMOUNT for b in r["bundles"])


def test_the_constraint_comes_from_the_hook(with_hook: dict[str, Any], without_hook: dict[str, Any]) -> None:
    # Without the hook Ray puts a rollout replica on the trainer's NPUs (here it must: the
    # rollout node has two NPUs for three replicas), and the bundles carry no group tag.
    plain = without_hook["overflow"]
    assert all(r["state"] == "CREATED" for r in plain)
    assert "trainer" in [n for r in plain for n in r["nodes"]]
    assert not any(placement.ROLLOUT_RESOURCE in b for r in plain for b in r["bundles"])
    # With the hook the third replica waits for a rollout node instead: never the trainer node.
    pinned = with_hook["overflow"]
    assert sorted(r["state"] for r in pinned) == ["CREATED", "CREATED", "PENDING"]
    assert sorted(n for r in pinned if r["state"] == "CREATED" for n in r["nodes"]) == ["rollout", "rollout"]
    assert "trainer" not in [n for r in pinned for n in r["nodes"]]
