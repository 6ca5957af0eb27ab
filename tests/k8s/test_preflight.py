"""`verl-consistency preflight` through its command line, against a stand-in API server.

Each test is one cluster: the ready one the flat fully-async file was written for, then one
not-ready cluster per way a run fails late (no KubeRay, a KubeRay too old for a field, another
device plugin, too few Ready NPUs, a missing label, no ReadWriteMany class, a quota, a missing
pull secret, an API server that does not answer), each asserting that its reason is named.
The API server is ``tests/k8s/apiserver_standin.py`` (a stand-in: none can run here); the
kubernetes client, the kubeconfig loading, ``kubectl kustomize`` and the preflight are real.
Every test also asserts that the preflight sent nothing but GETs.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from tests.k8s.apiserver_standin import (
    NAMESPACE,
    StandInApiServer,
    StandInCluster,
    dead_kubeconfig,
    fixture_cluster,
    fixture_namespaced,
    fixture_nodes,
    fixture_storage_classes,
    kuberay_alpha_crd,
    kuberay_crd,
    serve,
)
from tests.k8s.conftest import CHECK_FILE, FILES, REPO, kubectl
from verl_consistency.entrypoints.cli import app

FLAT = FILES["file:fully-async"]


def run(
    cluster: StandInCluster, tmp_path: Path, *args: str, monkeypatch: pytest.MonkeyPatch | None = None
) -> tuple[Result, StandInApiServer]:
    """``preflight --json ARGS`` with $KUBECONFIG pointing at a stand-in holding ``cluster``."""
    with serve(cluster) as server:
        kubeconfig = server.kubeconfig(tmp_path)
        env = {"KUBECONFIG": str(kubeconfig)}
        res = CliRunner().invoke(app, ["preflight", "--json", *args], env=env)
    methods = {r.method for r in server.requests}
    assert methods <= {"GET"}, f"the preflight must only read; it sent {methods}"
    return res, server


def report(res: Result) -> dict[str, Any]:
    assert res.exit_code in (0, 1), f"exit {res.exit_code}:\n{res.output}"
    return json.loads(res.stdout)


def check(rep: dict[str, Any], name: str) -> dict[str, Any]:
    (row,) = [c for c in rep["checks"] if c["check"] == name]
    return row


def statuses(rep: dict[str, Any]) -> dict[str, str]:
    return {c["check"]: c["status"] for c in rep["checks"]}


def variant(
    tmp_path: Path, change: Callable[[list[dict[str, Any]]], None], name: str = "variant.yaml"
) -> Path:
    """The flat fully-async file with ``change`` applied to its documents, written to tmp_path."""
    docs = [d for d in yaml.safe_load_all(FLAT.read_text()) if d]
    change(docs)
    out = tmp_path / name
    out.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return out


def rayjob(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "RayJob")


def pod_specs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    job = rayjob(docs)
    cluster = job["spec"]["rayClusterSpec"]
    specs = [cluster["headGroupSpec"]["template"]["spec"], job["spec"]["submitterPodTemplate"]["spec"]]
    specs += [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    specs += [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Job"]
    return specs


def with_group_resources(docs: list[dict[str, Any]]) -> None:
    """Ray resources as KubeRay >= 1.5 takes them: per group ``resources`` (and ``backoffLimit``, 1.2)."""
    job = rayjob(docs)
    job["spec"]["backoffLimit"] = 0
    cluster = job["spec"]["rayClusterSpec"]
    cluster["headGroupSpec"]["resources"] = {"CPU": "0", "NPU": "0"}
    cluster["headGroupSpec"]["rayStartParams"].pop("resources", None)
    for g in cluster["workerGroupSpecs"]:
        g["resources"] = {"NPU": "8", f"verl_consistency_{g['groupName']}": "1000"}
        g.setdefault("rayStartParams", {}).pop("resources", None)


def with_start_params(docs: list[dict[str, Any]]) -> None:
    """The same resources as every KubeRay from 1.1 takes them: ``rayStartParams.resources``."""
    job = rayjob(docs)
    job["spec"].pop("backoffLimit", None)
    cluster = job["spec"]["rayClusterSpec"]
    for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        res = g.pop("resources", None) or {"NPU": "0"}
        g.setdefault("rayStartParams", {})["resources"] = json.dumps({k: int(v) for k, v in res.items()})


def test_a_ready_cluster_passes_every_check_with_gets_only(tmp_path: Path) -> None:
    res, server = run(StandInCluster(), tmp_path)
    rep = report(res)
    assert res.exit_code == 0
    assert rep["ready"]
    assert rep["exit_code"] == 0
    got = statuses(rep)
    assert list(got) == [
        "kuberay",
        "rayjob-fields",
        "accelerators",
        "node-label",
        "storage",
        "quota",
        "image",
    ]
    assert {k: v for k, v in got.items() if k != "image"} == dict.fromkeys(list(got)[:-1], "ok")
    # The image row may warn (a placeholder image without a registry on a 3-node cluster): not a failure.
    assert got["image"] in ("ok", "warn")
    assert "KubeRay 1.7" in check(rep, "kuberay")["found"]
    assert "quay.io/kuberay/operator:v1.7.0" in check(rep, "kuberay")["found"]
    assert "npu-a2-0: 8" in check(rep, "accelerators")["found"]
    assert "class nfs-client (the default)" in check(rep, "storage")["found"]
    assert rep["namespace"] == NAMESPACE
    assert rep["context"] == "standin"
    assert rep["server_version"] == "v1.30.4"
    assert rep["manifest"].endswith("k8s/fully-async-rayjob.yaml")
    assert {r.path for r in server.requests} == {
        "/version",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayjobs.ray.io",
        "/apis/apps/v1/deployments",
        "/api/v1/nodes",
        "/apis/storage.k8s.io/v1/storageclasses",
        f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims",
        f"/api/v1/namespaces/{NAMESPACE}/resourcequotas",
    }


def test_the_table_names_each_check_and_the_verdict(tmp_path: Path) -> None:
    with serve(StandInCluster(crd=None)) as server:
        env = {"KUBECONFIG": str(server.kubeconfig(tmp_path))}
        res = CliRunner().invoke(app, ["preflight"], env=env)
    assert res.exit_code == 1, res.output
    for name in ("kuberay", "rayjob-fields", "accelerators", "node-label", "storage", "quota", "image"):
        assert name in res.stdout
    assert "NOT READY: kuberay will fail" in res.stdout
    assert "is not installed" in res.stdout


def test_no_kuberay_crd_is_a_failure_that_says_how_to_install_it(tmp_path: Path) -> None:
    res, _ = run(StandInCluster(crd=None, operators=[]), tmp_path)
    rep = report(res)
    assert res.exit_code == 1
    assert not rep["ready"]
    row = check(rep, "kuberay")
    assert row["status"] == "fail"
    assert "CRD rayjobs.ray.io is not installed" in row["found"]
    assert "helm repo add kuberay https://ray-project.github.io/kuberay-helm/" in row["next"]
    assert "helm install kuberay-operator kuberay/kuberay-operator --version 1.7.0" in row["next"]
    assert check(rep, "rayjob-fields")["status"] == "warn"


def test_a_kuberay_too_old_for_group_resources_names_the_fields_and_release(tmp_path: Path) -> None:
    manifest = variant(tmp_path, with_group_resources)
    old = copy.deepcopy(fixture_cluster("Deployment"))
    old["spec"]["template"]["spec"]["containers"][0]["image"] = "quay.io/kuberay/operator:v1.4.2"
    res, _ = run(
        StandInCluster(crd=kuberay_crd("v1.4.2"), operators=[old]), tmp_path, "--manifest", str(manifest)
    )
    rep = report(res)
    assert res.exit_code == 1
    assert check(rep, "kuberay")["status"] == "ok"
    assert "that of KubeRay 1.4" in check(rep, "kuberay")["found"]
    row = check(rep, "rayjob-fields")
    assert row["status"] == "fail"
    for group in (0, 1):
        assert (
            f"spec.rayClusterSpec.workerGroupSpecs[{group}].resources (added in KubeRay 1.5)" in row["found"]
        )
    assert "spec.rayClusterSpec.headGroupSpec.resources (added in KubeRay 1.5)" in row["found"]
    assert "upgrade KubeRay to 1.5 or later" in row["next"]


def test_kuberay_1_1_names_backoff_limit_and_accepts_start_params(tmp_path: Path) -> None:
    crd = kuberay_crd("v1.1.0")
    res, _ = run(
        StandInCluster(crd=crd), tmp_path, "--manifest", str(variant(tmp_path, with_group_resources))
    )
    row = check(report(res), "rayjob-fields")
    assert row["status"] == "fail"
    assert "spec.backoffLimit (added in KubeRay 1.2)" in row["found"]
    assert "upgrade KubeRay to 1.5 or later" in row["next"]  # the newest release any field needs
    # The same pools, with their Ray resources in rayStartParams: every release from 1.1 keeps them.
    compatible = variant(tmp_path, with_start_params, "compatible.yaml")
    res, _ = run(StandInCluster(crd=crd), tmp_path, "--manifest", str(compatible))
    rep = report(res)
    assert check(rep, "rayjob-fields")["status"] == "ok", check(rep, "rayjob-fields")
    assert "that of KubeRay 1.1" in check(rep, "kuberay")["found"]


def test_the_check_job_needs_no_kuberay(tmp_path: Path) -> None:
    res, _ = run(StandInCluster(crd=None, operators=[]), tmp_path, "--manifest", str(CHECK_FILE))
    rep = report(res)
    assert check(rep, "kuberay") == {
        "check": "kuberay",
        "status": "ok",
        "found": "not needed: the manifest has no RayJob",
        "next": "",
    }
    assert "Job verl-consistency-check 1× " in check(rep, "accelerators")["found"]
    assert check(rep, "accelerators")["status"] == "ok"


def test_an_operator_newer_than_its_crd_is_a_warning(tmp_path: Path) -> None:
    # `helm upgrade` to 1.7 leaves a 1.4 CRD: the operator is new, the API server prunes as 1.4.
    res, _ = run(StandInCluster(crd=kuberay_crd("v1.4.2")), tmp_path)
    row = check(report(res), "kuberay")
    assert row["status"] == "warn"
    assert "the operator (1.7.0) is not the CRD's release" in row["found"]
    assert "helm upgrade" in row["next"]


def test_an_operator_older_than_its_crd_does_not_act_on_newer_fields(tmp_path: Path) -> None:
    # A 1.7 CRD keeps per-group resources, but a 1.4 operator never reads them.
    old = copy.deepcopy(fixture_cluster("Deployment"))
    old["spec"]["template"]["spec"]["containers"][0]["image"] = "quay.io/kuberay/operator:v1.4.2"
    manifest = variant(tmp_path, with_group_resources)
    res, _ = run(StandInCluster(operators=[old]), tmp_path, "--manifest", str(manifest))
    rep = report(res)
    assert check(rep, "kuberay")["status"] == "warn"
    assert "the operator (1.4.2) is not the CRD's release" in check(rep, "kuberay")["found"]
    row = check(rep, "rayjob-fields")
    assert row["status"] == "fail"
    assert "the operator (1.4.2) does not act on them" in row["found"]
    assert "spec.rayClusterSpec.workerGroupSpecs[].resources (added in KubeRay 1.5)" in row["found"]
    assert "upgrade the operator to 1.5 or later" in row["next"]


def operator(release: str) -> dict[str, Any]:
    """The Helm-installed operator Deployment of the fixture, as the chart of ``release`` deploys it."""
    dep = copy.deepcopy(fixture_cluster("Deployment"))
    dep["metadata"]["labels"].update(
        {"app.kubernetes.io/version": release, "helm.sh/chart": f"kuberay-operator-{release}"}
    )
    # KubeRay published its operator image on Docker Hub (kuberay/operator) before quay.io.
    dep["spec"]["template"]["spec"]["containers"][0]["image"] = f"kuberay/operator:v{release}"
    return dep


UPGRADE = (
    "upgrade KubeRay to 1.7.0, its CRDs first (helm upgrade leaves them): kubectl apply --server-side "
    "--force-conflicts -k 'github.com/ray-project/kuberay/ray-operator/config/crd?ref=v1.7.0'; then "
    "helm upgrade kuberay-operator kuberay/kuberay-operator --version 1.7.0"
)


def test_a_kuberay_serving_only_v1alpha1_is_named_and_gets_an_upgrade(tmp_path: Path) -> None:
    cluster = StandInCluster(crd=kuberay_alpha_crd(), operators=[operator("0.6.0")])
    res, _ = run(cluster, tmp_path)
    rep = report(res)
    row = check(rep, "kuberay")
    assert res.exit_code == 1
    assert row["status"] == "fail"
    assert "CRD rayjobs.ray.io (v1alpha1) serves RayJob only as ray.io/v1alpha1, not v1" in row["found"]
    assert "operator kuberay/operator:v0.6.0 (KubeRay 0.6.0)" in row["found"]
    assert row["next"].startswith(UPGRADE)
    assert "helm install" not in row["next"]  # KubeRay is there: an install would clash with it
    assert check(rep, "rayjob-fields")["status"] == "warn"


def test_a_v1alpha1_kuberay_is_named_from_discovery_when_its_crd_is_unreadable(tmp_path: Path) -> None:
    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayjobs.ray.io"
    cluster = StandInCluster(crd=kuberay_alpha_crd(), operators=[operator("0.6.0")], forbidden={crd_path})
    res, server = run(cluster, tmp_path)
    row = check(report(res), "kuberay")
    assert row["status"] == "fail"
    assert "the API serves RayJob only as ray.io/v1alpha1, not v1" in row["found"]
    assert row["next"].startswith(UPGRADE)
    asked = [r.path for r in server.requests]
    assert asked.index("/apis/ray.io/v1") < asked.index("/apis/ray.io/v1alpha1")


@pytest.mark.parametrize(
    ("nodes", "resource", "overlay"),
    [
        (["hami-910b-0", "hami-910b-1"], "huawei.com/Ascend910B3", "hami"),
        (["cce-npu-0"], "huawei.com/ascend-1980", "cce"),
        (["gpu-h100-0"], "nvidia.com/gpu", "nvidia"),
    ],
)
def test_nodes_of_another_device_plugin_get_the_overlay_that_fits(
    tmp_path: Path, nodes: list[str], resource: str, overlay: str
) -> None:
    fixture = fixture_nodes()
    res, _ = run(StandInCluster(nodes=[fixture[n] for n in [*nodes, "cpu-0"]]), tmp_path)
    rep = report(res)
    row = check(rep, "accelerators")
    assert res.exit_code == 1
    assert row["status"] == "fail"
    assert "no Ready node offers huawei.com/Ascend910" in row["found"]
    assert f"{resource} is on {len(nodes)} Ready node" in row["found"]
    assert f"--overlay {overlay}" in row["next"]


def test_the_suggested_overlay_asks_for_the_nodes_device_name(tmp_path: Path) -> None:
    kubectl()
    fixture = fixture_nodes()
    cluster = StandInCluster(nodes=[fixture["hami-910b-0"], fixture["hami-910b-1"], fixture["cpu-0"]])
    res, _ = run(cluster, tmp_path, "--overlay", "hami")
    rep = report(res)
    assert rep["manifest"].endswith("k8s/overlays/hami")
    assert check(rep, "accelerators")["status"] == "ok"
    assert "huawei.com/Ascend910B3" in check(rep, "accelerators")["found"]
    # The overlay changes the device name, not the placeholder nodeSelector: HAMi nodes lack it.
    row = check(rep, "node-label")
    assert row["status"] == "fail"
    assert "accelerator=huawei-Ascend910 is missing on 2 of the 2 nodes" in row["found"]


def test_too_few_ready_npu_nodes(tmp_path: Path) -> None:
    cluster = StandInCluster()
    ready = next(c for c in cluster.node("npu-a2-1")["status"]["conditions"] if c["type"] == "Ready")
    ready.update(status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting node status.")
    res, _ = run(cluster, tmp_path)
    rep = report(res)
    row = check(rep, "accelerators")
    assert res.exit_code == 1
    assert row["status"] == "fail"
    assert "Ready nodes with huawei.com/Ascend910: 1 (npu-a2-0: 8)" in row["found"]
    assert "too few: worker group rollout: a pod requests huawei.com/Ascend910 8" in row["found"]
    # The node that would make it fit is named, with the condition that keeps it out.
    assert (
        "npu-a2-1 is NotReady (Ready=Unknown, NodeStatusUnknown: Kubelet stopped posting node status.)"
        in row["found"]
    )
    assert row["next"].startswith("bring it back: `kubectl describe node npu-a2-1`")
    # The label and taints admit the pods: the node-label row does not repeat the shortage as its own.
    assert check(rep, "node-label")["status"] == "warn"
    assert "their devices are too few (see accelerators)" in check(rep, "node-label")["found"]


def test_every_npu_node_not_ready_names_them_not_a_missing_device_plugin(tmp_path: Path) -> None:
    cluster = StandInCluster()
    down = next(c for c in cluster.node("npu-a2-0")["status"]["conditions"] if c["type"] == "Ready")
    down.update(
        status="False",
        reason="KubeletNotReady",
        message="container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady",
    )
    cluster.node("npu-a2-1")["spec"]["unschedulable"] = True  # `kubectl cordon npu-a2-1`
    res, _ = run(cluster, tmp_path)
    rep = report(res)
    row = check(rep, "accelerators")
    assert res.exit_code == 1
    assert row["status"] == "fail"
    assert "no Ready node offers huawei.com/Ascend910" in row["found"]
    assert "2 nodes with it not Ready" in row["found"]
    assert (
        "npu-a2-0 is NotReady (Ready=False, KubeletNotReady: container runtime network not ready"
        in row["found"]
    )
    assert "npu-a2-1 is cordoned (spec.unschedulable)" in row["found"]
    assert "device plugin" not in row["next"]  # the plugin is there: the nodes are down
    assert "kubectl describe node npu-a2-0" in row["next"]
    assert "kubectl uncordon <node>" in row["next"]
    assert check(rep, "node-label")["status"] == "warn"  # nothing to place pods on: not its to say


def test_too_little_memory_on_the_npu_nodes(tmp_path: Path) -> None:
    cluster = StandInCluster()
    for name in ("npu-a2-0", "npu-a2-1"):
        cluster.node(name)["status"]["allocatable"]["memory"] = "200Gi"
    rep = report(run(cluster, tmp_path)[0])
    assert check(rep, "accelerators")["status"] == "ok"
    row = check(rep, "node-label")
    assert row["status"] == "fail"
    assert (
        "worker group trainer: a pod requests memory 256Gi, the most left on a node is 200Gi" in row["found"]
    )


def test_too_few_npus_per_node_for_a3(tmp_path: Path) -> None:
    kubectl()
    res, _ = run(StandInCluster(), tmp_path, "--overlay", "a3-16npu")
    row = check(report(res), "accelerators")
    assert row["status"] == "fail"
    assert "a pod requests huawei.com/Ascend910 16, the most left on a node is 8" in row["found"]


def test_a_missing_node_label_is_named(tmp_path: Path) -> None:
    cluster = StandInCluster()
    for name in ("npu-a2-0", "npu-a2-1"):
        del cluster.node(name)["metadata"]["labels"]["accelerator"]
    res, _ = run(cluster, tmp_path)
    rep = report(res)
    assert check(rep, "accelerators")["status"] == "ok"
    row = check(rep, "node-label")
    assert res.exit_code == 1
    assert row["status"] == "fail"
    assert "worker group trainer: accelerator=huawei-Ascend910 is missing on 2 of the 2 nodes" in row["found"]
    assert "kubectl label node <node> accelerator=huawei-Ascend910" in row["next"]


def test_an_untolerated_taint_is_named(tmp_path: Path) -> None:
    cluster = StandInCluster()
    cluster.node("npu-a2-1")["spec"]["taints"].append(
        {"key": "maintenance", "value": "true", "effect": "NoExecute"}
    )
    row = check(report(run(cluster, tmp_path)[0]), "node-label")
    assert row["status"] == "fail"
    assert "node npu-a2-1 has taints it does not tolerate: maintenance=true:NoExecute" in row["found"]


def _storage(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return check(report(run(StandInCluster(**kw), tmp_path)[0]), "storage")


def test_no_default_storage_class(tmp_path: Path) -> None:
    classes = fixture_storage_classes()
    row = _storage(tmp_path, storage_classes=[classes["csi-disk"], classes["csi-sfsturbo"]])
    assert row["status"] == "fail"
    assert "verl-consistency-dump: it names no class and there is no default class" in row["found"]
    assert "csi-disk, csi-sfsturbo" in row["found"]


def test_a_default_class_without_read_write_many(tmp_path: Path) -> None:
    row = _storage(tmp_path, storage_classes=[fixture_storage_classes()["local-path"]])
    assert row["status"] == "fail"
    assert (
        "class local-path (the default), provisioner rancher.io/local-path: ReadWriteOnce only"
        in row["found"]
    )


def test_existing_bound_claims_need_no_class(tmp_path: Path) -> None:
    row = _storage(tmp_path, storage_classes=[], claims=fixture_namespaced("PersistentVolumeClaim"))
    assert row["status"] == "ok"
    assert "verl-consistency-dump: exists, Bound, ReadWriteMany" in row["found"]


@pytest.mark.parametrize(("cls", "status"), [("csi-sfsturbo", "ok"), ("csi-disk", "fail")])
def test_a_named_class_is_judged_by_its_csi_driver(tmp_path: Path, cls: str, status: str) -> None:
    def name_class(docs: list[dict[str, Any]]) -> None:
        for d in docs:
            if d["kind"] == "PersistentVolumeClaim":
                d["spec"]["storageClassName"] = cls

    manifest = variant(tmp_path, name_class)
    res, _ = run(
        StandInCluster(storage_classes=list(fixture_storage_classes().values())),
        tmp_path,
        "--manifest",
        str(manifest),
    )
    row = check(report(res), "storage")
    assert row["status"] == status
    assert f"verl-consistency-dump: class {cls}, provisioner everest-csi-provisioner" in row["found"]


def test_a_quota_too_small_for_the_npus(tmp_path: Path) -> None:
    (quota,) = fixture_namespaced("ResourceQuota")
    res, _ = run(StandInCluster(quotas=[quota]), tmp_path)
    assert check(report(res), "quota")["status"] == "ok"  # 16 NPUs of 16
    quota["status"]["used"]["requests.huawei.com/Ascend910"] = "8"  # another team's job holds 8
    res, _ = run(StandInCluster(quotas=[quota]), tmp_path)
    rep = report(res)
    row = check(rep, "quota")
    assert res.exit_code == 1
    assert row["status"] == "fail"
    assert row["found"] == "team-npu requests.huawei.com/Ascend910: needs 16, 8 left of 16"
    assert "larger quota in vc" in row["next"]


def test_a_quota_on_limits_refuses_containers_without_them(tmp_path: Path) -> None:
    def drop_limits(docs: list[dict[str, Any]]) -> None:
        spec = rayjob(docs)["spec"]["submitterPodTemplate"]["spec"]
        del spec["containers"][0]["resources"]["limits"]

    (quota,) = fixture_namespaced("ResourceQuota")
    res, _ = run(StandInCluster(quotas=[quota]), tmp_path, "--manifest", str(variant(tmp_path, drop_limits)))
    row = check(report(res), "quota")
    assert row["status"] == "fail"
    assert "team-npu covers limits.cpu: RayJob submitter (ray-job-submitter) sets none" in row["found"]


def test_a_missing_image_pull_secret(tmp_path: Path) -> None:
    def pull_with(docs: list[dict[str, Any]]) -> None:
        for spec in pod_specs(docs):
            spec["imagePullSecrets"] = [{"name": "regcred"}]

    manifest = variant(tmp_path, pull_with)
    res, server = run(StandInCluster(), tmp_path, "--manifest", str(manifest))
    rep = report(res)
    row = check(rep, "image")
    assert res.exit_code == 1
    assert row["status"] == "fail"
    assert f"imagePullSecret regcred is not in namespace {NAMESPACE}" in row["found"]
    assert "create secret docker-registry regcred" in row["next"]
    (get,) = [r for r in server.requests if r.path.endswith("/secrets/regcred")]
    assert "as=PartialObjectMetadata" in get.accept  # its metadata only, never its data

    res, _ = run(
        StandInCluster(secrets=fixture_namespaced("PartialObjectMetadata")),
        tmp_path,
        "--manifest",
        str(manifest),
    )
    row = check(report(res), "image")
    assert row["status"] != "fail"
    assert "imagePullSecret regcred exists" in row["found"]


def test_an_image_other_than_the_one_built_is_a_warning(tmp_path: Path) -> None:
    res, _ = run(StandInCluster(), tmp_path, "--image", "registry.example.com/ml/verl-consistency:7")
    row = check(report(res), "image")
    assert row["status"] == "warn"
    assert "not registry.example.com/ml/verl-consistency:7 (--image)" in row["found"]
    assert "without a registry, on a cluster of several nodes" in row["found"]


def test_the_built_image_pushed_to_a_registry_is_yours_without_image(tmp_path: Path) -> None:
    def pushed(docs: list[dict[str, Any]]) -> None:
        for spec in pod_specs(docs):
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                c["image"] = f"registry.example.com/ml/{c['image']}"

    res, _ = run(StandInCluster(), tmp_path, "--manifest", str(variant(tmp_path, pushed)))
    row = check(report(res), "image")
    assert row["status"] == "ok", row  # the tag `make image` wrote, under the registry the nodes pull from
    res, _ = run(StandInCluster(), tmp_path, "--manifest", str(variant(tmp_path, pushed)), "--image", "x:1")
    assert check(report(res), "image")["status"] == "warn"  # --image names exactly one


def test_forbidden_reads_are_warnings_not_failures(tmp_path: Path) -> None:
    forbidden = {"/api/v1/nodes", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayjobs.ray.io"}
    res, server = run(StandInCluster(forbidden=forbidden), tmp_path)
    rep = report(res)
    assert res.exit_code == 0
    assert check(rep, "accelerators")["status"] == "warn"
    assert "could not read nodes (HTTP 403 Forbidden)" in check(rep, "accelerators")["found"]
    kuberay = check(rep, "kuberay")
    assert kuberay["status"] == "warn"
    assert "the API serves ray.io/v1 rayjobs" in kuberay["found"]
    assert "/apis/ray.io/v1" in {r.path for r in server.requests}  # discovery, readable by everyone


def test_an_api_server_that_does_not_answer_exits_2(tmp_path: Path) -> None:
    kubeconfig = dead_kubeconfig(tmp_path)
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    res = CliRunner().invoke(app, ["preflight", "--kubeconfig", str(kubeconfig)])
    assert res.exit_code == 2
    assert f"cannot read the cluster: {server} did not answer" in res.stderr


def test_context_and_namespace_are_found_as_kubectl_finds_them(tmp_path: Path) -> None:
    with serve(StandInCluster()) as server:
        kubeconfig = server.kubeconfig(tmp_path, namespace=None, extra_context=True)
        env = {"KUBECONFIG": str(kubeconfig)}
        default = CliRunner().invoke(app, ["preflight", "--json"], env=env)
        other = CliRunner().invoke(app, ["preflight", "--json", "-n", "team-b"], env=env)
        elsewhere = CliRunner().invoke(app, ["preflight", "--context", "elsewhere"], env=env)
    assert json.loads(default.stdout)["namespace"] == "default"  # the context names none
    assert json.loads(other.stdout)["namespace"] == "team-b"
    assert "/api/v1/namespaces/team-b/resourcequotas" in {r.path for r in server.requests}
    assert elsewhere.exit_code == 2
    assert "http://127.0.0.1:9 did not answer" in elsewhere.stderr
    assert {r.method for r in server.requests} == {"GET"}


def test_help() -> None:
    res = CliRunner().invoke(app, ["preflight", "--help"])
    assert res.exit_code == 0
    for option in (
        "--manifest",
        "--overlay",
        "--mode",
        "--namespace",
        "--context",
        "--kubeconfig",
        "--image",
        "--json",
    ):
        assert option in res.stdout
    assert "only reads" in res.stdout


def test_usage_errors_exit_2_and_say_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: RayJob\nspec:\n  entrypoint: [unclosed\n")
    res = CliRunner().invoke(app, ["preflight", "--manifest", str(bad)])
    assert res.exit_code == 2
    assert f"{bad}:4: not valid YAML" in res.stderr
    res = CliRunner().invoke(app, ["preflight", "--overlay", "no-such-overlay"])
    assert res.exit_code == 2
    assert "no overlay 'no-such-overlay'" in res.stderr
    assert "hami" in res.stderr
    res = CliRunner().invoke(app, ["preflight", "--manifest", str(FLAT), "--overlay", "hami"])
    assert res.exit_code == 2
    assert "not both" in res.stderr
    res = CliRunner().invoke(app, ["preflight", "--manifest", str(FLAT), "--mode", "hybrid"])
    assert res.exit_code == 2
    assert "is a fully-async run, not hybrid" in res.stderr


def test_make_preflight_passes_overlay_and_namespace_and_its_exit_code(tmp_path: Path) -> None:
    kubectl()
    fixture = fixture_nodes()
    cluster = StandInCluster(nodes=[fixture["hami-910b-0"], fixture["hami-910b-1"], fixture["cpu-0"]])
    with serve(cluster) as server:
        env = {**os.environ, "KUBECONFIG": str(server.kubeconfig(tmp_path))}
        # This interpreter instead of .venv-preflight's CLI: the test never builds a venv.
        cmd = f"{sys.executable} -m verl_consistency.entrypoints preflight"
        args = [
            "preflight",
            "OVERLAY=hami",
            "NAMESPACE=team-b",
            "PREFLIGHT_ARGS=--json",
            f"PREFLIGHT_CMD={cmd}",
        ]
        res = subprocess.run(
            ["make", "-s", "--no-print-directory", *args], cwd=REPO, env=env, capture_output=True, text=True
        )
    assert res.returncode == 1, res.stderr  # the CLI's "something will fail" (test_preflight_make.py)
    rep = json.loads(res.stdout)
    assert rep["namespace"] == "team-b"
    assert rep["manifest"].endswith("k8s/overlays/hami")
    assert check(rep, "accelerators")["status"] == "ok"
    assert check(rep, "node-label")["status"] == "fail"
    assert {r.method for r in server.requests} == {"GET"}
