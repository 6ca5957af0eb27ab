"""The `ray start` of a RayJob's pod, built from its group as KubeRay builds it.

No KubeRay operator runs here, so this transcribes what every release from 1.1.0 to 1.7.0 does
with the fields the manifests use (``generateRayStartCommand`` and ``convertParamMap`` in
``ray-operator/controllers/ray/common/pod.go``):

* ``num-cpus`` from the container's CPU limit, ``memory`` from its memory limit, ``num-gpus`` from
  an ``nvidia.com/gpu`` limit: each only when ``rayStartParams`` does not set it;
* every ``rayStartParams`` entry as ``--key=value`` (``true``/``false`` values as bare flags),
  joined into the container's ``bash -lc`` command line, so a value is shell text: the
  ``resources`` JSON is single-quoted, and bash removes the quotes.

:func:`node_resources` then reads the flags as Ray does: what the node offers.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from kubernetes.utils import parse_quantity

GPU_SUFFIX = "gpu"
"""KubeRay 1.1 maps a limit whose name ends in ``gpu`` (later releases: ``nvidia.com/gpu`` and kin)."""


def params(group: dict[str, Any]) -> dict[str, str]:
    """The group's rayStartParams with KubeRay's additions from the container's limits."""
    out = dict(group.get("rayStartParams") or {})
    limits = group["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {})
    if "num-cpus" not in out and "cpu" in limits:
        out["num-cpus"] = str(int(parse_quantity(limits["cpu"])))
    if "memory" not in out and "memory" in limits:
        out["memory"] = str(int(parse_quantity(limits["memory"])))
    if "num-gpus" not in out:
        for name, value in limits.items():
            if name.endswith(GPU_SUFFIX) and parse_quantity(value):
                out["num-gpus"] = str(int(parse_quantity(value)))
                break
    return out


def command_line(group: dict[str, Any]) -> str:
    """``ray start ...`` as the pod's shell receives it (keys sorted, as KubeRay 1.7 sorts them)."""
    flags = []
    for key, value in sorted(params(group).items()):
        if value.lower() in ("true", "false") and key not in ("log-color", "include-dashboard"):
            flags += [f"--{key}"] if value.lower() == "true" else []
        else:
            flags.append(f"--{key}={value}")
    return "ray start " + " ".join(flags)


def flags(group: dict[str, Any]) -> dict[str, str]:
    """The flags ``ray start`` gets after the shell's word splitting and quote removal."""
    words = shlex.split(command_line(group))[2:]
    return dict(w[2:].split("=", 1) if "=" in w else (w[2:], "true") for w in words)


def declared_resources(group: dict[str, Any]) -> dict[str, float]:
    """The resources the group's ``rayStartParams.resources`` declares (a shell word holding JSON)."""
    raw = (group.get("rayStartParams") or {}).get("resources")
    if raw is None:
        return {}
    (word,) = shlex.split(raw)
    return {k: float(v) for k, v in json.loads(word).items()}


def node_resources(group: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """(CPUs, custom and accelerator resources) that a pod of ``group`` offers to Ray."""
    got = flags(group)
    resources = {k: float(v) for k, v in json.loads(got.get("resources", "{}")).items()}
    if "num-gpus" in got:
        resources["GPU"] = float(got["num-gpus"])
    return float(got.get("num-cpus", 0)), resources
