"""The checks: each one question about (manifest, cluster snapshot), each one row of the answer.

Why these: each is a way a collection run fails *after* ``kubectl apply`` said it was fine, late
and often quietly: the RayJob kind unknown; fields pruned by an older KubeRay (the pools no
longer split); pods Pending for an accelerator name the nodes do not offer, a label they do not
carry, or a quota; claims Pending for want of a (ReadWriteMany) storage class; pods stuck in
ImagePullBackOff. A check that could not read what it needs (HTTP 403) says so as a warning:
it cannot say the run will fail.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import TYPE_CHECKING

from verl_consistency.contracts import __version__, pins
from verl_consistency.entrypoints.preflight import manifest as mf
from verl_consistency.entrypoints.preflight.kuberay_check import check_kuberay, check_rayjob_fields
from verl_consistency.entrypoints.preflight.manifest import Manifest, PodGroup, parse_quantity, show_quantity
from verl_consistency.entrypoints.preflight.nodes import (
    DEVICE_PLUGINS,
    Node,
    blocking_taints,
    first_fit,
    missing_labels,
)
from verl_consistency.entrypoints.preflight.report import CheckResult, Row, Status, result, unread
from verl_consistency.entrypoints.preflight.storage import claim_row

if TYPE_CHECKING:  # cluster imports the kubernetes client, which only preflight() loads
    from verl_consistency.entrypoints.preflight.cluster import Snapshot


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _pods(groups: Iterable[PodGroup]) -> str:
    return ", ".join(
        f"{g.name} {g.replicas}× " + "+".join(f"{c} {n}" for n, c in g.device_limits().items())
        for g in groups
    )


def _usable_nodes(s: Snapshot) -> list[Node]:
    return [n for n in map(Node.of, s.nodes) if n.usable]


def _down_nodes(s: Snapshot, resources: Iterable[str]) -> list[Node]:
    """Nodes that carry one of ``resources`` but that the scheduler skips (NotReady, cordoned)."""
    wanted = set(resources)
    return [
        n for n in map(Node.of, s.nodes) if not n.usable and any(n.allocatable.get(r, 0) > 0 for r in wanted)
    ]


def _down(nodes: list[Node]) -> str:
    return "; ".join(f"{n.name} is {n.why_unusable()}" for n in nodes)


def _bring_back(nodes: list[Node]) -> str:
    """The next step for nodes that exist but are skipped: find out why, not install anything."""
    first = nodes[0].name
    todo = (
        f"bring {'it' if len(nodes) == 1 else 'them'} back: `kubectl describe node {first}` shows why "
        "(kubelet, container runtime, network, NPU driver)"
    )
    if any(n.unschedulable for n in nodes):
        todo += "; `kubectl uncordon <node>` once a cordoned node is fit again"
    return todo


def _other_plugins(nodes: list[Node], missing: list[str], groups: list[PodGroup], down: list[Node]) -> Row:
    """No Ready node offers the device name the pods ask for: name the nodes that carry it but
    are not Ready, else what the Ready nodes do offer."""
    offered: dict[str, list[int]] = {}
    for n in nodes:
        for r, c in n.devices().items():
            offered.setdefault(r, []).append(c)
    found = (
        f"no Ready node offers {', '.join(missing)} (asked by {_pods(groups)}; {_count(nodes, 'Ready node')})"
    )
    if down:
        return (
            Status.fail,
            f"{found}; {_count(down, 'node')} with it not Ready: {_down(down)}",
            _bring_back(down),
        )
    if not offered:
        return (
            Status.fail,
            found,
            "install the device plugin on the accelerator nodes (k8s/README.md, Cluster prerequisites); "
            "`kubectl describe node` lists what each node offers",
        )
    other = "; ".join(
        f"{r} is on {_count(c, 'Ready node')} ({DEVICE_PLUGINS[r][0]}, up to {max(c)} per node)"
        for r, c in offered.items()
    )
    fits = " or ".join(f"--overlay {DEVICE_PLUGINS[r][1]}" for r in offered)
    return (
        Status.fail,
        f"{found}; {other}",
        f"use the overlay for that device plugin: {fits} (kubectl apply -k k8s/overlays/<name>)",
    )


def check_accelerators(m: Manifest, s: Snapshot) -> CheckResult:
    """Ready nodes offer the device name the pods ask for, enough of it for every replica; the
    nodes that carry it but are skipped (NotReady, cordoned) are named with their condition."""
    name = "accelerators"
    groups = [g for g in m.pod_groups() if g.device_limits()]
    if not groups:
        return CheckResult(check=name, status=Status.ok, found="no pod asks for an accelerator")
    if "nodes" in s.unreadable:
        return unread(name, "nodes", s.unreadable["nodes"])
    nodes = _usable_nodes(s)
    asked = sorted({r for g in groups for r in g.device_limits()})
    down = _down_nodes(s, asked)
    missing = [r for r in asked if not any(n.allocatable.get(r, 0) > 0 for n in nodes)]
    if missing:
        return result(name, [_other_plugins(nodes, missing, groups, down)])
    fit = first_fit(groups, nodes, lambda g, n: True, frozenset(asked))
    capable = [n for n in nodes if any(n.allocatable.get(r, 0) > 0 for r in asked)]
    each = ", ".join(
        f"{n.name}: " + "+".join(str(int(n.allocatable.get(r, 0))) for r in asked) for n in capable
    )
    found = f"Ready nodes with {', '.join(asked)}: {len(capable)} ({each}); pods: {_pods(groups)}"
    skipped = f"; not counted, {_count(down, 'node')} not Ready: {_down(down)}" if down else ""
    if fit.fits:
        return result(name, [(Status.ok, found + skipped, "")])
    todo = (
        "add nodes, or ask for fewer: pods per group (TRAINER_NODES, ROLLOUT_NODES) and devices "
        "per pod (NPUS_PER_NODE) with a component (k8s/components/pool-sizes, a3-16npu)"
    )
    return result(
        name,
        [
            (
                Status.fail,
                f"{found}; too few: {'; '.join(map(str, fit.shortages))}{skipped}",
                f"{_bring_back(down)}; or {todo}" if down else todo,
            )
        ],
    )


def _placement_reasons(groups: list[PodGroup], nodes: list[Node]) -> list[str]:
    """Why device nodes are closed to a group: labels it selects and they lack, taints it does
    not tolerate."""
    reasons: list[str] = []
    for g in groups:
        sel, tol = g.spec.get("nodeSelector") or {}, g.spec.get("tolerations") or []
        cands = [n for n in nodes if all(n.allocatable.get(r, 0) > 0 for r in g.device_limits())]
        unlabelled = [n.name for n in cands if missing_labels(n, sel)]
        if unlabelled:
            want = ",".join(f"{k}={v}" for k, v in sel.items())
            reasons.append(
                f"{g.name}: {want} is missing on {len(unlabelled)} of the {len(cands)} nodes that offer "
                f"its devices ({', '.join(unlabelled)})"
            )
        for n in cands:
            taints = blocking_taints(n, tol)
            if taints and not missing_labels(n, sel):
                reasons.append(
                    f"{g.name}: node {n.name} has taints it does not tolerate: {', '.join(taints)}"
                )
    return reasons


def check_node_label(m: Manifest, s: Snapshot) -> CheckResult:
    """The nodes that offer the devices carry the pods' nodeSelector labels, allow their
    tolerations, and have the room (cpu, memory) for every replica."""
    name = "node-label"
    groups = [g for g in m.pod_groups() if g.spec.get("nodeSelector") or g.device_limits()]
    if not groups:
        return CheckResult(check=name, status=Status.ok, found="no pod selects nodes")
    if "nodes" in s.unreadable:
        return unread(name, "nodes", s.unreadable["nodes"])
    nodes = _usable_nodes(s)

    def admits_devices(g: PodGroup, n: Node) -> bool:
        return all(n.allocatable.get(r, 0) > 0 for r in g.device_limits())

    def admits(g: PodGroup, n: Node) -> bool:
        return (
            admits_devices(g, n)
            and not missing_labels(n, g.spec.get("nodeSelector") or {})
            and not blocking_taints(n, g.spec.get("tolerations") or [])
        )

    if not any(admits_devices(g, n) for g in groups for n in nodes):
        note = "not checked: no Ready node offers the devices the pods ask for (see accelerators)"
        return result(name, [(Status.warn, note, "")])
    fit = first_fit(groups, nodes, admits)
    selectors = sorted({f"{k}={v}" for g in groups for k, v in (g.spec.get("nodeSelector") or {}).items()})
    found = f"nodeSelector {', '.join(selectors) or '(none)'}"
    if fit.fits:
        placed = ", ".join(f"{g} {n}" for g, n in fit.placed.items())
        return result(name, [(Status.ok, f"{found}: every pod has a node ({placed})", "")])
    # Too few devices is the accelerators check's to say; here labels, taints, cpu and memory.
    devices = {r for g in groups for r in g.device_limits()}
    others = [str(sh) for sh in fit.shortages if sh.resource not in devices]
    reasons = list(dict.fromkeys([*_placement_reasons(groups, nodes), *others]))
    if not reasons:
        note = f"{found}: the labels and taints admit the pods; their devices are too few (see accelerators)"
        return result(name, [(Status.warn, note, "")])
    label = selectors[0] if selectors else "<key>=<value>"
    return result(
        name,
        [
            (
                Status.fail,
                f"{found}: {'; '.join(reasons)}",
                f"label the nodes (kubectl label node <node> {label}), or set the worker groups' "
                "nodeSelector and tolerations to your nodes' (k8s/README.md, Node placement); "
                "for cpu and memory, nodes with more, or smaller pods",
            )
        ],
    )


def check_storage(m: Manifest, s: Snapshot) -> CheckResult:
    """Each claim the pods mount exists bound, or the manifest's claim gets a class with its modes."""
    name = "storage"
    defined = m.claims()
    names = sorted(set(defined) | {c for g in m.pod_groups() for c in g.claims()})
    if not names:
        return CheckResult(check=name, status=Status.ok, found="no PersistentVolumeClaim used")
    for what in ("persistentvolumeclaims", "storageclasses"):
        if what in s.unreadable:
            return unread(name, what, s.unreadable[what])
    return result(name, [claim_row(n, defined.get(n), s.claims, s.storage_classes) for n in names])


