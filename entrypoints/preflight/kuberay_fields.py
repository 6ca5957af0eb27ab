"""What the installed RayJob CRD knows: the KubeRay release it implies, and what it would prune.

Why: an API server stores a custom resource through its CRD's structural schema and *prunes*
every field the schema does not name, without an error (``kubectl apply`` says
``configured``). A RayJob written for KubeRay 1.5 (per-group ``resources``) applied on KubeRay
1.4 loses those fields silently, and the run starts with the pools no longer split. The
operator's version is often not visible to a namespace user, but the CRD is, and its schema
grows with every release: the fields below were read from ``ray.io_rayjobs.yaml`` at the tags
v1.0.0, v1.1.0, v1.2.2, v1.3.2, v1.4.2, v1.5.2, v1.6.2 and v1.7.0 of ray-project/kuberay
(``tests/k8s/crds/`` keeps their schemas; a test checks this table against each).

Paths are dotted from the RayJob's root, ``[]`` standing for any list item
(``spec.rayClusterSpec.workerGroupSpecs[].resources``). Fields of the pod templates follow the
Kubernetes release KubeRay was built with and are not listed; an unknown one is still found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

RAYJOB_CRD = "rayjobs.ray.io"
RAYJOB_VERSION = "v1"
RAYJOB_ALPHA = "v1alpha1"
"""The only version KubeRay 0.6 and older serve; 1.0 serves both, 1.1 and later v1 alone."""

SPEC = "spec"
CLUSTER = "spec.rayClusterSpec"
HEAD = f"{CLUSTER}.headGroupSpec"
WORKERS = f"{CLUSTER}.workerGroupSpecs[]"

FIELDS_ADDED: dict[str, tuple[str, ...]] = {
    "1.1": (
        f"{SPEC}.submissionMode",
        f"{SPEC}.activeDeadlineSeconds",
        f"{CLUSTER}.suspend",
        f"{WORKERS}.numOfHosts",
    ),
    "1.2": (f"{SPEC}.backoffLimit", f"{SPEC}.submitterConfig"),
    # spec.deletionPolicy also came in 1.3 and went in 1.5 (replaced by spec.deletionStrategy).
    "1.3": (
        f"{SPEC}.managedBy",
        f"{CLUSTER}.managedBy",
        f"{CLUSTER}.gcsFaultToleranceOptions",
        f"{WORKERS}.idleTimeoutSeconds",
        f"{WORKERS}.suspend",
    ),
    "1.4": (f"{CLUSTER}.autoscalerOptions.version",),
    "1.5": (
        f"{SPEC}.deletionStrategy",
        f"{HEAD}.resources",
        f"{HEAD}.labels",
        f"{WORKERS}.resources",
        f"{WORKERS}.labels",
    ),
    "1.6": (
        f"{SPEC}.preRunningDeadlineSeconds",
        f"{CLUSTER}.upgradeStrategy",
        f"{CLUSTER}.authOptions.enableK8sTokenAuth",
    ),
    "1.7": (
        f"{CLUSTER}.historyServerOptions",
        f"{CLUSTER}.networkPolicy",
        f"{CLUSTER}.tlsOptions",
        f"{HEAD}.ingressOptions",
        f"{WORKERS}.priority",
        f"{CLUSTER}.autoscalerOptions.command",
    ),
}
"""KubeRay minor release → RayJob fields it added (each present in every later release)."""

RELEASES = tuple(FIELDS_ADDED)
"""The releases told apart, oldest first."""

ADDED_IN = {path: release for release, paths in FIELDS_ADDED.items() for path in paths}


@dataclass(frozen=True)
class ImpliedRelease:
    """What a CRD's schema says about the KubeRay release that installed it."""

    release: str | None
    """The newest release whose fields (and all older releases' fields) the schema has; None:
    older than the first of :data:`RELEASES`."""
    newest_known: bool
    """True when that is the newest release this table knows (then: that one or later)."""

    def describe(self) -> str:
        if self.release is None:
            return f"older than KubeRay {RELEASES[0]}"
        return f"KubeRay {self.release}" + (" or later" if self.newest_known else "")


def served_schema(crd: dict[str, Any], version: str = RAYJOB_VERSION) -> dict[str, Any] | None:
    """The ``openAPIV3Schema`` of the served ``version``, None when the CRD does not serve it."""
    for v in crd.get("spec", {}).get("versions") or []:
        if v.get("name") == version and v.get("served", True):
            return (v.get("schema") or {}).get("openAPIV3Schema") or {}
    return None


