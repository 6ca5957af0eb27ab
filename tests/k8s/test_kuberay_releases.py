"""What each KubeRay release from 1.1.0 to 1.7.0 makes of a RayJob: the stored CRDs and the old form.

test_manifests.py admits every rendered RayJob (and test_components.py every pair of components)
by each release's CRD, with nothing pruned and the pools still split in what the API server
stores. This file shows why that matters, on the form the manifests had before: per-group
``resources`` (a field of KubeRay 1.5+) and ``spec.backoffLimit`` (1.2+). An older API server
drops both without a word, and with them the NPU resource and the pool tags: the trainer and
rollout pods then offer Ray no NPU and no tag, and verl's pools are no longer split. It also
checks the test data itself (tests/k8s/crds/, the one store of KubeRay CRDs, 1.0.0 too for the
preflight): each file is what kuberay_crds.py writes, its README names the tag and commit of each,
and the generator reads every tag before it writes, then writes each file whole.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s import kuberay_crds, kuberay_rules, ray_start
from tests.k8s.conftest import K8S, of_kind, release_schemas, render
from tests.k8s.test_manifests import check_pool_split, groups
from verl_consistency.patches.hooks.ray_setup import placement

RELEASES = list(kuberay_crds.RELEASES)
GROUP_RESOURCES = [
    "spec.rayClusterSpec.headGroupSpec.resources",
    "spec.rayClusterSpec.workerGroupSpecs[0].resources",
    "spec.rayClusterSpec.workerGroupSpecs[1].resources",
]
# What an API server of each release drops from the old form (and KubeRay 1.5 added the field).
OLD_FORM_PRUNED = {
    "v1.1.0": ["spec.backoffLimit", *GROUP_RESOURCES],
    "v1.2.2": GROUP_RESOURCES,
    "v1.3.2": GROUP_RESOURCES,
    "v1.4.2": GROUP_RESOURCES,
    "v1.5.2": [],
    "v1.6.2": [],
    "v1.7.0": [],
}


def old_form(job: dict[str, Any]) -> dict[str, Any]:
    """The RayJob as the manifests wrote it before: each group's Ray resources in the group's
    `resources` map (CPU 0 on the head), no rayStartParams on the workers, backoffLimit 0."""
    old = copy.deepcopy(job)
    old["spec"]["backoffLimit"] = 0
    cluster = old["spec"]["rayClusterSpec"]
    for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        declared = ray_start.declared_resources(g)
        params = g["rayStartParams"]
        if params.pop("num-cpus", None) is not None:
            declared = {"CPU": 0.0, **declared}
        params.pop("resources", None)
        if not params:
            del g["rayStartParams"]
        g["resources"] = {k: str(int(v)) for k, v in declared.items()}
    return old


@pytest.fixture(scope="module")
def fully_async() -> dict[str, Any]:
    (job,) = of_kind(render("file:fully-async")[1], "RayJob")
    return job


def test_the_releases_span_1_1_to_1_7_and_the_docs_say_so() -> None:
    assert RELEASES[0] == "v1.1.0"
    assert RELEASES[-1] == "v1.7.0"
    assert [r.split(".")[1] for r in RELEASES] == ["1", "2", "3", "4", "5", "6", "7"]  # every minor line
    span = "1.1.0 to 1.7.0"
    assert span in (K8S / "helpers" / "render.py").read_text()
    for flat in ("fully-async-rayjob.yaml", "hybrid-rayjob.yaml"):
        assert f"KubeRay operator {span}" in (K8S / flat).read_text()
    assert "1.1.0 to 1.7.0" in (K8S / "README.md").read_text()


@pytest.mark.parametrize("release", RELEASES)
def test_the_old_form_loses_the_split_before_1_5(release: str, fully_async: dict[str, Any]) -> None:
    old = old_form(fully_async)
    schema = release_schemas()[release]
    stored, pruned = kuberay_rules.prune(old, schema)
    assert sorted(pruned) == sorted(OLD_FORM_PRUNED[release])
    offers = {name: ray_start.node_resources(g)[1] for name, g in groups(stored).items()}
    if pruned:
        # what the pods then offer Ray: no NPU, no tag; verl's pools may land anywhere
        assert offers == {"trainer": {}, "rollout": {}}
        with pytest.raises(AssertionError):
            check_pool_split(stored)
    else:
        # KubeRay 1.5+ knows the map and turns it into the same `ray start` flags
        assert {k: float(v) for k, v in groups(stored)["trainer"]["resources"].items()} == {
            "NPU": 8.0,
            placement.TRAINER_RESOURCE: 1000.0,
        }
    # The releases before 1.4 did not even admit it: rayStartParams was required in each group.
    required = [e for e in kuberay_rules.schema_errors(old, schema) if "'rayStartParams' is a required" in e]
    assert bool(required) == (release in ("v1.1.0", "v1.2.2", "v1.3.2"))


@pytest.mark.parametrize("release", RELEASES)
def test_the_new_form_keeps_the_split_on_each_release(release: str, fully_async: dict[str, Any]) -> None:
    stored, pruned = kuberay_rules.prune(fully_async, release_schemas()[release])
    assert pruned == []
    check_pool_split(stored)


@pytest.mark.parametrize("release", RELEASES)
def test_no_release_retries_a_rayjob_by_default(release: str) -> None:
    """Why the manifests can leave backoffLimit out: 1.1 has no retries at all, and every later
    release defaults the field to 0 (structural defaulting on the API server)."""
    spec = release_schemas()[release]["properties"]["spec"]["properties"]
    if release == "v1.1.0":
        assert "backoffLimit" not in spec
    else:
        assert spec["backoffLimit"]["default"] == 0


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_takes_ray_start_params_as_strings(release: str) -> None:
    cluster = release_schemas()[release]["properties"]["spec"]["properties"]["rayClusterSpec"]["properties"]
    for group in (cluster["headGroupSpec"], cluster["workerGroupSpecs"]["items"]):
        assert group["properties"]["rayStartParams"]["additionalProperties"] == {"type": "string"}


def test_the_stored_schemas_are_what_the_script_writes() -> None:
    readme = (kuberay_crds.CRD_DIR / "README.md").read_text()
    stored = kuberay_crds.stored()
    assert list(stored)[-len(RELEASES) :] == RELEASES  # the supported ones, after the older
    for release, commit in stored.items():
        path = kuberay_crds.schema_file(release)
        assert kuberay_crds.encode(kuberay_crds.load_schema(release)) == path.read_bytes(), release
        assert path.stat().st_size < 10_000  # the compact form, not the 1 MB CRD
        assert f"| {release} | {commit} |" in readme, f"the README does not name {release} at {commit}"
    assert sorted(p.name for p in kuberay_crds.CRD_DIR.glob("*.zst")) == sorted(
        kuberay_crds.schema_file(r).name for r in stored
    )


def _git(repo: Path, *args: str) -> str:
    res = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout.strip()


def test_regenerate_reads_each_tag_and_refuses_a_moved_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fully_async: dict[str, Any]
) -> None:
    """The script on a stand-in KubeRay repository (two tagged commits, a CRD of two versions):
    it writes a supported and an older release, removes the file of a release no longer listed,
    and on a moved tag stops before it writes anything."""
    repo = tmp_path / "kuberay"
    crd_file = repo / kuberay_crds.CRD_PATH
    crd_file.parent.mkdir(parents=True)
    schemas = {"v9.8.0": kuberay_crds.load_schema("v1.0.0"), "v9.9.9": kuberay_crds.load_schema("v1.7.0")}
    commits = {}
    _git(repo, "init", "-q")
    for tag, schema in schemas.items():
        crd = {
            "spec": {
                "versions": [
                    {"name": "v1alpha1", "served": True, "schema": {"openAPIV3Schema": {"type": "object"}}},
                    {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}},
                ]
            }
        }
        crd_file.write_text(yaml.safe_dump(crd))
        _git(repo, "add", ".")
        _git(repo, "commit", "-qm", tag)
        _git(repo, "tag", tag)
        commits[tag] = _git(repo, "rev-parse", "HEAD")
    out = tmp_path / "crds"
    out.mkdir()
    (out / "rayjob-v0.1.0.schema.json.zst").write_bytes(b"a release no longer listed")
    (out / "README.md").write_text("kept")
    monkeypatch.setattr(kuberay_crds, "CRD_DIR", out)
    monkeypatch.setattr(kuberay_crds, "OLDER", {"v9.8.0": commits["v9.8.0"]})
    monkeypatch.setattr(kuberay_crds, "RELEASES", {"v9.9.9": commits["v9.9.9"]})
    kuberay_crds.main(["--kuberay-git", str(repo / ".git")])
    written = {tag: (out / f"rayjob-{tag}.schema.json.zst").read_bytes() for tag in schemas}
    assert written == {tag: kuberay_crds.encode(schema) for tag, schema in schemas.items()}
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "rayjob-v9.8.0.schema.json.zst",
        "rayjob-v9.9.9.schema.json.zst",
    ]
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in out.glob("*.zst"))  # not mkstemp's 0600
    kuberay_crds.main(["--kuberay-git", str(repo / ".git")])  # a rerun writes the same bytes
    assert {tag: (out / f"rayjob-{tag}.schema.json.zst").read_bytes() for tag in schemas} == written
    # The later tag has moved: nothing is written, not even the earlier release's file.
    (out / "rayjob-v9.8.0.schema.json.zst").write_bytes(b"as it was")
    monkeypatch.setattr(kuberay_crds, "RELEASES", {"v9.9.9": "0" * 40})
    with pytest.raises(SystemExit, match=r"tag v9\.9\.9 is commit"):
        kuberay_crds.main(["--kuberay-git", str(repo / ".git")])
    assert (out / "rayjob-v9.8.0.schema.json.zst").read_bytes() == b"as it was"
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temporary file left
