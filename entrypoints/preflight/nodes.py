"""Where the accelerator pods could land: Ready nodes, their device plugins, labels, taints and room.

Why its own module: the two node checks (accelerators, node label) share one question, "how
many of these pods fit on these nodes", asked with different filters, so that each check can
name its own reason (no NPUs at all, the wrong device plugin, a missing label, a taint, too
little memory) instead of one "unschedulable".

The fit is first-fit over each node's *allocatable* amounts, as the scheduler's resource
filter does for an empty cluster; pods already running are not subtracted (reading them needs
cluster-wide pod access that a namespace user rarely has).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from verl_consistency.entrypoints.preflight.manifest import PodGroup, parse_quantity, show_quantity

DEVICE_PLUGINS: dict[str, tuple[str, str]] = {
    "huawei.com/Ascend910": ("MindCluster's Ascend device plugin", "mindcluster"),
    "huawei.com/Ascend910B3": ("HAMi's Ascend device plugin", "hami"),
    "huawei.com/ascend-1980": ("Huawei Cloud CCE's AI plug-in", "cce"),
    "nvidia.com/gpu": ("NVIDIA's device plugin", "nvidia"),
}
"""Device resource name → (who advertises it, the overlay in k8s/overlays whose pods ask for it).
A test renders each overlay and checks that its worker groups ask for that name."""


@dataclass(frozen=True)
class Node:
    """The parts of a Node object the checks read."""

    name: str
    ready: bool
    unschedulable: bool
    ready_condition: str
    """The Ready condition as ``kubectl describe node`` shows it (status, reason: message)."""
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    allocatable: dict[str, Decimal]

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Node:
        status, spec, meta = obj.get("status") or {}, obj.get("spec") or {}, obj.get("metadata") or {}
        cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
        return cls(
            name=meta.get("name", "?"),
            ready=cond.get("status") == "True",
            unschedulable=bool(spec.get("unschedulable")),
            ready_condition=_condition(cond),
            labels=dict(meta.get("labels") or {}),
            taints=list(spec.get("taints") or []),
            allocatable={k: parse_quantity(v) for k, v in (status.get("allocatable") or {}).items()},
        )

    @property
    def usable(self) -> bool:
        return self.ready and not self.unschedulable

    def why_unusable(self) -> str:
        """Why the scheduler skips this node, as a person fixes it: NotReady with its condition,
        or cordoned (both can hold)."""
        why = [] if self.ready else [f"NotReady ({self.ready_condition})"]
        if self.unschedulable:
            why.append("cordoned (spec.unschedulable)")
        return " and ".join(why)

    def devices(self) -> dict[str, int]:
        """Known device plugins' resources this node offers (count > 0)."""
        return {k: int(v) for k, v in self.allocatable.items() if k in DEVICE_PLUGINS and v > 0}


def _condition(cond: dict[str, Any]) -> str:
    """``Ready=False, KubeletNotReady: container runtime network not ready``; no condition at all
    is a node whose kubelet never reported."""
    if not cond:
        return "no Ready condition: its kubelet never reported"
    text = f"Ready={cond.get('status', '?')}"
    if cond.get("reason"):
        text += f", {cond['reason']}"
    if cond.get("message"):
        text += f": {cond['message']}"
    return text


def missing_labels(node: Node, selector: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in selector.items() if node.labels.get(k) != v}


def tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    """Kubernetes' toleration match (``Exists`` or ``Equal``, empty key with Exists = all)."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator", "Equal")
        if op == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if (
            op == "Equal"
            and t.get("key") == taint.get("key")
            and t.get("value", "") == taint.get("value", "")
        ):
            return True
    return False


def blocking_taints(node: Node, tolerations: list[dict[str, Any]]) -> list[str]:
    return [
        f"{t.get('key')}{'=' + t['value'] if t.get('value') else ''}:{t.get('effect')}"
        for t in node.taints
        if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerated(t, tolerations)
    ]


@dataclass(frozen=True)
class Shortage:
    """Why the next pod of a group found no node: ``resource`` short (None: no node admits it,
    or no single node has room for all of its requests at once)."""

    group: str
    resource: str | None
    text: str

    def __str__(self) -> str:
        return f"{self.group}: {self.text}"


@dataclass(frozen=True)
class Fit:
    """How many pods of each group fit, and the first shortage met for those that do not."""

    placed: dict[str, int]
    wanted: dict[str, int]
    shortages: list[Shortage]

    @property
    def fits(self) -> bool:
        return all(self.placed[g] >= n for g, n in self.wanted.items())


Admits = Callable[[PodGroup, Node], bool]


def first_fit(
    groups: list[PodGroup], nodes: list[Node], admits: Admits, resources: frozenset[str] | None = None
) -> Fit:
    """Place every replica of ``groups`` on the ``nodes`` that ``admits`` lets each group use,
    counting ``resources`` of the pods' requests (all of them when None); groups share nodes."""
    free = {n.name: dict(n.allocatable) for n in nodes}
    placed = {g.name: 0 for g in groups}
    shortages: list[Shortage] = []
    for g in groups:
        need = {k: v for k, v in g.amounts("requests").items() if resources is None or k in resources}
        mine = [n for n in nodes if admits(g, n)]
        for _ in range(g.replicas):
            host = next((n for n in mine if all(free[n.name].get(k, 0) >= v for k, v in need.items())), None)
            if host is None:
                shortages.append(_shortage(g, need, mine, free))
                break
            for k, v in need.items():
                free[host.name][k] -= v
            placed[g.name] += 1
    return Fit(placed, {g.name: g.replicas for g in groups}, shortages)


def _shortage(g: PodGroup, need: dict[str, Decimal], nodes: list[Node], free: dict[str, dict]) -> Shortage:
    if not nodes:
        return Shortage(g.name, None, "no node admits it")
    for k, v in need.items():
        most = max((free[n.name].get(k, Decimal(0)) for n in nodes), default=Decimal(0))
        if most < v:
            asked, left = show_quantity(k, v), show_quantity(k, most)
            return Shortage(g.name, k, f"a pod requests {k} {asked}, the most left on a node is {left}")
    return Shortage(g.name, None, "no single node has room for all of its requests at once")
