"""The top README's cluster path, run as a newcomer types it, and the docs that describe it.

Why: each step of README.md's "The cluster path" must do what it says on the next: the image
that step 2 tags is the one `make image-<flavour>` built, `make manifests IMAGE=` reaches the
plain files *and* the overlays, and step 3's preflight finds that image (no "render the
manifests with your image" just after the user did). So steps 2 and 3 are read out of the
README and run with bash in a copy of the tree (the Makefile, the .mk files, k8s/, the pins),
with `docker` recorded and the image build dry-run (`make -n`), against the preflight's
stand-in API server. The rest checks the README and k8s/README against what the files do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from tests.fixtures import doc_refs
from tests.k8s.apiserver_standin import StandInCluster, fixture_storage_classes, serve
from tests.k8s.conftest import FILES, K8S, LOADER_FILE, REPO, kubectl, of_kind
from verl_consistency.entrypoints.preflight import manifest as mf
from verl_consistency.entrypoints.preflight.checks import default_image, quota_needs
from verl_consistency.entrypoints.preflight.kuberay_check import HELM_REPO, kuberay_release
from verl_consistency.entrypoints.preflight.manifest import show_quantity

sys.path.insert(0, str(K8S / "helpers"))
import render as renderer  # k8s/helpers is a folder of scripts, as docker/helpers

FLAVOURS = {"a2": "ascend-a2", "a3": "ascend-a3", "cuda": "nvidia"}
"""IMAGE_FLAVOUR → the RayJob's verl-consistency/accelerator label of that build."""
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
TREE = ("Makefile", "pyproject.toml", "k8s/", "patches/pins.toml", "patches/contracts/", "docker/helpers/")
"""What `make image-name`, `make manifests` and `make preflight` read, besides every */*.mk."""


def readme_section(heading: str) -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


CLUSTER_PATH = readme_section("The cluster path")
STEPS = next(t for t in doc_refs.MD.parse(CLUSTER_PATH) if t.type == "fence").content


def step(n: int) -> str:
    """The lines of step ``n`` of the README's cluster path block (its comment line first)."""
    return re.search(rf"^# {n}\. .*?(?=^# {n + 1}\. |\Z)", STEPS, re.M | re.S).group(0)  # type: ignore[union-attr]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the checkout's files that the cluster path's make targets read (as a fresh
    clone has them: tracked and new files, not ignored ones)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    out = tmp_path / "tree"
    for rel in listed:
        if (rel.startswith(TREE) or re.fullmatch(r"[^/]+/[^/]+\.mk", rel)) and (REPO / rel).is_file():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, out / rel)
    return out


HARNESS = r"""
set -euo pipefail
make() {
  case "${1:-}" in
    image|image-a2|image-a3|image-cuda)  # the build, dry-run: record the tag it would write
      command make -s -n "$@" | grep -o -- ' -t [^ ]*' | sed 's/^ -t /built /' >> "$LOG" ;;
    *)
      local over=(K8S_PY="$PY" PREFLIGHT_ARGS=--json
                  PREFLIGHT_CMD="$PY -m verl_consistency.entrypoints preflight")
      if [[ " $* " == *" preflight "* ]]; then command make "$@" "${over[@]}" > "$OUT/preflight.json"
      else command make "$@" "${over[@]}"; fi ;;
  esac
}
docker() { echo "docker $*" >> "$LOG"; }
"""


def images_of(docs: list[dict[str, Any]]) -> set[str]:
    return {c["image"] for d in docs for c in renderer_containers(d)}


def renderer_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for pointer in renderer.pod_specs(doc):
        spec: Any = doc
        for token in pointer.strip("/").split("/") if pointer else []:
            spec = spec[int(token)] if isinstance(spec, list) else spec[token.replace("~1", "/")]
        found += [*spec.get("initContainers", []), *spec["containers"]]
    return found