def quota_needs(m: Manifest, s: Snapshot) -> dict[str, Decimal]:
    """What applying the manifest adds to the namespace's usage, by ResourceQuota key."""
    groups = m.pod_groups()
    need: dict[str, Decimal] = {"pods": Decimal(sum(g.replicas for g in groups))}
    for kind in ("requests", "limits"):
        for g in groups:
            for r, v in g.amounts(kind).items():
                need[f"{kind}.{r}"] = need.get(f"{kind}.{r}", Decimal(0)) + v * g.replicas
    for r in ("cpu", "memory", "ephemeral-storage"):
        need[r] = need.get(f"requests.{r}", Decimal(0))
    existing = {c["metadata"]["name"] for c in s.claims}
    new = [c for n, c in m.claims().items() if n not in existing]
    need["persistentvolumeclaims"] = Decimal(len(new))
    sizes = (parse_quantity(c["spec"]["resources"]["requests"]["storage"]) for c in new)
    need["requests.storage"] = sum(sizes, Decimal(0))
    rayjob = m.rayjob
    submitter = (
        rayjob is not None and rayjob.get("spec", {}).get("submissionMode", "K8sJobMode") == "K8sJobMode"
    )
    need["count/jobs.batch"] = Decimal(len(m.of_kind("Job")) + int(submitter))
    need["count/rayjobs.ray.io"] = Decimal(len(m.of_kind("RayJob")))
    return need


