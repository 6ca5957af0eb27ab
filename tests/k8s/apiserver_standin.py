"""A STAND-IN for the Kubernetes API server, for ``verl-consistency preflight``'s tests.

No API server can run here, so this answers over real HTTP (a ``ThreadingHTTPServer`` on
loopback) the few GET paths the preflight reads, with the object shapes of real clusters kept
in ``preflight_fixtures/`` (nodes of MindCluster, HAMi, CCE and NVIDIA device plugins; storage
classes; a ResourceQuota; a Helm-installed operator), and KubeRay's own RayJob CRD of each
release, made at serve time from that release's schema in ``crds/`` (:mod:`tests.k8s.kuberay_crds`),
or one that serves only ``v1alpha1``, as KubeRay 0.6 and older did.
Everything above the socket is real: the kubernetes Python client, its kubeconfig loading
(``kubeconfig()`` writes one pointing here), the preflight's code.

It is thin on purpose: it routes paths to objects, filters the operator Deployments by a
``name in (...)`` label selector as the real server does, answers 404 as a ``Status`` for what
it does not hold, 403 for paths a test marks forbidden, and records every request so that a
test can assert that only GETs were made. Any other method is answered 405.
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import yaml

from tests.k8s import kuberay_crds
from verl_consistency.entrypoints.preflight.kuberay_fields import RAYJOB_ALPHA, RAYJOB_CRD, RAYJOB_VERSION

FIXTURES = Path(__file__).resolve().parent / "preflight_fixtures"
NAMESPACE = "vc"


def _docs(name: str) -> list[dict[str, Any]]:
    """The fixture's documents, each caller its own copy (tests change them)."""
    return copy.deepcopy(_parsed(name))


@cache
def _parsed(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all((FIXTURES / name).read_text(), Loader=yaml.CSafeLoader) if d]


def fixture_nodes() -> dict[str, dict[str, Any]]:
    """Each node its own copy (the fixture's YAML anchors share labels and conditions)."""
    return {n["metadata"]["name"]: copy.deepcopy(n) for n in _docs("nodes.yaml")[0]["items"]}


def fixture_storage_classes() -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in _docs("storage.yaml")}


def fixture_namespaced(kind: str) -> list[dict[str, Any]]:
    return [d for d in _docs("namespace-objects.yaml") if d["kind"] == kind]


def fixture_cluster(kind: str) -> dict[str, Any]:
    return next(d for d in _docs("cluster-objects.yaml") if d["kind"] == kind)


def kuberay_crd(tag: str) -> dict[str, Any]:
    """KubeRay's RayJob CRD at ``tag`` (v1.0.0, v1.1.0, v1.2.2, ..., v1.7.0) as the API server
    serves it, each caller its own copy (tests change it).

    Why a wrapper and not a stored CRD: what the preflight reads of a CRD object is its served
    ``spec.versions[]`` (``name``, ``served``, ``schema.openAPIV3Schema``), and that schema is the
    one the admission tests use, stored once in ``crds/``. Around it stand the fields every CRD
    object has and KubeRay never changed (name, group, names, scope), and ``v1``, the served
    storage version of every stored release. Left out, because the preflight reads none of them:
    the ``v1alpha1`` version the real CRDs also serve, subresources, printer columns, the
    controller-gen annotation, ``names.categories`` and ``status``.
    """
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": RAYJOB_CRD},
        "spec": {
            "group": "ray.io",
            "names": {"kind": "RayJob", "listKind": "RayJobList", "plural": "rayjobs", "singular": "rayjob"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": RAYJOB_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": kuberay_crds.load_schema(tag)},
                }
            ],
        },
    }


def kuberay_alpha_crd() -> dict[str, Any]:
    """The RayJob CRD as KubeRay 0.6 and older installed it: ``ray.io/v1alpha1`` served alone
    (KubeRay's upgrade guide: v1alpha1 until 0.6, both in 1.0, v1 from 1.1).

    0.6's schema is not stored; what stands in for it is 1.0.0's, under the version name
    v1alpha1. The preflight reads a CRD's served version names first and, when ``v1`` is not
    among them, nothing of any schema.
    """
    crd = kuberay_crd("v1.0.0")
    (version,) = crd["spec"]["versions"]
    version["name"] = RAYJOB_ALPHA
    return crd


def _served(crd: dict[str, Any] | None) -> set[str]:
    return {v["name"] for v in (crd or {}).get("spec", {}).get("versions", []) if v.get("served")}


def _discovery(version: str) -> dict[str, Any]:
    """GET /apis/ray.io/<version>: the fixture's v1 document, for ``version``."""
    doc = fixture_cluster("APIResourceList")
    doc["groupVersion"] = f"ray.io/{version}"
    return doc