def kustomized(folder: Path) -> list[dict[str, Any]]:
    res = subprocess.run([kubectl(), "kustomize", str(folder)], capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_readme_steps_2_and_3_build_push_render_and_check_one_image(tree: Path, flavour: str):
    kubectl()
    steps = re.sub(r"^F=\w+", f"F={flavour}", step(2), count=1, flags=re.M) + step(3)
    assert f"F={flavour}" in steps, "step 2 names the flavour once, in F="
    log, out = tree / "log", tree / "out"
    out.mkdir()
    with serve(StandInCluster()) as server:
        env = {
            **os.environ,
            "KUBECONFIG": str(server.kubeconfig(tree)),
            "LOG": str(log),
            "OUT": str(out),
            "PY": sys.executable,
        }
        res = subprocess.run(
            ["bash", "-c", HARNESS + steps], cwd=tree, env=env, capture_output=True, text=True
        )
    assert res.returncode == 0, f"{steps}\n{res.stdout}\n{res.stderr}"
    lines = log.read_text().splitlines()
    (built,) = [line.split()[1] for line in lines if line.startswith("built ")]
    (tag,) = [line.split()[2:4] for line in lines if line.startswith("docker tag ")]
    (push,) = [line.split()[2] for line in lines if line.startswith("docker push ")]
    assert built == default_image("current", FLAVOURS[flavour])  # what `make image-<flavour>` writes
    assert tag == [built, push], "step 2 tags and pushes the image step 2 built"
    assert push == f"registry.example.com/ml/{built}"
    for rel in renderer.FLATS:
        assert images_of([d for d in yaml.safe_load_all((tree / "k8s" / rel).read_text()) if d]) == {push}
    for name in OVERLAYS:
        images = images_of(kustomized(tree / "k8s" / "overlays" / name))
        if name == "next":  # the next set's build: never the current set's IMAGE
            assert push not in images
        else:
            assert images == {push}, f"k8s/overlays/{name} does not follow make manifests IMAGE="
    rep = json.loads((out / "preflight.json").read_text())
    (image,) = [c for c in rep["checks"] if c["check"] == "image"]
    assert rep["exit_code"] == 0, rep
    assert image == {"check": "image", "status": "ok", "found": f"the pods run {push}", "next": ""}


def test_make_manifests_sets_the_storage_class_and_claim_sizes_everywhere(tree: Path):
    kubectl()
    py = f"K8S_PY={sys.executable}"
    make = ["make", "-s", "--no-print-directory", "manifests", py]
    settings = ["STORAGE_CLASS=csi-sfsturbo", "DUMP_SIZE=500Gi", "MODELS_SIZE=200Gi"]
    subprocess.run([*make, *settings], cwd=tree, check=True, capture_output=True)
    want = {"verl-consistency-dump": "500Gi", "verl-consistency-models": "200Gi"}
    for docs in [
        *(yaml.safe_load_all((tree / "k8s" / rel).read_text()) for rel in ("fully-async-rayjob.yaml",)),
        kustomized(tree / "k8s" / "overlays" / "one-node"),
        kustomized(tree / "k8s" / "overlays" / "nvidia"),
    ]:
        claims = of_kind([d for d in docs if d], "PersistentVolumeClaim")
        assert {c["metadata"]["name"]: c["spec"]["resources"]["requests"]["storage"] for c in claims} == want
        assert {c["spec"]["storageClassName"] for c in claims} == {"csi-sfsturbo"}
    # The preflight reads the class the claims now name.
    cluster = StandInCluster(storage_classes=list(fixture_storage_classes().values()))
    manifest = tree / "k8s" / "fully-async-rayjob.yaml"
    with serve(cluster) as server:
        env = {**os.environ, "KUBECONFIG": str(server.kubeconfig(tree))}
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "verl_consistency.entrypoints",
                "preflight",
                "--json",
                "--manifest",
                manifest,
            ],
            env=env,
            capture_output=True,
            text=True,
        )
    (storage,) = [c for c in json.loads(res.stdout)["checks"] if c["check"] == "storage"]
    assert storage["status"] == "ok"
    assert "verl-consistency-dump: class csi-sfsturbo" in storage["found"]
    # A bad value is refused, naming the variable, and writes nothing.
    before = manifest.read_text()
    bad = subprocess.run([*make, "STORAGE_CLASS=Fast_SSD"], cwd=tree, capture_output=True, text=True)
    assert bad.returncode == 2
    assert "STORAGE_CLASS='Fast_SSD' is not a StorageClass name" in bad.stderr
    assert manifest.read_text() == before


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_image_name_names_what_each_image_target_builds(flavour: str):
    name = subprocess.run(
        ["make", "-s", "image-name", f"IMAGE_FLAVOUR={flavour}"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dry = subprocess.run(["make", "-s", "-n", f"image-{flavour}"], cwd=REPO, capture_output=True, text=True)
    assert re.search(rf" -t {re.escape(name)}( |$)", dry.stdout, re.M), dry.stdout


def test_image_name_refuses_an_unknown_flavour():
    res = subprocess.run(
        ["make", "-s", "image-name", "IMAGE_FLAVOUR=a5"], cwd=REPO, capture_output=True, text=True
    )
    assert res.returncode == 2
    assert "IMAGE_FLAVOUR=a5 is none of a2, a3, cuda" in res.stderr


def test_step_4_names_only_sources_the_loader_job_can_read():
    """A path SOURCE needs a volume at /source: only the from-pvc component mounts one."""
    (line,) = [ln for ln in step(4).splitlines() if "model-loader-job.yaml" in ln]
    sources = re.search(r"SOURCE \(([^)]*)\)", line).group(1)  # type: ignore[union-attr]
    job = of_kind([d for d in yaml.safe_load_all(LOADER_FILE.read_text()) if d], "Job")[0]
    mounts = {m["mountPath"] for c in renderer_containers(job) for m in c.get("volumeMounts", [])}
    assert "/source" not in mounts
    assert not re.search(r"PVC|claim|path", sources, re.I), f"step 4 offers {sources!r}; the Job reads URLs"
    assert "from-pvc" in CLUSTER_PATH, "the README names the component that reads another claim"


def test_step_5_names_every_setting_the_manifest_asks_to_edit():
    header = FILES["file:fully-async"].read_text().split("\n---", 1)[0]
    asked = re.search(r"Per run, edit (.*?) in the ConfigMap", header, re.S).group(1)  # type: ignore[union-attr]
    keys = set(re.findall(r"\b[A-Z][A-Z_]{3,}\b", asked))
    assert {"RUN_ID", "MODEL_PATH", "COLLECTION", "PHASE", "CAPTURE"} <= keys
    missing = sorted(k for k in keys if k not in step(5))
    assert not missing, f"README step 5 leaves out {missing}"


def test_the_readmes_name_the_kuberay_release_and_its_helm_repository():
    install = f"helm install kuberay-operator kuberay/kuberay-operator --version {kuberay_release()}"
    for doc in ("README.md", "k8s/README.md"):
        text = " ".join((REPO / doc).read_text().split())
        assert HELM_REPO in text, f"{doc} does not say `{HELM_REPO}`"
        assert install in text, f"{doc} does not name KubeRay {kuberay_release()} (patches/pins.toml)"
    assert f"KubeRay operator {kuberay_release()}" in CLUSTER_PATH


def test_the_readme_says_what_a_collection_asks_for():
    """The numbers beside the prerequisites are what the preflight sums for the flat file."""
    m = mf.read_file(FILES["file:fully-async"])
    need = quota_needs(m, SimpleNamespace(claims=[]))  # type: ignore[arg-type]  # no claim exists yet
    npus = need["requests.huawei.com/Ascend910"]
    text = " ".join(CLUSTER_PATH.split())
    cpu, memory = show_quantity("cpu", need["requests.cpu"]), show_quantity("memory", need["requests.memory"])
    said = f"{cpu} CPU, {memory} memory and {npus:f} NPUs over {need['pods']:f} pods"
    assert said in text, f"README.md's cluster path should say: {said}"


def test_k8s_readme_names_every_file_make_manifests_writes_and_tells_one_path():
    text = (K8S / "README.md").read_text()
    para = re.search(r"\*\*Rendering: `make manifests`\.\*\*(.*?)\n\n", text, re.S).group(1)  # type: ignore[union-attr]
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"writes the {words[len(renderer.FLATS)]} plain files" in " ".join(para.split())
    for name in [*renderer.FLATS, "site/kustomization.yaml"]:
        assert f"`k8s/{name}`" in para, f"k8s/README.md's make manifests paragraph does not name k8s/{name}"
    path = text[text.index("## From an empty namespace to a bundle") :]
    path = path[: path.index("\n## ")]
    assert "```" not in path, "one path: the top README's steps, not a second one here"
    assert "../README.md#the-cluster-path-from-an-empty-namespace-to-a-downloaded-bundle" in path
