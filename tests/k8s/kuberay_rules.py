"""Offline RayJob admission: a release's CRD schema (pruning, defaults, validation), the controller's rules.

No API server runs here, so this does its two jobs the way the real path does:
1. the API server prunes every field that the CRD's structural schema does not know (silently,
   unless the client asks for strict field validation: :func:`pruned_fields` lists them), applies
   the schema's ``default`` values (structural defaulting), then validates the openAPIV3Schema
   (:func:`schema_errors`). The schemas of KubeRay 1.1.0 to 1.7.0 are in kuberay_crds.py;
2. the KubeRay v1.7.0 controller then rejects, after admission, what the schema allows
   (``ray-operator/controllers/ray/utils/validation.go``: ValidateRayJobMetadata/Spec,
   validateRayGroupResources, validateRayGroupLabels, validateDeletionConfiguration; the
   SidecarMode and runtimeEnvYAML rules of ValidateRayJobSpec).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import yaml

MAX_RAYJOB_NAME = 47
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
RAY_START_RESOURCE_KEYS = ("num-cpus", "num-gpus", "memory", "resources")


ROOT_KEEPS = {"apiVersion", "kind", "metadata"}
"""What the API server keeps at a custom resource's root whatever the schema says (metadata is
pruned to ObjectMeta by its own rules; ours holds only name and labels)."""


def prune(obj: Any, schema: dict[str, Any], path: str = "") -> tuple[Any, list[str]]:
    """(what an API server serving ``schema`` stores of ``obj``, the paths of the fields it drops).

    Structural pruning (k8s.io/apiextensions-apiserver pkg/apiserver/schema/pruning): in an
    object, a key is kept if ``properties`` names it, if ``additionalProperties`` gives the schema
    of every key, or if ``x-kubernetes-preserve-unknown-fields`` is set; everything else goes,
    without an error. The root (and an embedded resource) keeps apiVersion, kind and metadata.
    """
    dropped: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        keeps = ROOT_KEEPS if not path or schema.get("x-kubernetes-embedded-resource") else set()
        kept: dict[str, Any] = {}
        for key, value in obj.items():
            here = f"{path}.{key}" if path else str(key)
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if key in keeps:
                kept[key] = copy.deepcopy(value)
            elif sub is not None:
                kept[key], more = prune(value, sub, here)
                dropped += more
            elif preserve or extra is True:
                kept[key] = copy.deepcopy(value)
            else:
                dropped.append(here)
        return kept, dropped
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        items = []
        for i, item in enumerate(obj):
            kept_item, more = prune(item, schema["items"], f"{path}[{i}]")
            items.append(kept_item)
            dropped += more
        return items, dropped
    return copy.deepcopy(obj), dropped


def pruned_fields(obj: Any, schema: dict[str, Any]) -> list[str]:
    """The fields an API server serving ``schema`` drops from ``obj``, silently (see :func:`prune`)."""
    return prune(obj, schema)[1]


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Close every object that declares properties: unknown fields become errors, as with
    ``kubectl apply --validate=strict``. Objects marked x-kubernetes-preserve-unknown-fields
    or with their own additionalProperties stay open."""
    out = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(out)
    return out


def apply_defaults(obj: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting: fill ``default`` of absent properties inside present objects."""
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        for key, sub in props.items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                apply_defaults(obj[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in obj.keys() - props.keys():
                apply_defaults(obj[key], extra)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            apply_defaults(item, schema["items"])
    return obj


_VALIDATORS: dict[int, tuple[dict[str, Any], jsonschema.Draft7Validator]] = {}
"""One validator per schema object (strict() copies a 200 KB schema; the tests reuse each)."""


def _validator(schema: dict[str, Any]) -> jsonschema.Draft7Validator:
    hit = _VALIDATORS.get(id(schema))
    if hit is None or hit[0] is not schema:  # the schema is kept, so its id is not reused
        hit = _VALIDATORS[id(schema)] = (schema, jsonschema.Draft7Validator(strict(schema)))
    return hit[1]


def schema_errors(rayjob: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """What the API server refuses: ``rayjob`` with the defaults applied, validated against the
    strict schema (so an unknown field is an error here too, as with ``--validate=strict``)."""
    obj = apply_defaults(copy.deepcopy(rayjob), schema)
    validator = _validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def _groups(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    cluster = spec.get("rayClusterSpec") or {}
    groups = [("head", cluster.get("headGroupSpec") or {})]
    groups += [(g.get("groupName", "?"), g) for g in cluster.get("workerGroupSpecs") or []]
    return groups


def controller_errors(rayjob: dict[str, Any]) -> list[str]:
    """What KubeRay v1.7.0's controller rejects although the schema accepts it."""
    errors: list[str] = []
    name = rayjob.get("metadata", {}).get("name", "")
    if len(name) > MAX_RAYJOB_NAME:
        errors.append(f"name {name!r} is longer than {MAX_RAYJOB_NAME}")
    if not DNS1035.match(name):
        errors.append(f"name {name!r} is not a DNS-1035 label")
    spec = rayjob.get("spec", {})
    shutdown = bool(spec.get("shutdownAfterJobFinishes"))
    if spec.get("ttlSecondsAfterFinished", 0) > 0 and not shutdown:
        errors.append("ttlSecondsAfterFinished without shutdownAfterJobFinishes")
    if spec.get("suspend") and not shutdown:
        errors.append("suspend without shutdownAfterJobFinishes")
    if spec.get("activeDeadlineSeconds") is not None and spec["activeDeadlineSeconds"] <= 0:
        errors.append("activeDeadlineSeconds must be positive")
    if spec.get("backoffLimit") is not None and spec["backoffLimit"] < 0:
        errors.append("backoffLimit must be >= 0")
    if spec.get("rayClusterSpec") is None and not spec.get("clusterSelector"):
        errors.append("one of rayClusterSpec or clusterSelector must be set")
    if spec.get("submissionMode") == "SidecarMode":
        if spec.get("submitterPodTemplate") is not None:
            errors.append("SidecarMode doesn't support SubmitterPodTemplate")
        if spec.get("submitterConfig") is not None:
            errors.append("SidecarMode doesn't support SubmitterConfig")
    try:  # dashboardclient.UnmarshalRuntimeEnvYAML: only that it is YAML (of a map)
        env = yaml.safe_load(spec.get("runtimeEnvYAML") or "") or {}
        if not isinstance(env, dict):
            errors.append("runtimeEnvYAML is not a YAML map")
    except yaml.YAMLError as exc:
        errors.append(f"runtimeEnvYAML is not valid YAML: {exc}")
    for group, g in _groups(spec):
        params = g.get("rayStartParams") or {}
        for key, value in params.items():
            if not isinstance(value, str):
                errors.append(f"{group}: rayStartParams[{key!r}] = {value!r} is not a string")
        if "labels" in params:
            errors.append(f"{group}: rayStartParams['labels'] is not supported; use the group's labels")
        if any(params.get(k) for k in RAY_START_RESOURCE_KEYS) and g.get("resources"):
            errors.append(f"{group}: resources in both rayStartParams and the group's resources")
        if not (g.get("template", {}).get("spec", {}).get("containers")):
            errors.append(f"{group}: no container")
        if group != "head":
            lo, hi = g.get("minReplicas", 0), g.get("maxReplicas", 2147483647)
            if lo > hi:
                errors.append(f"{group}: minReplicas {lo} > maxReplicas {hi}")
            replicas = g.get("replicas")
            if replicas is not None and not lo <= replicas <= hi:
                errors.append(f"{group}: replicas {replicas} outside [{lo}, {hi}]")
    return errors
