"""The preflight's tables hold against what they describe: KubeRay's CRDs, the overlays, the Makefile.

- ``kuberay_fields.FIELDS_ADDED`` (which release added which RayJob field) against KubeRay's own
  RayJob CRD at each release tag (the stored schemas of ``crds/``, every one of them, as the
  stand-in serves them), and the stored v1.7.0 schema against the full v1.7.0 CRD
  (``/work/shared/kuberay``) where it is present;
- ``nodes.DEVICE_PLUGINS`` (device name → overlay) against each overlay rendered by
  ``kubectl kustomize``;
- ``checks.default_image`` against ``make -s image-name`` (and IMAGE_A3, IMAGE_CUDA, PINS=next);
- the kubeconfig-less path: the in-cluster service account and the pod's own namespace.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s import kuberay_crds
from tests.k8s.apiserver_standin import NAMESPACE, StandInCluster, fixture_storage_classes, kuberay_crd, serve
from tests.k8s.conftest import FILES, K8S, REPO, extra_crd, kubectl, render
from verl_consistency.entrypoints.preflight import cluster, manifest, nodes
from verl_consistency.entrypoints.preflight import kuberay_fields as kf
from verl_consistency.entrypoints.preflight.checks import default_image, has_registry
from verl_consistency.entrypoints.preflight.storage import rwx_support

TAGS = {
    "v1.0.0": None,
    "v1.1.0": "1.1",
    "v1.2.2": "1.2",
    "v1.3.2": "1.3",
    "v1.4.2": "1.4",
    "v1.5.2": "1.5",
    "v1.6.2": "1.6",
    "v1.7.0": "1.7",
}


def test_every_stored_crd_is_checked_against_the_table() -> None:
    assert list(TAGS) == list(kuberay_crds.stored())


def minor(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


@pytest.mark.parametrize(("tag", "release"), TAGS.items())
def test_each_kuberay_crd_implies_its_own_release(tag: str, release: str | None) -> None:
    schema = kf.served_schema(kuberay_crd(tag))
    assert schema is not None
    implied = kf.implied_release(schema)
    assert implied.release == release
    assert implied.newest_known == (tag == "v1.7.0")


@pytest.mark.parametrize("tag", TAGS)
def test_a_field_is_in_every_release_from_the_one_that_added_it(tag: str) -> None:
    schema = kf.served_schema(kuberay_crd(tag))
    assert schema is not None
    have = TAGS[tag]
    for release, paths in kf.FIELDS_ADDED.items():
        for path in paths:
            expected = have is not None and minor(have) >= minor(release)
            assert kf.has_field(schema, path) == expected, f"{path} (added in {release}) in {tag}"


def _full_crd() -> Path:
    """The full v1.7.0 RayJob CRD: $VERL_CONSISTENCY_KUBERAY_CRD, else shared/kuberay beside the
    checkout (or one level up, from a git worktree)."""
    named = extra_crd()
    if named is not None:
        return named
    candidates = [base / "shared" / "kuberay" / "ray.io_rayjobs.v1.7.0.yaml" for base in REPO.parents[:2]]
    return next((c for c in candidates if c.is_file()), candidates[0])


def test_the_trimmed_crd_prunes_what_the_full_one_prunes() -> None:
    full_path = _full_crd()
    if not full_path.is_file():
        pytest.skip(f"the full KubeRay v1.7.0 CRD is not at {full_path}")
    full = kf.served_schema(yaml.load(full_path.read_text(), Loader=yaml.CSafeLoader))
    trimmed = kf.served_schema(kuberay_crd("v1.7.0"))
    assert full is not None
    assert trimmed is not None
    for source in FILES.values():
        (job,) = [d for d in yaml.safe_load_all(source.read_text()) if d and d["kind"] == "RayJob"]
        job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelectr"] = {"x": "y"}
        job["spec"]["rayClusterSpec"]["bogus"] = 1
        assert kf.unknown_fields(job, full) == kf.unknown_fields(job, trimmed)
        assert {u.path for u in kf.unknown_fields(job, trimmed)} == {
            "spec.rayClusterSpec.bogus",
            "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.nodeSelectr",
        }
    assert kf.implied_release(full) == kf.implied_release(trimmed)


def test_unknown_fields_keeps_maps_and_preserved_objects() -> None:
    schema = {
        "properties": {
            "spec": {
                "properties": {
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "items": {"type": "array", "items": {"properties": {"name": {"type": "string"}}}},
                }
            }
        }
    }
    obj = {
        "spec": {"labels": {"a": "b"}, "free": {"x": 1}, "items": [{"name": "n"}, {"nme": "m"}], "extra": 1}
    }
    got = kf.unknown_fields(obj, schema)
    assert [u.path for u in got] == ["spec.items[1].nme", "spec.extra"]
    assert [u.generic_path for u in got] == ["spec.items[].nme", "spec.extra"]


@pytest.mark.parametrize(
    "image", ["quay.io/kuberay/operator:v1.4.2", "kuberay/operator:1.4.2", "x/op:v1.4.2-rc.1"]
)
def test_the_operator_release_is_read_from_its_image_tag(image: str) -> None:
    assert kf.release_from_image(image) == "1.4.2"


def test_no_release_from_an_untagged_image() -> None:
    assert kf.release_from_image("quay.io/kuberay/operator@sha256:0123") is None


@pytest.mark.parametrize(("resource", "entry"), nodes.DEVICE_PLUGINS.items())
def test_the_suggested_overlay_asks_for_that_device_name(resource: str, entry: tuple[str, str]) -> None:
    kubectl()
    _, overlay = entry
    _, docs = render(f"kustomize:overlays/{overlay}")
    groups = [g for g in manifest.Manifest(overlay, docs).pod_groups() if g.name.startswith("worker group")]
    assert groups
    assert all(set(g.device_limits()) == {resource} for g in groups), [g.device_limits() for g in groups]


def test_every_device_name_an_overlay_asks_for_is_known() -> None:
    kubectl()
    asked = set()
    for folder in sorted((K8S / "overlays").glob("*/kustomization.yaml")):
        _, docs = render(f"kustomize:overlays/{folder.parent.name}")
        asked |= {r for g in manifest.Manifest("", docs).pod_groups() for r in g.device_limits()}
    assert asked <= set(nodes.DEVICE_PLUGINS)


def make_var(name: str, *args: str) -> str:
    res = subprocess.run(
        ["make", "-s", "--no-print-directory", *args, "--eval", "print-%: ; @echo $($*)", f"print-{name}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout.strip()


def test_the_default_image_is_what_make_image_name_prints() -> None:
    printed = subprocess.run(
        ["make", "-s", "image-name"], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert default_image("current", "ascend-a2") == printed.stdout.strip()
    assert default_image("current", "ascend-a3") == make_var("IMAGE_A3")
    assert default_image("current", "nvidia") == make_var("IMAGE_CUDA")
    assert default_image("next", "ascend-a2") == make_var("IMAGE", "PINS=next")


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("verl-consistency:0.1.0", False),
        ("team/verl-consistency:0.1.0", False),
        ("registry.example.com/ml/verl-consistency:0.1.0", True),
        ("localhost:5000/verl-consistency:1", True),
        ("localhost/verl-consistency:1", True),
    ],
)
def test_an_image_names_a_registry_when_its_first_part_is_a_host(image: str, registry: bool) -> None:
    assert has_registry(image) == registry


@pytest.mark.parametrize(
    ("name", "rwx"),
    [("nfs-client", True), ("local-path", False), ("csi-sfsturbo", True), ("csi-disk", False)],
)
def test_read_write_many_is_told_by_the_provisioner(name: str, rwx: bool) -> None:
    assert rwx_support(fixture_storage_classes()[name]) is rwx


def test_an_unknown_provisioner_is_not_guessed() -> None:
    assert rwx_support({"provisioner": "example.com/some-csi"}) is None


NPU, GPU = "huawei.com/Ascend910", "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("taint", "tolerations", "ok"),
    [
        (
            {"key": NPU, "effect": "NoSchedule"},
            [{"key": NPU, "operator": "Exists", "effect": "NoSchedule"}],
            True,
        ),
        (
            {"key": GPU, "value": "present", "effect": "NoSchedule"},
            [{"key": GPU, "operator": "Exists"}],
            True,
        ),
        ({"key": "a", "value": "x", "effect": "NoSchedule"}, [{"key": "a", "value": "y"}], False),
        (
            {"key": "a", "value": "x", "effect": "NoExecute"},
            [{"key": "a", "value": "x", "effect": "NoSchedule"}],
            False,
        ),
        ({"key": "any", "effect": "NoSchedule"}, [{"operator": "Exists"}], True),
    ],
)
def test_tolerations_match_as_kubernetes_matches_them(
    taint: dict[str, Any], tolerations: list, ok: bool
) -> None:
    assert nodes.tolerated(taint, tolerations) == ok


def test_in_cluster_config_and_the_pods_namespace_without_a_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a pod (no kubeconfig), the service account's config and namespace, as kubectl does.
    The pod is a stand-in too: its service-account files, and the https in-cluster address
    replaced by the stand-in server's."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    sa = tmp_path / "namespace"
    sa.write_text(NAMESPACE + "\n")
    monkeypatch.setattr(cluster, "SA_NAMESPACE", sa)
    with serve(StandInCluster()) as server:

        def load_incluster_config(client_configuration: Any) -> None:
            client_configuration.host = server.url

        monkeypatch.setattr(cluster.config, "load_incluster_config", load_incluster_config)
        api, target = cluster.connect(None, None, None)
        with api:
            snap = cluster.read(api, target, [])
    assert target == cluster.Target("in-cluster", server.url, NAMESPACE)
    assert len(snap.nodes) == 3
    assert snap.server_version == "v1.30.4"
    assert f"/api/v1/namespaces/{NAMESPACE}/resourcequotas" in {r.path for r in server.requests}


def test_no_kubeconfig_outside_a_pod_is_unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(cluster.Unreachable, match="no kubeconfig"):
        cluster.connect(None, None, None)
    with pytest.raises(cluster.Unreachable, match="no such file"):
        cluster.connect(None, Path(tmp_path / "missing"), None)