def _quota_rows(m: Manifest, quota: dict, need: dict[str, Decimal]) -> list[Row]:
    qn, hard = quota["metadata"]["name"], quota.get("spec", {}).get("hard") or {}
    used = quota.get("status", {}).get("used") or {}
    rows: list[Row] = []
    for key, limit in hard.items():
        if key not in need:
            continue
        left = parse_quantity(limit) - parse_quantity(used.get(key, "0"))
        line = (
            f"{qn} {key}: needs {show_quantity(key, need[key])}, {show_quantity(key, left)} left of {limit}"
        )
        rows.append((Status.fail if need[key] > left else Status.ok, line, ""))
        kind, _, res = key.partition(".") if "." in key else ("requests", "", key)
        for g in m.pod_groups() if res in ("cpu", "memory") else []:
            lacking = mf.containers_without(g.spec, kind, res)
            if lacking:
                rows.append(
                    (Status.fail, f"{qn} covers {key}: {g.name} ({', '.join(lacking)}) sets none", "")
                )
    return rows


def check_quota(m: Manifest, s: Snapshot) -> CheckResult:
    """The namespace's ResourceQuotas leave room for every pod, claim and Job the manifest adds."""
    name = "quota"
    if "resourcequotas" in s.unreadable:
        return unread(name, "resourcequotas", s.unreadable["resourcequotas"])
    if not s.quotas:
        return result(name, [(Status.ok, f"no ResourceQuota in namespace {s.target.namespace}", "")])
    need = quota_needs(m, s)
    rows = [r for q in s.quotas for r in _quota_rows(m, q, need)]
    over = [r for r in rows if r[0] == Status.fail]
    if not over:
        return result(name, [(Status.ok, "fits: " + ("; ".join(r[1] for r in rows) or "no key applies"), "")])
    todo = (
        f"ask for a larger quota in {s.target.namespace}, or fewer/smaller pods (k8s/components/pool-sizes)"
    )
    return result(name, [(Status.fail, "; ".join(r[1] for r in over), todo)])


