"""The two KubeRay checks: is RayJob served as ray.io/v1, by which release, and does that release
keep (and act on) every field of the manifest's RayJob.

Why a module of their own: a KubeRay that is absent, too old, or half-upgraded (``helm upgrade``
changes the operator, never the chart's CRDs) each needs a different next step, and the wrong
one costs the user an afternoon: ``helm install`` on a cluster that has KubeRay fails on the
existing release, and an operator upgrade without its CRDs keeps the old schema pruning fields.
So each finding names what was read (the served versions, the CRD's release, the operator's
image tag) and gives the command that fits; the release to go to is the pinned one
(patches/pins.toml ``kuberay.version``), the one the manifests are tested against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from verl_consistency.contracts import pins
from verl_consistency.entrypoints.preflight import kuberay_fields as kf
from verl_consistency.entrypoints.preflight.manifest import Manifest
from verl_consistency.entrypoints.preflight.report import CheckResult, Row, Status, result, unread

if TYPE_CHECKING:  # cluster imports the kubernetes client, which only preflight() loads
    from verl_consistency.entrypoints.preflight.cluster import Snapshot

HELM_REPO = "helm repo add kuberay https://ray-project.github.io/kuberay-helm/"
CRDS_OF = (  # KubeRay's upgrade guide: server-side, taking the fields over from Helm
    "kubectl apply --server-side --force-conflicts "
    "-k 'github.com/ray-project/kuberay/ray-operator/config/crd?ref=v<version>'"
)


def kuberay_release() -> str:
    """The KubeRay release the manifests are tested against (patches/pins.toml ``kuberay.version``)."""
    return str(pins.load().kuberay.version).removeprefix("v")


def install_kuberay() -> str:
    """For a cluster without KubeRay: its Helm chart (CRDs and operator), the pinned release."""
    return (
        f"{HELM_REPO}; helm install kuberay-operator kuberay/kuberay-operator --version {kuberay_release()} "
        "(k8s/README.md, Cluster prerequisites)"
    )


def upgrade_kuberay() -> str:
    """For a cluster whose KubeRay is too old: the CRDs first (``helm upgrade`` never changes a
    chart's CRDs), then the operator, both of the pinned release."""
    release = kuberay_release()
    return (
        f"upgrade KubeRay to {release}, its CRDs first (helm upgrade leaves them): "
        f"{CRDS_OF.replace('<version>', release)}; then helm upgrade kuberay-operator "
        f"kuberay/kuberay-operator --version {release} (k8s/README.md, Cluster prerequisites)"
    )


def _operators(s: Snapshot) -> str:
    """``; operator quay.io/kuberay/operator:v0.6.0 (KubeRay 0.6.0)``, or nothing when none is visible."""
    if not s.operator_images:
        return ""
    shown = [
        f"{i} (KubeRay {v})" if (v := kf.release_from_image(i)) else i for i in sorted(set(s.operator_images))
    ]
    return f"; operator {', '.join(shown)}"


def _alpha_only(what: str, s: Snapshot) -> Row:
    """A KubeRay before 1.0: RayJob only as ray.io/v1alpha1. It has KubeRay, so an upgrade."""
    return (
        Status.fail,
        f"{what} serves RayJob only as ray.io/{kf.RAYJOB_ALPHA}, not {kf.RAYJOB_VERSION}: KubeRay 0.6 or "
        f"older (ray.io/v1 came in 1.0){_operators(s)}",
        upgrade_kuberay(),
    )


def _kuberay_from_discovery(s: Snapshot) -> CheckResult:
    """The CRD is unreadable (a namespace user): what API discovery, readable by all, shows."""
    name = "kuberay"

    def serves(doc: dict | None) -> bool:
        return any(r.get("name") == "rayjobs" for r in (doc or {}).get("resources") or [])

    if serves(s.ray_discovery):
        return CheckResult(
            check=name,
            status=Status.warn,
            found=f"the API serves ray.io/v1 rayjobs; CRD {kf.RAYJOB_CRD} is unreadable "
            f"({s.unreadable['crd']}), so its KubeRay release is unknown{_operators(s)}",
            next="rerun as a user allowed to get customresourcedefinitions",
        )
    if "ray-discovery" in s.unreadable or "ray-discovery-alpha" in s.unreadable:
        return unread(name, "crd", s.unreadable["crd"])
    if serves(s.ray_discovery_alpha):
        return result(name, [_alpha_only("the API", s)])
    return result(name, [(Status.fail, "the API serves no ray.io/v1 rayjobs", install_kuberay())])


def check_kuberay(m: Manifest, s: Snapshot) -> CheckResult:
    """The RayJob kind is served as ray.io/v1, and which KubeRay release its CRD comes from; a
    KubeRay too old is named with its served version and operator release, and gets an upgrade
    (CRDs included), never an install."""
    name = "kuberay"
    if m.rayjob is None:
        return CheckResult(check=name, status=Status.ok, found="not needed: the manifest has no RayJob")
    if "crd" in s.unreadable:
        return _kuberay_from_discovery(s)
    if s.crd is None:
        found = f"CRD {kf.RAYJOB_CRD} is not installed: kind RayJob is unknown{_operators(s)}"
        return result(
            name, [(Status.fail, found, upgrade_kuberay() if s.operator_images else install_kuberay())]
        )
    schema = kf.served_schema(s.crd)
    if schema is None:
        served = kf.served_versions(s.crd)
        if kf.RAYJOB_ALPHA in served:
            return result(name, [_alpha_only(f"CRD {kf.RAYJOB_CRD} ({', '.join(served)})", s)])
        found = f"CRD {kf.RAYJOB_CRD} serves {', '.join(served) or 'no version'}, not {kf.RAYJOB_VERSION}"
        return result(name, [(Status.fail, found + _operators(s), upgrade_kuberay())])
    implied = kf.implied_release(schema)
    found = f"CRD {kf.RAYJOB_CRD} serves v1; its schema is that of {implied.describe()}"
    if s.operator_images:
        found += f"; operator image {', '.join(sorted(set(s.operator_images)))}"
    if implied.release is None:
        return result(name, [(Status.fail, found, upgrade_kuberay())])
    crd = kf.minor(implied.release)
    stale = [
        v
        for v in _operator_releases(s)
        if (kf.minor(v) < crd if implied.newest_known else kf.minor(v) != crd)
    ]
    if stale:
        note = f"{found}: the operator ({', '.join(stale)}) is not the CRD's release"
        todo = f"install the operator and CRDs of one release (helm upgrade leaves the CRDs: {CRDS_OF})"
        return result(name, [(Status.warn, note, todo)])
    return CheckResult(check=name, status=Status.ok, found=found)


def _operator_releases(s: Snapshot) -> list[str]:
    return sorted({v for v in map(kf.release_from_image, s.operator_images) if v}, key=kf.minor)


def _pruned(unknown: list[kf.UnknownField], release: str) -> Row:
    shown = "; ".join(
        f"{u.path} (added in KubeRay {u.added_in})" if u.added_in else f"{u.path} (no KubeRay release has it)"
        for u in unknown
    )
    needed = max((u.added_in for u in unknown if u.added_in), key=kf.minor, default=None)
    todo = f"upgrade KubeRay to {needed} or later, its CRDs too ({CRDS_OF}); or " if needed else ""
    return (
        Status.fail,
        f"the installed CRD ({release}) would silently drop: {shown}",
        todo + "use manifests without these fields (k8s/README.md)",
    )


def _ignored(fields: list[tuple[str, str]], operator: str) -> Row:
    shown = "; ".join(f"{p} (added in KubeRay {r})" for p, r in fields)
    needed = max((r for _, r in fields), key=kf.minor)
    return (
        Status.fail,
        f"the CRD keeps these fields, but the operator ({operator}) does not act on them: {shown}",
        f"upgrade the operator to {needed} or later (helm upgrade kuberay-operator kuberay/kuberay-operator "
        "--version <release>), or use manifests without these fields",
    )


def check_rayjob_fields(m: Manifest, s: Snapshot) -> CheckResult:
    """Every field of the RayJob is one the installed CRD keeps (an unknown one is pruned
    silently) and, where the operator's image tag shows its release, one that operator reads."""
    name = "rayjob-fields"
    if m.rayjob is None:
        return CheckResult(check=name, status=Status.ok, found="not needed: the manifest has no RayJob")
    schema = kf.served_schema(s.crd) if s.crd is not None else None
    if schema is None:
        return result(
            name, [(Status.warn, "not checked: no readable ray.io/v1 RayJob schema (see kuberay)", "")]
        )
    release = kf.implied_release(schema).describe()
    unknown = kf.unknown_fields(m.rayjob, schema)
    if unknown:
        return result(name, [_pruned(unknown, release)])
    operators = _operator_releases(s)
    ignored = kf.added_after(m.rayjob, operators[0]) if operators else []
    if ignored:
        return result(name, [_ignored(ignored, operators[0])])
    return result(name, [(Status.ok, f"every field of the RayJob is in the installed CRD ({release})", "")])