@dataclass
class StandInCluster:
    """What the stand-in API server holds. Defaults: a cluster the flat fully-async file is ready for."""

    nodes: list[dict[str, Any]] = field(default_factory=lambda: list(fixture_nodes().values())[:3])
    storage_classes: list[dict[str, Any]] = field(
        default_factory=lambda: [fixture_storage_classes()["nfs-client"]]
    )
    claims: list[dict[str, Any]] = field(default_factory=list)
    quotas: list[dict[str, Any]] = field(default_factory=list)
    secrets: list[dict[str, Any]] = field(default_factory=list)
    crd: dict[str, Any] | None = field(default_factory=lambda: kuberay_crd("v1.7.0"))
    operators: list[dict[str, Any]] = field(default_factory=lambda: [fixture_cluster("Deployment")])
    forbidden: set[str] = field(default_factory=set)
    """Paths answered 403 Forbidden (as RBAC answers a user without the verb)."""

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.nodes if n["metadata"]["name"] == name)

    def routes(self) -> dict[str, Any]:
        ns = f"/api/v1/namespaces/{NAMESPACE}"
        out: dict[str, Any] = {
            "/version": fixture_cluster("Version"),
            "/apis/ray.io/v1": _discovery("v1") if RAYJOB_VERSION in _served(self.crd) else None,
            "/apis/ray.io/v1alpha1": _discovery(RAYJOB_ALPHA) if RAYJOB_ALPHA in _served(self.crd) else None,
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayjobs.ray.io": self.crd,
            "/api/v1/nodes": _list("NodeList", "v1", self.nodes),
            "/apis/storage.k8s.io/v1/storageclasses": _list(
                "StorageClassList", "storage.k8s.io/v1", self.storage_classes
            ),
            f"{ns}/persistentvolumeclaims": _list("PersistentVolumeClaimList", "v1", self.claims),
            f"{ns}/resourcequotas": _list("ResourceQuotaList", "v1", self.quotas),
            "/apis/apps/v1/deployments": _list("DeploymentList", "apps/v1", self.operators),
        }
        for s in self.secrets:
            out[f"{ns}/secrets/{s['metadata']['name']}"] = s
        return {k: v for k, v in out.items() if v is not None}


def _list(kind: str, api_version: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": "1"}, "items": items}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _select(items: list[dict[str, Any]], selector: str) -> list[dict[str, Any]]:
    """The label selectors the preflight sends: ``key in (a,b)`` and ``key=value``."""
    m = re.fullmatch(r"\s*([\w./-]+)\s+in\s+\(([^)]*)\)\s*", selector)
    if m:
        key, values = m.group(1), {v.strip() for v in m.group(2).split(",")}
    else:
        key, _, value = selector.partition("=")
        values = {value}
    return [i for i in items if (i["metadata"].get("labels") or {}).get(key) in values]


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    accept: str


class StandInApiServer:
    """The HTTP side: start with :func:`serve`; ``requests`` is every request it received."""

    def __init__(self, cluster: StandInCluster) -> None:
        self.cluster = cluster
        self.requests: list[Request] = []
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = orjson.dumps(body)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self) -> tuple[str, dict[str, list[str]]]:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                path = url.path.rstrip("/") or "/"  # the client asks for /version/
                server.requests.append(Request(self.command, path, query, self.headers.get("Accept", "")))
                return path, query

            def do_GET(self) -> None:
                path, query = self._record()
                if path in server.cluster.forbidden:
                    return self._reply(403, _status(403, "Forbidden", f"forbidden: GET {path}"))
                obj = server.cluster.routes().get(path)
                if obj is None:
                    return self._reply(404, _status(404, "NotFound", f"the server could not find {path}"))
                obj = copy.deepcopy(obj)
                if "labelSelector" in query and "items" in obj:
                    obj["items"] = _select(obj["items"], query["labelSelector"][0])
                return self._reply(200, obj)

            def _refuse(self) -> None:
                self._record()
                self._reply(405, _status(405, "MethodNotAllowed", "the stand-in answers GET only"))

            do_POST = do_PUT = do_PATCH = do_DELETE = _refuse

        return Handler

    def kubeconfig(
        self, folder: Path, namespace: str | None = NAMESPACE, extra_context: bool = False
    ) -> Path:
        """A kubeconfig whose current context points here (``namespace`` in the context when given);
        ``extra_context`` adds a second context, ``elsewhere``, on a port where nothing listens."""
        ctx: dict[str, Any] = {"cluster": "standin", "user": "alice"}
        if namespace:
            ctx["namespace"] = namespace
        cfg: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "alice", "user": {"token": "standin-token"}}],
            "contexts": [{"name": "standin", "context": ctx}],
            "current-context": "standin",
        }
        if extra_context:
            cfg["clusters"].append({"name": "gone", "cluster": {"server": "http://127.0.0.1:9"}})
            cfg["contexts"].append({"name": "elsewhere", "context": {"cluster": "gone", "user": "alice"}})
        path = folder / "kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        return path


@contextmanager
def serve(cluster: StandInCluster) -> Iterator[StandInApiServer]:
    server = StandInApiServer(cluster)
    thread = threading.Thread(target=server.httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def dead_kubeconfig(folder: Path) -> Path:
    """A kubeconfig whose server is a loopback port nothing listens on (connection refused): the
    server's address is the kubeconfig's one cluster's ``server``."""
    import socket

    import yaml

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = folder / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    return path
