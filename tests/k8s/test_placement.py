"""Pool pinning, proven on a real multi-node Ray 2.48 cluster on loopback, on both pin sets.

The cluster mirrors the fully-async RayJob: a head with no NPUs, a `trainer` node and a
`rollout` node that offer what their worker group's `ray start` flags in
k8s/fully-async-rayjob.yaml give them (its ``rayStartParams.resources`` through the shell, as
KubeRay passes it: ray_start.py; NPU counts scaled down; the trainer node deliberately has more
room). The runtime env is the RayJob's own ``runtimeEnvYAML``, handed to the driver the way
Ray's job supervisor does, and merged with verl's own ``ray.init`` runtime env. The pools are
created by the installed verl's own code (placement_driver.py picks it by verl's version):
verl 0.8.0's ``fully_async_policy`` (``trainer_pool``, ``rollout_pool_<rank>``) on the current
set, verl 0.9's V1 ``separate_async`` trainer (``global_pool``, then ``rollout_pool_<rank>`` from
rank = number of hybrid replicas) on the next set; see placement_driver.py for the stand-ins
(no torch workers, no vLLM server).
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

from tests.k8s import ray_start
from tests.k8s.conftest import K8S
from tests.k8s.placement_driver import read_result
from tests.k8s.raycluster import LoopbackCluster, NodeSpec
from verl_consistency.contracts import pins
from verl_consistency.contracts.env import POOL_RESOURCES
from verl_consistency.patches.hooks.ray_setup import placement

pytestmark = [pytest.mark.ray, pytest.mark.verl, pytest.mark.pinset, pytest.mark.timeout(900)]

DRIVER = Path(__file__).with_name("placement_driver.py")
NPUS = {"trainer": 4, "rollout": 2}  # the trainer node has room for a stray rollout replica
VERL = placement.installed_verl_version()
V1 = placement.has_v1_trainer(VERL)
# The trainer's pool: verl 0.9's V1 trainer_base._init_resource_pool_mgr, or 0.8.0's fully_async_policy.
TRAINER_POOL = "global_pool" if V1 else "trainer_pool"
OTHER_RELEASE_TRAINER_POOL = "trainer_pool" if V1 else "global_pool"


def manifest_rayjob() -> dict[str, Any]:
    docs = yaml.safe_load_all((K8S / "fully-async-rayjob.yaml").read_text())
    (job,) = [d for d in docs if d and d["kind"] == "RayJob"]
    return job


def node_resources(group: dict[str, Any]) -> dict[str, float]:
    """What a pod of the group offers Ray (its `ray start` flags from the manifest's
    rayStartParams, through the shell's quoting: ray_start.py), with the NPU count scaled down."""
    res = ray_start.node_resources(group)[1]
    assert res["NPU"] > 0, f"the {group['groupName']} group offers no NPU: {res}"
    res["NPU"] = float(NPUS[group["groupName"]])
    return res


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackCluster]:
    groups = manifest_rayjob()["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    c = LoopbackCluster(
        head_cpus=1,  # room for the driver-side actor only; no NPU on the head
        # 16 CPUs a node: the bundles ask for 2-3 CPUs each (verl's max_colocate_count)
        workers=[NodeSpec(g["groupName"], num_cpus=16, resources=node_resources(g)) for g in groups],
    )
    try:
        c.start()
        yield c
    finally:
        leftovers = c.stop()
        assert leftovers == [], f"ray processes left running: {leftovers}"


