"""Fixtures for the k8s tests: every manifest source rendered once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s import kuberay_crds
from verl_consistency.contracts.env import KUBERAY_CRD

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
MODES = ("fully-async", "hybrid")
# The plain files that `make manifests` writes from k8s/base/<mode> (k8s/helpers/render.py).
FILES = {f"file:{mode}": K8S / f"{mode}-rayjob.yaml" for mode in MODES}
# The one-pod consistency check (a batch/v1 Job, no RayJob): its plain file and its base.
# test_check_job.py covers them; the RayJob checks below do not apply.
CHECK_FILE = K8S / "check-job.yaml"
CHECK_SOURCES = ["file:check", "kustomize:base/check"]
# The model loader (a batch/v1 Job, the one writer of the model volume): test_model_loader.py.
LOADER_FILE = K8S / "model-loader-job.yaml"
# The bundle reader pod that `make download-bundle` applies (rendered from k8s/base/reader).
READER_FILE = K8S / "bundle-reader.yaml"
# Every plain file `make manifests` writes (kubectl's output: not linted, compared instead).
RENDERED = [*FILES.values(), CHECK_FILE, LOADER_FILE, READER_FILE]
# Bases that are not a collection run by themselves: the shared parts, the check, the loader, the reader.
NOT_RUNS = {K8S / "base" / name for name in ("common", "volumes", "check", "model-loader", "reader")}
KUSTOMIZATIONS = sorted(
    p.parent
    for p in K8S.glob("*/*/kustomization.yaml")
    if p.parent.parent.name != "components" and p.parent not in NOT_RUNS
)
SOURCES = [*FILES, *(f"kustomize:{d.relative_to(K8S)}" for d in KUSTOMIZATIONS)]
COMPONENTS = sorted(p.parent.name for p in (K8S / "components").glob("*/kustomization.yaml"))


def kubectl() -> str:
    found = shutil.which("kubectl")
    if not found:
        pytest.skip("kubectl (with its built-in kustomize) is not on PATH: install kubectl >= 1.27")
    return found


def kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True)


@cache
def render(source: str) -> tuple[str, list[dict[str, Any]]]:
    """(YAML text, documents) of one source: a plain file, `kubectl kustomize <dir>`, or
    ``compose:<mode>:<component>+<component>...`` (the mode's base with those components)."""
    if source in FILES:
        text = FILES[source].read_text()
    elif source == "file:check":
        text = CHECK_FILE.read_text()
    elif source.startswith("compose:"):
        _, mode, names = source.split(":", 2)
        res = compose(mode, tuple(names.split("+")))
        assert res.returncode == 0, f"kubectl kustomize of {source} failed:\n{res.stderr}"
        text = res.stdout
    else:
        directory = K8S / source.split(":", 1)[1]
        res = kustomize(directory)
        assert res.returncode == 0, f"kubectl kustomize {directory} failed:\n{res.stderr}"
        text = res.stdout
    return text, [d for d in yaml.safe_load_all(text) if d]


@cache
def compose(mode: str, components: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """`kubectl kustomize` of an overlay that lists `components` on k8s/base/<mode>, as a user's
    own overlay would (its folder is a temporary one outside the checkout)."""
    with tempfile.TemporaryDirectory(prefix="vc-overlay-") as tmp:
        rel = Path(os.path.relpath(K8S, tmp))
        (Path(tmp) / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [str(rel / "base" / mode)],
                    "components": [str(rel / "components" / c) for c in components],
                }
            )
        )
        return kustomize(Path(tmp))


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def expand_entrypoint(entrypoint: str, settings: Mapping[str, str]) -> list[str]:
    """The entrypoint's words after bash expands them with `settings` as its only variables,
    as the submitter pod's `/bin/bash -ce` does (a ${VAR:?} that is missing fails here too)."""
    res = subprocess.run(
        ["/bin/bash", "-ce", f'printf "%s\\0" {entrypoint}'],
        env={"PATH": "/usr/bin:/bin", **settings},
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, f"the entrypoint does not expand with {dict(settings)}: {res.stderr}"
    return res.stdout.split("\0")[:-1]


def run_settings(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The data of the ConfigMap that the RayJob's submitter pod reads."""
    (job,) = of_kind(docs, "RayJob")
    (container,) = job["spec"]["submitterPodTemplate"]["spec"]["containers"]
    (ref,) = [s["configMapRef"]["name"] for s in container["envFrom"]]
    (cm,) = [c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"] == ref]
    return {k: str(v) for k, v in cm["data"].items()}


def extra_crd() -> Path | None:
    """A full RayJob CRD to validate against besides the stored releases (e.g. a newer KubeRay):
    $VERL_CONSISTENCY_KUBERAY_CRD, when set."""
    raw = os.environ.get(KUBERAY_CRD)
    if not raw:
        return None
    path = Path(raw) if Path(raw).is_absolute() else REPO / raw
    if not path.is_file():
        pytest.fail(f"{KUBERAY_CRD}={raw}: no such file (a ray.io_rayjobs.yaml of a KubeRay release)")
    return path


@cache
def release_schemas() -> dict[str, dict[str, Any]]:
    """The RayJob schema of each KubeRay release the manifests support (tests/k8s/crds/), plus
    the CRD that $VERL_CONSISTENCY_KUBERAY_CRD names, if any."""
    schemas = {release: kuberay_crds.load_schema(release) for release in kuberay_crds.RELEASES}
    if (path := extra_crd()) is not None:
        schemas[f"file:{path.name}"] = kuberay_crds.served_schema(yaml.safe_load(path.read_text()))
    return schemas


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest) -> str:
    return str(request.param)