def default_image(pin_set: str | None, accelerator: str | None) -> str:
    """What ``make -s image-name`` prints (``IMAGE_A3``, ``IMAGE_CUDA`` for A3 and NVIDIA runs) for
    the RayJob's pin set: docker/image.mk's formula (a test runs make and compares)."""
    up = pins.load(set_name=pin_set or "current").upstream
    if accelerator == "nvidia":
        return f"verl-consistency:{__version__}-verl{up.verl}-vllm{up.vllm}-cuda"
    a3 = "-a3" if accelerator == "ascend-a3" else ""
    return f"verl-consistency:{__version__}-verl{up.verl}-vllm-ascend{up.vllm_ascend}{a3}"


def has_registry(image: str) -> bool:
    """``registry.example.com/x:1`` and ``localhost:5000/x`` do; ``verl-consistency:1``, ``ns/x:1`` do not."""
    first, sep, _ = image.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def check_image(m: Manifest, s: Snapshot, expected: str | None) -> CheckResult:
    """The pods run the image you built, from where every node can pull it, with their pull secrets."""
    name = "image"
    groups = m.pod_groups()
    images = sorted({i for g in groups for i in g.images()})
    want = expected or default_image(m.label(mf.LABEL_PIN_SET), m.label(mf.LABEL_ACCELERATOR))
    rows: list[Row] = [(Status.ok, f"the pods run {', '.join(images) or 'no image'}", "")]
    # Without --image, the tag `make image` wrote, pushed under any registry path, is yours too.
    yours = [i for i in images if i == want or (expected is None and i.endswith(f"/{want}"))]
    if images and not yours:
        rows.append(
            (
                Status.warn,
                f"not {want} ({'--image' if expected else '`make -s image-name`'})",
                "render the manifests with your image (kustomize images:, k8s/README.md Image)",
            )
        )
    if any(not has_registry(i) for i in images) and len(_usable_nodes(s)) > 1:
        rows.append(
            (
                Status.warn,
                "an image without a registry, on a cluster of several nodes: each node must already have it",
                "push the image to a registry the nodes pull from, and name it <registry>/<name>:<tag>",
            )
        )
    for secret in sorted({p for g in groups for p in g.pull_secrets()}):
        why = s.unreadable.get(f"secret/{secret}")
        if why:
            rows.append((Status.warn, f"imagePullSecret {secret}: could not read it ({why})", ""))
        elif not s.secrets.get(secret):
            rows.append(
                (
                    Status.fail,
                    f"imagePullSecret {secret} is not in namespace {s.target.namespace}: ImagePullBackOff",
                    f"kubectl -n {s.target.namespace} create secret docker-registry {secret} "
                    "--docker-server=<registry> --docker-username=<user> --docker-password=<token>",
                )
            )
        else:
            rows.append((Status.ok, f"imagePullSecret {secret} exists", ""))
    return result(name, rows)


def run_all(m: Manifest, s: Snapshot, expected_image: str | None) -> list[CheckResult]:
    return [
        check_kuberay(m, s),
        check_rayjob_fields(m, s),
        check_accelerators(m, s),
        check_node_label(m, s),
        check_storage(m, s),
        check_quota(m, s),
        check_image(m, s, expected_image),
    ]
