"""What a rendered manifest asks the cluster for: every pod's requests, summed over replicas.

Why in the plain files: a newcomer sizing a namespace or a quota must otherwise add up five pod
templates by hand (a collection asks for about 70 CPU and 536Gi of memory besides its NPUs).
``make manifests`` writes the total in each file's header and, beside each size setting
(``TRAINER_NODES``, ``ROLLOUT_NODES``), what one pod of that group asks for, so that a change of
size can be costed where it is made. The sums are the ones ``make preflight`` checks against the
nodes and the namespace's ResourceQuota (entrypoints/preflight/manifest.py: a container's
request defaults to its limit; init containers run one at a time, so a pod counts the largest);
tests/k8s/test_render.py compares the two on every plain file.

Standard library and PyYAML's output only, as render.py.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

SUFFIX = {
    "m": Decimal("0.001"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
SETTING_OF_GROUP = {"trainer": "TRAINER_NODES", "rollout": "ROLLOUT_NODES"}
"""The run ConfigMap's key that sets a worker group's pod count."""


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (``500m``, ``256Gi``, ``8``) as a number."""
    m = QUANTITY.match(str(value).strip())
    if m is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    return Decimal(m.group(1)) * SUFFIX[m.group(2) or ""]


def show(resource: str, v: Decimal) -> str:
    """Bytes in Gi (or Mi), the rest as a plain number: as ``make preflight`` prints them."""
    if resource in ("memory", "ephemeral-storage"):
        for unit, size in (("Gi", 2**30), ("Mi", 2**20)):
            if v >= size:
                return f"{v / size:.1f}".removesuffix(".0") + unit
    return f"{v.normalize():f}"


def _container(c: dict[str, Any]) -> dict[str, Decimal]:
    res = c.get("resources") or {}
    return {k: quantity(v) for k, v in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items()}


def pod_requests(spec: dict[str, Any]) -> dict[str, Decimal]:
    """One pod's requests: the sum over its containers, or its largest init container."""
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for k, v in _container(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in spec.get("initContainers") or []:
        for k, v in _container(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    return total


@dataclass(frozen=True)
class Group:
    """``replicas`` pods of one shape; ``group`` is the worker group's name, if it is one."""

    name: str
    replicas: int
    requests: dict[str, Decimal]
    group: str | None = None


def _spec(owner: dict[str, Any]) -> dict[str, Any]:
    return (owner.get("template") or {}).get("spec") or {}


def groups(docs: list[dict[str, Any]]) -> list[Group]:
    """Every kind of pod the documents create, as preflight's ``Manifest.pod_groups`` counts them."""
    found: list[Group] = []
    for doc in docs:
        kind, spec = doc.get("kind"), doc.get("spec") or {}
        if kind == "RayJob":
            cluster = spec.get("rayClusterSpec") or {}
            found.append(Group("Ray head", 1, pod_requests(_spec(cluster.get("headGroupSpec") or {}))))
            for g in cluster.get("workerGroupSpecs") or []:
                n = int(g.get("replicas", g.get("minReplicas", 1))) * int(g.get("numOfHosts", 1))
                name = g.get("groupName", "?")
                found.append(Group(f"worker group {name}", n, pod_requests(_spec(g)), name))
            if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode" and spec.get("submitterPodTemplate"):
                sub = spec["submitterPodTemplate"].get("spec") or {}
                found.append(Group("RayJob submitter", 1, pod_requests(sub)))
        elif kind == "Job":
            name, n = doc["metadata"]["name"], int(spec.get("parallelism", 1))
            found.append(Group(f"Job {name}", n, pod_requests(_spec(spec))))
        elif kind == "Pod":
            found.append(Group(f"Pod {doc['metadata']['name']}", 1, pod_requests(spec)))
    return found


def _shown(amounts: dict[str, Decimal]) -> str:
    """``32 CPU, 256Gi memory, 8 huawei.com/Ascend910``: cpu, memory, then the devices."""
    order = ["cpu", "memory", *sorted(k for k in amounts if "/" in k)]
    label = {"cpu": "CPU", "memory": "memory"}
    return ", ".join(f"{show(k, amounts[k])} {label.get(k, k)}" for k in order if k in amounts)


def total(docs: list[dict[str, Any]]) -> tuple[int, dict[str, Decimal]]:
    """(pods, requests summed over every pod and replica)."""
    pods, sums = 0, dict[str, Decimal]()
    for g in groups(docs):
        pods += g.replicas
        for k, v in g.requests.items():
            if k in ("cpu", "memory") or "/" in k:
                sums[k] = sums.get(k, Decimal(0)) + v * g.replicas
    return pods, sums


def header_lines(docs: list[dict[str, Any]]) -> list[str]:
    """``# It asks for (requests over every pod and replica): 5 pods, 70.5 CPU, 536.2Gi ...``"""
    pods, sums = total(docs)
    text = (
        f"It asks for (requests over every pod and replica): {pods} pod{'s' if pods != 1 else ''}, "
        f"{_shown(sums)}. `make~preflight` checks them against the nodes and the namespace's quota."
    )
    lines = textwrap.wrap(text, 92, break_on_hyphens=False)  # `~`: a space where no line breaks
    return [f"# {line}".replace("~", " ") for line in lines]


def setting_notes(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[tuple[str, ...], str]]:
    """Beside each size setting of the run ConfigMap, what one pod of its worker group asks for:
    {(kind, name): {path: comment line}}."""
    out: dict[tuple[str, str], dict[tuple[str, ...], str]] = {}
    per_group = {g.group: g for g in groups(docs) if g.group}
    for doc in docs:
        data = doc.get("data") or {}
        if doc.get("kind") != "ConfigMap" or not any(k in data for k in SETTING_OF_GROUP.values()):
            continue
        for group, key in SETTING_OF_GROUP.items():
            if key in data and group in per_group:
                g = per_group[group]
                out.setdefault(("ConfigMap", doc["metadata"]["name"]), {})[("data", key)] = (
                    f"# Each {group} pod requests {_shown(g.requests)} (this file: {g.replicas} of them)."
                )
    return out
