"""Reaching the cluster as kubectl does, and reading (only reading) what the checks need.

Why one snapshot read up front: every check is then a pure function of (manifest, snapshot),
testable without a cluster, and the reads are a short, fixed list of GETs that a reviewer can
audit: the preflight creates, changes and deletes nothing. Objects are kept as the API server's
JSON (``_preload_content=False``), the shapes ``kubectl get -o json`` shows, not the client's
model classes.

Which cluster: ``--kubeconfig``, else ``$KUBECONFIG`` (a ``:``-separated list, merged), else
``~/.kube/config``, with ``--context`` or the current context; with no kubeconfig at all, the
in-cluster service account (inside a pod). The namespace: ``--namespace``, else the context's,
else the pod's own (in-cluster), else ``default``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from verl_consistency.entrypoints.preflight import kuberay_fields as kf
from verl_consistency.entrypoints.preflight.kuberay_fields import RAYJOB_CRD

TIMEOUT = (5, 30)
"""(connect, read) seconds of each request."""
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
OPERATOR_SELECTOR = "app.kubernetes.io/name in (kuberay-operator,kuberay)"
"""The KubeRay operator Deployment: its Helm chart's label, and its kustomize install's."""
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
"""Accept header that makes the API server return an object's metadata and nothing else."""


class Unreachable(Exception):
    """No answer from the cluster, or credentials refused (exit 2)."""


@dataclass(frozen=True)
class Target:
    context: str
    """The kubeconfig context, or ``in-cluster``."""
    server: str
    namespace: str


@dataclass
class Snapshot:
    """What was read. ``unreadable`` names each read that the API refused (what → why); the
    value of such a read is left empty and the check that needs it says it could not tell."""

    target: Target
    server_version: str = ""
    crd: dict[str, Any] | None = None
    ray_discovery: dict[str, Any] | None = None
    """``/apis/ray.io/v1`` when the CRD is unreadable (discovery: every authenticated user reads it)."""
    ray_discovery_alpha: dict[str, Any] | None = None
    """``/apis/ray.io/v1alpha1`` when the CRD is unreadable and v1 is not served (KubeRay before 1.0)."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    storage_classes: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    quotas: list[dict[str, Any]] = field(default_factory=list)
    secrets: dict[str, bool] = field(default_factory=dict)
    operator_images: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)


def _kubeconfig_files(explicit: Path | None) -> str | None:
    """The kubeconfig path list kubectl would use, or None when none of its files exists."""
    paths = str(explicit) if explicit else os.environ.get("KUBECONFIG") or str(Path("~/.kube/config"))
    if any(Path(p).expanduser().is_file() for p in paths.split(os.pathsep) if p):
        return paths
    if explicit:
        raise Unreachable(f"--kubeconfig {explicit}: no such file")
    return None


def connect(
    context: str | None, kubeconfig: Path | None, namespace: str | None
) -> tuple[client.ApiClient, Target]:
    cfg = client.Configuration()
    files = _kubeconfig_files(kubeconfig)
    try:
        if files is not None:
            config.load_kube_config(
                config_file=files, context=context, client_configuration=cfg, persist_config=False
            )
            contexts, current = config.list_kube_config_contexts(config_file=files)
            chosen = next((c for c in contexts if c["name"] == (context or current["name"])), current)
            ns = namespace or chosen.get("context", {}).get("namespace") or "default"
            target = Target(chosen["name"], cfg.host, ns)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
            own = SA_NAMESPACE.read_text().strip() if SA_NAMESPACE.is_file() else "default"
            target = Target("in-cluster", cfg.host, namespace or own)
        else:
            raise Unreachable(
                "no kubeconfig ($KUBECONFIG, ~/.kube/config) and not inside a pod: point KUBECONFIG "
                "at your cluster's kubeconfig, or pass --kubeconfig"
            )
    except config.ConfigException as exc:
        raise Unreachable(f"kubeconfig {files or '(in-cluster)'}: {exc}") from None
    return client.ApiClient(cfg), target


class Reader:
    """GETs through the kubernetes client, each answer as the API server's JSON."""

    def __init__(self, api: client.ApiClient, target: Target) -> None:
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.storage = client.StorageV1Api(api)
        self.ext = client.ApiextensionsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.version = client.VersionApi(api)
        self.snap = Snapshot(target)

    def get(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """The object, None when absent (404) or refused (403: recorded in ``unreadable``)."""
        try:
            resp = call(*args, _preload_content=False, _request_timeout=TIMEOUT, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 401:
                raise Unreachable(
                    f"{self.snap.target.server} refused the credentials of context "
                    f"{self.snap.target.context} (HTTP 401): log in again (kubectl get nodes shows it)"
                ) from None
            self.snap.unreadable[what] = f"HTTP {exc.status} {exc.reason}"
            return None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unreachable(
                f"{self.snap.target.server} did not answer ({type(exc).__name__}: {exc})"
            ) from None
        data: dict[str, Any] = orjson.loads(resp.data)
        return data

    def items(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        obj = self.get(what, call, *args, **kwargs)
        return list((obj or {}).get("items") or [])


def read(api: client.ApiClient, target: Target, pull_secrets: list[str]) -> Snapshot:
    """Every read the checks use, in one pass (GET only)."""
    r = Reader(api, target)
    snap, ns = r.snap, target.namespace
    version = r.get("version", r.version.get_code)
    snap.server_version = (version or {}).get("gitVersion", "")
    snap.crd = r.get("crd", r.ext.read_custom_resource_definition, RAYJOB_CRD)
    if "crd" in snap.unreadable:
        snap.ray_discovery = r.get("ray-discovery", r.custom.get_api_resources, "ray.io", "v1")
        if snap.ray_discovery is None and "ray-discovery" not in snap.unreadable:
            snap.ray_discovery_alpha = r.get(
                "ray-discovery-alpha", r.custom.get_api_resources, "ray.io", kf.RAYJOB_ALPHA
            )
    snap.operator_images = [
        c.get("image", "")
        for d in r.items(
            "operator", r.apps.list_deployment_for_all_namespaces, label_selector=OPERATOR_SELECTOR
        )
        for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
    ]
    snap.nodes = r.items("nodes", r.core.list_node)
    snap.storage_classes = r.items("storageclasses", r.storage.list_storage_class)
    snap.claims = r.items("persistentvolumeclaims", r.core.list_namespaced_persistent_volume_claim, ns)
    snap.quotas = r.items("resourcequotas", r.core.list_namespaced_resource_quota, ns)
    for name in pull_secrets:
        found = r.get(
            f"secret/{name}", r.core.read_namespaced_secret, name, ns, _headers={"Accept": METADATA_ONLY}
        )
        if f"secret/{name}" not in snap.unreadable:
            snap.secrets[name] = found is not None
    return snap
