"""Whether a claim of the manifest will bind, and with the access modes it asks for.

Why it matters: the dump volume is written by every Ray pod and read by the postprocess Job,
on different nodes at once, so it must be ReadWriteMany. A claim that names no class gets the
cluster's default, which on many clusters is a block disk or a node-local path (ReadWriteOnce):
the claim then stays Pending, or binds and the second node's pod cannot mount it. A
StorageClass does not declare its access modes, so they are told by its provisioner (the CSI
driver), from the lists below; an unknown provisioner is a warning, not a failure.
"""

from __future__ import annotations

from typing import Any

from verl_consistency.entrypoints.preflight.report import Row, Status

DEFAULT_CLASS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)
RWX_PROVISIONERS = (
    "nfs", "cephfs", "efs.csi.aws.com", "fsx.csi.aws.com", "file.csi.azure.com",
    "kubernetes.io/azure-file", "filestore.csi.storage.gke.io", "sfsturbo.csi.everest.io",
    "nas.csi.everest.io", "juicefs", "glusterfs", "driver.longhorn.io",
    "nasplugin.csi.alibabacloud.com", "lustre", "spectrumscale", "beegfs",
)  # fmt: skip
"""Provisioners (substrings) of shared file systems: their volumes can be ReadWriteMany."""
RWO_PROVISIONERS = (
    "ebs.csi.aws.com", "kubernetes.io/aws-ebs", "pd.csi.storage.gke.io", "kubernetes.io/gce-pd",
    "disk.csi.azure.com", "kubernetes.io/azure-disk", "rancher.io/local-path", "openebs.io/local",
    "topolvm", "rbd.csi.ceph.com", "kubernetes.io/rbd", "disk.csi.everest.io",
    "cinder.csi.openstack.org", "diskplugin.csi.alibabacloud.com", "kubernetes.io/no-provisioner",
)  # fmt: skip
"""Provisioners (substrings) of block disks and node-local volumes: ReadWriteOnce only."""
CSI_DRIVER_PARAM = "csi.storage.k8s.io/csi-driver-name"
"""Where one provisioner serving several drivers (Huawei Cloud's everest) names the driver."""
RWX = "ReadWriteMany"


def rwx_support(sc: dict[str, Any]) -> bool | None:
    """Whether volumes of this StorageClass can be ReadWriteMany (None: not known here)."""
    driver = f"{sc.get('provisioner', '')} {(sc.get('parameters') or {}).get(CSI_DRIVER_PARAM, '')}"
    if any(p in driver for p in RWX_PROVISIONERS):
        return True
    if any(p in driver for p in RWO_PROVISIONERS):
        return False
    return None


def default_classes(classes: list[dict[str, Any]]) -> list[str]:
    return [
        c["metadata"]["name"]
        for c in classes
        if any((c["metadata"].get("annotations") or {}).get(a) == "true" for a in DEFAULT_CLASS)
    ]


def existing_claim_row(claim: str, modes: set[str], existing: dict[str, Any]) -> Row:
    """An existing claim is used as it is (``kubectl apply`` cannot change its modes)."""
    have = set(existing.get("spec", {}).get("accessModes") or [])
    phase = existing.get("status", {}).get("phase", "?")
    if not modes <= have:
        return (
            Status.fail,
            f"{claim}: exists with {', '.join(sorted(have))}, the manifest needs {', '.join(sorted(modes))}",
            f"delete claim {claim} (and its data), or use another claim name",
        )
    if phase != "Bound":
        return Status.warn, f"{claim}: exists, {phase}", f"kubectl describe pvc {claim}"
    return Status.ok, f"{claim}: exists, Bound, {', '.join(sorted(have))}", ""


def new_claim_row(claim: str, wanted: dict[str, Any], classes: list[dict[str, Any]]) -> Row:
    """A claim the manifest creates: its class (named, else the default) and that class's modes."""
    modes = set(wanted.get("spec", {}).get("accessModes") or [])
    named = wanted.get("spec", {}).get("storageClassName")
    if named == "":
        return Status.warn, f'{claim}: storageClassName "" binds only a pre-created PV', "create the PV first"
    by_name = {c["metadata"]["name"]: c for c in classes}
    defaults = default_classes(classes)
    cls = named or (defaults[0] if defaults else None)
    if cls is None or cls not in by_name:
        what = f"its class {cls} does not exist" if cls else "it names no class and there is no default class"
        return (
            Status.fail,
            f"{claim}: {what} (StorageClasses: {', '.join(by_name) or 'none'}); it would stay Pending",
            "set storageClassName to a ReadWriteMany class (k8s/README.md, Storage class)",
        )
    sc = by_name[cls]
    via = f"{claim}: class {cls}{'' if named else ' (the default)'}, provisioner {sc.get('provisioner')}"
    rwx = rwx_support(sc) if RWX in modes else True
    if rwx is False:
        return (
            Status.fail,
            f"{via}: ReadWriteOnce only, the claim needs {RWX}",
            "name a shared file system class (NFS, CephFS, SFS Turbo, ...) in storageClassName",
        )
    if rwx is None:
        return Status.warn, f"{via}: cannot tell whether it gives {RWX}", "check the provisioner's docs"
    return Status.ok, f"{via}, {', '.join(sorted(modes))}", ""


def claim_row(
    claim: str, wanted: dict[str, Any] | None, existing: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> Row:
    """One claim the pods mount: it exists, or the manifest creates it, or it is missing."""
    modes = set((wanted or {}).get("spec", {}).get("accessModes") or [])
    found = next((c for c in existing if c["metadata"]["name"] == claim), None)
    if found is not None:
        return existing_claim_row(claim, modes, found)
    if wanted is None:
        return (
            Status.fail,
            f"{claim}: the pods mount it; it is neither in the manifest nor in the namespace",
            f"create claim {claim} first",
        )
    return new_claim_row(claim, wanted, classes)