def served_versions(crd: dict[str, Any]) -> list[str]:
    """The versions the CRD serves (``v1alpha1``, ``v1``), as it lists them."""
    return [v.get("name", "?") for v in crd.get("spec", {}).get("versions") or [] if v.get("served", True)]


def _child(schema: dict[str, Any], step: str) -> dict[str, Any] | None:
    if step.endswith("[]"):
        node = _child(schema, step[:-2])
        return node.get("items") if node is not None else None
    return (schema.get("properties") or {}).get(step)


def has_field(schema: dict[str, Any], path: str) -> bool:
    """Whether ``path`` (dotted, ``[]`` for list items) is a property the schema declares."""
    node: dict[str, Any] | None = schema
    for step in path.split("."):
        node = _child(node, step) if node is not None else None
    return node is not None


def implied_release(schema: dict[str, Any]) -> ImpliedRelease:
    """The newest release whose fields the schema has, all older releases' fields included."""
    found: str | None = None
    for release in RELEASES:
        if not all(has_field(schema, p) for p in FIELDS_ADDED[release]):
            break
        found = release
    return ImpliedRelease(found, found == RELEASES[-1])


def minor(release: str) -> tuple[int, int]:
    """``1.4.2`` or ``1.4`` → (1, 4)."""
    major, minor_, *_ = (int(x) for x in release.split("."))
    return major, minor_


def added_after(rayjob: dict[str, Any], release: str) -> list[tuple[str, str]]:
    """(path, release) of the RayJob's fields that a release after ``release`` added: an operator
    of ``release`` does not act on them, whatever the CRD keeps."""
    found: set[str] = set()
    _paths(rayjob, "", found)
    return sorted((p, ADDED_IN[p]) for p in found if p in ADDED_IN and minor(ADDED_IN[p]) > minor(release))


def _paths(obj: Any, path: str, out: set[str]) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            sub = f"{path}.{k}" if path else k
            out.add(sub)
            _paths(v, sub, out)
    elif isinstance(obj, list):
        for item in obj:
            _paths(item, f"{path}[]", out)


def release_from_image(image: str) -> str | None:
    """``quay.io/kuberay/operator:v1.4.2`` → ``1.4.2`` (None for a digest or another tag)."""
    m = re.search(r":v?(\d+\.\d+(?:\.\d+)?)(?:[-+][\w.]+)?$", image)
    return m.group(1) if m else None


@dataclass(frozen=True)
class UnknownField:
    """A field of the manifest the schema does not declare: the API server would drop it."""

    path: str
    """Where, with list indices (``spec.rayClusterSpec.workerGroupSpecs[1].resources``)."""
    added_in: str | None
    """The KubeRay release that added it, None when no release up to the newest known has it."""

    @property
    def generic_path(self) -> str:
        return re.sub(r"\[\d+\]", "[]", self.path)


def unknown_fields(rayjob: dict[str, Any], schema: dict[str, Any]) -> list[UnknownField]:
    """Every field under ``spec`` that structural pruning would remove, outermost only.

    Pruning keeps a field when the object's schema names it in ``properties``, or gives
    ``additionalProperties`` (a map: each value is then checked against that schema), or is
    marked ``x-kubernetes-preserve-unknown-fields``. ``apiVersion``, ``kind`` and ``metadata``
    at the root are always kept.
    """
    found: list[str] = []
    spec_schema = (schema.get("properties") or {}).get("spec")
    if "spec" in rayjob:
        if spec_schema is None:
            found.append("spec")
        else:
            _walk(rayjob["spec"], spec_schema, "spec", found)
    return [UnknownField(p, ADDED_IN.get(re.sub(r"\[\d+\]", "[]", p))) for p in found]


def _walk(obj: Any, schema: dict[str, Any], path: str, found: list[str]) -> None:
    if isinstance(obj, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(obj):
                _walk(item, items, f"{path}[{i}]", found)
        return
    if not isinstance(obj, dict):
        return
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or extra is True
    for key, value in obj.items():
        sub = f"{path}.{key}"
        if key in props:
            _walk(value, props[key], sub, found)
        elif isinstance(extra, dict):
            _walk(value, extra, sub, found)
        elif not keep_unknown:
            found.append(sub)