def run_driver(
    cluster: LoopbackCluster,
    scenarios: list[dict[str, Any]],
    tmp: Path,
    hook: bool,
    env_vars: dict[str, str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """The scenarios' placement groups, built by the installed verl in one Ray job."""
    args = [sys.executable, str(DRIVER), cluster.address, json.dumps(scenarios)]
    if hook:
        runtime_env = yaml.safe_load(manifest_rayjob()["spec"]["runtimeEnvYAML"])
        if env_vars:
            runtime_env.setdefault("env_vars", {}).update(env_vars)
        path = tmp / "runtime_env.yaml"
        path.write_text(yaml.safe_dump(runtime_env))
        args.append(str(path))
    res = subprocess.run(args, capture_output=True, text=True, timeout=600)
    out = read_result(res.stdout)
    assert res.returncode == 0, f"driver failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    assert out, f"driver failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    assert {s["verl"] for s in out.values()} == {VERL}, "the Ray workers run another verl than the test"
    return {name: s["pgs"] for name, s in out.items()}


FULL = {"name": "full", "trainer_nodes": 1, "trainer_npus": 2, "rollout_nodes": 1, "rollout_npus": 2}
# Three 1-NPU rollout replicas while the rollout node has two NPUs: one must go elsewhere or wait.
# (On verl 0.9 without hybrid replicas, so that the standalone ranks start at 0 with no trainer.)
OVERFLOW = {
    "name": "overflow",
    "trainer": False,
    "hybrid_engine": False,
    "trainer_nodes": 1,
    "trainer_npus": 2,
    "rollout_nodes": 1,
    "rollout_npus": 3,
    "ready_timeout_s": 8,
}
# Three 2-NPU trainer nodes while the trainer node has four NPUs: one must go elsewhere or wait.
TRAINER_OVERFLOW = {
    "name": "trainer_overflow",
    "rollout": False,
    "trainer_nodes": 3,
    "trainer_npus": 2,
    "rollout_nodes": 1,
    "rollout_npus": 2,
    "ready_timeout_s": 8,
}


@pytest.fixture(scope="module")
def with_hook(cluster: LoopbackCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    scenarios = [FULL, OVERFLOW, TRAINER_OVERFLOW]
    return run_driver(cluster, scenarios, tmp_path_factory.mktemp("hook"), hook=True)


@pytest.fixture(scope="module")
def without_hook(cluster: LoopbackCluster, tmp_path_factory: pytest.TempPathFactory, with_hook: Any) -> Any:
    return run_driver(cluster, [OVERFLOW, TRAINER_OVERFLOW], tmp_path_factory.mktemp("nohook"), hook=False)


@pytest.fixture(scope="module")
def wrong_map(cluster: LoopbackCluster, tmp_path_factory: pytest.TempPathFactory, without_hook: Any) -> Any:
    """The hook with the other release's trainer pool name: the map of a user who kept 0.8.0's
    setting on verl 0.9 (or the other way round)."""
    trainer, rollout = placement.TRAINER_RESOURCE, placement.ROLLOUT_RESOURCE
    wrong = f"{OTHER_RELEASE_TRAINER_POOL}={trainer},rollout_pool_={rollout}"
    tmp = tmp_path_factory.mktemp("wrongmap")
    return run_driver(cluster, [TRAINER_OVERFLOW], tmp, hook=True, env_vars={POOL_RESOURCES: wrong})


def by_pool(report: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [r for r in report if r["pg"].startswith(prefix)]


def nodes(report: list[dict[str, Any]]) -> list[str]:
    return [n for r in report for n in r["nodes"]]


def test_the_pin_set_s_verl_builds_the_pools() -> None:
    assert pins.get("upstream.verl") == VERL
    assert (pins.get("set.name") == "next") is V1


def test_every_bundle_lands_on_its_group(with_hook: dict[str, Any]) -> None:
    report = with_hook["full"]
    trainer, rollout = by_pool(report, TRAINER_POOL), by_pool(report, "rollout_pool_")
    assert len(trainer) + len(rollout) == len(report), f"a pool of another name: {report}"
    # verl's real names: one trainer pool of 2 bundles, one pool per 1-NPU standalone rollout
    # replica. verl 0.9's separate_async first makes one hybrid replica per trainer NPU on the
    # trainer's own worker group (no pool of their own), so its standalone ranks start at 2.
    first = FULL["trainer_nodes"] * FULL["trainer_npus"] if V1 else 0
    assert [r["pg"] for r in trainer] == [f"{TRAINER_POOL}verl_group_2:0"]
    assert [r["pg"] for r in rollout] == [f"rollout_pool_{first + i}verl_group_1:0" for i in range(2)]
    assert all(r["state"] == "CREATED" for r in report)
    assert nodes(trainer) == ["trainer", "trainer"]
    assert nodes(rollout) == ["rollout", "rollout"]
    for r in trainer:
        assert all(b[placement.TRAINER_RESOURCE] == placement.BUNDLE_AMOUNT for b in r["bundles"])
    for r in rollout:
        assert all(b[placement.ROLLOUT_RESOURCE] == placement.BUNDLE_AMOUNT for b in r["bundles"])
    # Each bundle still asks for one NPU: on verl 0.9 the name comes from its platform layer.
    assert all(b["NPU"] == 1 for r in report for b in r["bundles"])


def test_the_constraint_comes_from_the_hook(with_hook: dict[str, Any], without_hook: dict[str, Any]) -> None:
    # Without the hook Ray puts a rollout replica on the trainer's NPUs (here it must: the
    # rollout node has two NPUs for three replicas), and the bundles carry no group tag.
    plain = without_hook["overflow"]
    assert [r["pg"] for r in plain] == [f"rollout_pool_{i}verl_group_1:0" for i in range(3)]
    assert all(r["state"] == "CREATED" for r in plain)
    assert "trainer" in nodes(plain)
    assert not any(placement.ROLLOUT_RESOURCE in b for r in plain for b in r["bundles"])
    # With the hook the third replica waits for a rollout node instead: never the trainer node.
    pinned = with_hook["overflow"]
    assert sorted(r["state"] for r in pinned) == ["CREATED", "CREATED", "PENDING"]
    assert sorted(n for r in pinned if r["state"] == "CREATED" for n in r["nodes"]) == ["rollout", "rollout"]
    assert "trainer" not in nodes(pinned)


def test_the_trainer_pool_stays_on_the_trainer_group(
    with_hook: dict[str, Any], without_hook: dict[str, Any]
) -> None:
    """Three 2-NPU trainer placement groups, room for two on the trainer node."""
    names = [f"{TRAINER_POOL}verl_group_2_2_2:{i}" for i in range(3)]
    # Without the hook one of them takes the rollout node's NPUs.
    plain = without_hook["trainer_overflow"]
    assert [r["pg"] for r in plain] == names
    assert all(r["state"] == "CREATED" for r in plain)
    assert sorted(set(nodes(plain))) == ["rollout", "trainer"]
    # With the hook the third one waits for a trainer node.
    pinned = with_hook["trainer_overflow"]
    assert [r["pg"] for r in pinned] == names
    assert sorted(r["state"] for r in pinned) == ["CREATED", "CREATED", "PENDING"]
    assert [n for r in pinned if r["state"] == "CREATED" for n in r["nodes"]] == ["trainer"] * 4
    assert "rollout" not in nodes(pinned)


def test_a_map_with_the_other_release_s_pool_name_does_not_pin(wrong_map: dict[str, Any]) -> None:
    """The map must name this release's trainer pool: with the other one the trainer bundles carry
    no tag and spill onto the rollout group's NPUs, as with no hook at all."""
    report = wrong_map["trainer_overflow"]
    assert [r["pg"] for r in report] == [f"{TRAINER_POOL}verl_group_2_2_2:{i}" for i in range(3)]
    assert all(r["state"] == "CREATED" for r in report)
    assert "rollout" in nodes(report)
    assert not any(placement.TRAINER_RESOURCE in b for r in report for b in r["bundles"])
