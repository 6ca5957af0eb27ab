"""The manifest a preflight checks: rendered once, then read as the pods it will create.

Why the rendered form: what reaches the API server is what ``kubectl kustomize`` prints (or the
flat ``k8s/*-rayjob.yaml``, already rendered), with every component's patch applied. Reading the
kustomize sources instead would miss exactly the changes that make one cluster fit and another
not (the device name of ``npu-hami``, the 16 NPUs of ``a3-16npu``, the replicas of
``pool-sizes``).

A manifest becomes :class:`PodGroup` s: one per kind of pod it will run, with how many of it
(the RayJob's head, each worker group times its replicas, KubeRay's submitter Job, and each
batch Job). Everything the checks need is a pure function of a group's pod spec.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from kubernetes.utils.quantity import parse_quantity

K8S_DIR = Path("k8s")
"""Where the manifests live, relative to the repository root (the Makefile's directory)."""
SOURCE_ROOT = Path(__file__).resolve().parents[2]
"""The checkout this module is in (an editable install), for runs outside the repository root."""


class Mode(StrEnum):
    """The modes with a flat RayJob file (``k8s/<mode>-rayjob.yaml``)."""

    fully_async = "fully-async"
    hybrid = "hybrid"


LABEL_MODE = "verl-consistency/mode"
LABEL_ACCELERATOR = "verl-consistency/accelerator"
LABEL_PIN_SET = "verl-consistency/pin-set"
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's loader where PyYAML was built with it (10x faster on a 500-line manifest)."""


class ManifestError(Exception):
    """The manifest cannot be read or rendered (a usage error: exit 2)."""


@dataclass(frozen=True)
class PodGroup:
    """Pods of one shape: ``replicas`` copies of ``spec`` (a PodSpec as a dict)."""

    name: str
    """What creates them, as a user would name it (``worker group trainer``)."""
    replicas: int
    spec: dict[str, Any]

    def containers(self) -> list[dict[str, Any]]:
        return [*(self.spec.get("initContainers") or []), *(self.spec.get("containers") or [])]

    def device_limits(self) -> dict[str, int]:
        """Extended resources (a domain-qualified name such as ``huawei.com/Ascend910``) per pod."""
        out: dict[str, int] = {}
        for c in self.spec.get("containers") or []:
            for name, value in ((c.get("resources") or {}).get("limits") or {}).items():
                if "/" in name and not name.startswith(("hugepages-", "kubernetes.io/")):
                    out[name] = out.get(name, 0) + int(parse_quantity(value))
        return out

    def amounts(self, kind: str) -> dict[str, Decimal]:
        """One pod's ``requests`` or ``limits``, as the scheduler and a quota count them.

        A container's request defaults to its limit; the pod's amount is the larger of the sum
        over its containers and the largest init container (init containers run one at a time).
        """
        return _pod_amounts(self.spec, kind)

    def images(self) -> list[str]:
        return [c["image"] for c in self.containers() if c.get("image")]

    def pull_secrets(self) -> list[str]:
        return [s["name"] for s in self.spec.get("imagePullSecrets") or [] if s.get("name")]

    def claims(self) -> list[str]:
        return [
            v["persistentVolumeClaim"]["claimName"]
            for v in self.spec.get("volumes") or []
            if (v.get("persistentVolumeClaim") or {}).get("claimName")
        ]


def _container_amounts(c: dict[str, Any], kind: str) -> dict[str, Decimal]:
    res = c.get("resources") or {}
    limits = {k: parse_quantity(v) for k, v in (res.get("limits") or {}).items()}
    if kind == "limits":
        return limits
    return {**limits, **{k: parse_quantity(v) for k, v in (res.get("requests") or {}).items()}}


def _pod_amounts(spec: dict[str, Any], kind: str) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for k, v in _container_amounts(c, kind).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in spec.get("initContainers") or []:
        for k, v in _container_amounts(c, kind).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    return total


BYTES = ("memory", "storage", "ephemeral-storage", "hugepages-")


def show_quantity(resource: str, v: Decimal) -> str:
    """An amount of ``resource`` as a person reads it: bytes in Gi or Mi (``1048.2Gi``), the rest
    (cpu, devices, counts) as a plain number."""
    if any(b in resource for b in BYTES):
        for unit, size in (("Gi", 2**30), ("Mi", 2**20)):
            if v >= size:
                return f"{v / size:.1f}".removesuffix(".0") + unit
    return f"{v.normalize():f}"


def containers_without(spec: dict[str, Any], kind: str, resource: str) -> list[str]:
    """Names of the containers that set no ``kind`` (requests/limits) of ``resource``."""
    return [
        c.get("name", "?")
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        if resource not in _container_amounts(c, kind)
    ]


@dataclass(frozen=True)
class Manifest:
    """The documents of one rendered manifest."""

    source: str
    """The file, or the overlay folder it was rendered from."""
    docs: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d.get("kind") == kind]

    @property
    def rayjob(self) -> dict[str, Any] | None:
        jobs = self.of_kind("RayJob")
        return jobs[0] if jobs else None

    def label(self, name: str) -> str | None:
        job = self.rayjob
        return ((job or {}).get("metadata", {}).get("labels") or {}).get(name)

    def claims(self) -> dict[str, dict[str, Any]]:
        """The PersistentVolumeClaims the manifest creates, by name."""
        return {d["metadata"]["name"]: d for d in self.of_kind("PersistentVolumeClaim")}

    def pod_groups(self) -> list[PodGroup]:
        groups: list[PodGroup] = []
        for job in self.of_kind("RayJob"):
            groups += _rayjob_groups(job)
        for job in self.of_kind("Job"):
            spec = job.get("spec") or {}
            groups.append(
                PodGroup(f"Job {job['metadata']['name']}", int(spec.get("parallelism", 1)), _pod_spec(spec))
            )
        for pod in self.of_kind("Pod"):
            groups.append(PodGroup(f"Pod {pod['metadata']['name']}", 1, pod.get("spec") or {}))
        return groups


def _pod_spec(owner: dict[str, Any]) -> dict[str, Any]:
    return (owner.get("template") or {}).get("spec") or {}


def _rayjob_groups(job: dict[str, Any]) -> list[PodGroup]:
    spec = job.get("spec") or {}
    cluster = spec.get("rayClusterSpec") or {}
    groups = [PodGroup("Ray head", 1, _pod_spec(cluster.get("headGroupSpec") or {}))]
    for g in cluster.get("workerGroupSpecs") or []:
        replicas = int(g.get("replicas", g.get("minReplicas", 1))) * int(g.get("numOfHosts", 1))
        groups.append(PodGroup(f"worker group {g.get('groupName', '?')}", replicas, _pod_spec(g)))
    if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode" and spec.get("submitterPodTemplate"):
        groups.append(PodGroup("RayJob submitter", 1, spec["submitterPodTemplate"].get("spec") or {}))
    return groups


def parse(text: str, source: str) -> Manifest:
    """The YAML documents of ``text``; a YAML error names ``source`` and the line."""
    try:
        docs = [d for d in yaml.load_all(text, Loader=YAML_LOADER) if d]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ManifestError(
            f"{where}: not valid YAML ({getattr(exc, 'problem', exc)}); fix the file"
        ) from None
    bad = [i for i, d in enumerate(docs) if not isinstance(d, dict) or "kind" not in d]
    if bad:
        raise ManifestError(f"{source}: document {bad[0] + 1} is not a Kubernetes object (no kind)")
    return Manifest(source, docs)


def k8s_dir() -> Path:
    """``k8s/`` of the current directory (the repository root), else of this checkout."""
    return K8S_DIR if K8S_DIR.is_dir() else SOURCE_ROOT / "k8s"


def flat_file(mode: Mode) -> Path:
    return k8s_dir() / f"{mode.value}-rayjob.yaml"


def read_file(path: Path) -> Manifest:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read it ({exc.strerror}); pass an existing --manifest") from None
    return parse(text, str(path))


def render_overlay(name: str, kubectl: str = "kubectl") -> Manifest:
    """``kubectl kustomize k8s/overlays/<name>``: what ``kubectl apply -k`` would send."""
    folder = k8s_dir() / "overlays" / name
    if not (folder / "kustomization.yaml").is_file():
        known = sorted(p.parent.name for p in (k8s_dir() / "overlays").glob("*/kustomization.yaml"))
        raise ManifestError(f"no overlay {name!r} in {folder.parent} (there are: {', '.join(known)})")
    exe = shutil.which(kubectl)
    if exe is None:
        raise ManifestError(f"--overlay renders with `{kubectl} kustomize`, and {kubectl} is not on PATH")
    res = subprocess.run([exe, "kustomize", str(folder)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ManifestError(f"`{kubectl} kustomize {folder}` failed:\n{res.stderr.strip()}")
    return parse(res.stdout, str(folder))
