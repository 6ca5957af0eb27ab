"""Pin verl's resource pools to Ray worker groups: a Ray ``worker_process_setup_hook``.

Why: in fully-async mode the rollouter and the trainer must run on separate NPU pools, but
verl 0.8.0 does not tell Ray which worker group a pool belongs to. Every pool becomes plain
``{CPU: n, NPU: 1}`` bundles, so on two identical nodes Ray may put the rollout replicas on
the trainer's node. verl names its pools, though (read in verl 0.8.0):

* ``trainer_pool`` — ``verl/experimental/separation/utils.py:create_resource_pool_manager``;
* ``rollout_pool_<rank>`` — ``verl/workers/rollout/replica.py:RolloutReplica.init_standalone``
  (also ``rollout_pool_reward_<rank>`` / ``rollout_pool_teacher_<rank>``);

and ``RayResourcePool.get_placement_groups`` (``verl/single_controller/ray/base.py``) names
each placement group ``<pool name>verl_group_<counts>:<idx>``.

verl 0.9.1 (the ``next`` pin set) keeps the rollout names and the placement-group naming
(``replica.py:198``, ``base.py:135-156``), but its V1 trainer (``trainer.v1.trainer_mode=separate_async``)
puts the trainer in ``global_pool`` (``verl/trainer/ppo/v1/trainer_base.py:_init_resource_pool_mgr``,
L817); the still-shipped ``fully_async_policy`` keeps ``trainer_pool``. So on verl >= 0.9 the
default also pins ``global_pool`` to the trainer group. On 0.8.0 it does not: there
``global_pool`` is the hybrid ``main_ppo`` trainer's pool, whose RayJob declares no trainer tag.

This hook wraps Ray's ``placement_group()`` and, by pool-name prefix, adds a tiny amount of a per-group custom
resource to every bundle. Each KubeRay worker group declares a large amount of its own custom
resource, so a bundle can only land on a node of its group. Custom resources work on every
Ray version; label selectors (``bundle_label_selector``) would need Ray >= 2.49, and the
vllm-ascend 0.18.0 image pins ``ray<=2.48.0``.

Install it in every Ray worker through the job's runtime env (the RayJob's ``runtimeEnvYAML``)::

    worker_process_setup_hook: verl_consistency.patches.hooks.ray_setup.placement.install

verl creates all its pools inside Ray actors (TaskRunner, FullyAsyncTrainer, the rollouter),
never in the driver, so a worker-process hook sees every ``placement_group()`` call.

Importing this module imports neither torch, verl nor vLLM; it imports Ray only in
:func:`install`.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl_consistency.contracts.env import POOL_RESOURCES

logger = logging.getLogger(__name__)

"""``prefix=resource[,prefix=resource...]``; overrides :data:`DEFAULT_POOL_RESOURCES`.

Set it to an empty string to turn pinning off while keeping the hook installed.
"""

TRAINER_RESOURCE = "verl_consistency_trainer"
ROLLOUT_RESOURCE = "verl_consistency_rollout"

DEFAULT_POOL_RESOURCES: dict[str, str] = {
    "trainer_pool": TRAINER_RESOURCE,
    "rollout_pool_": ROLLOUT_RESOURCE,
}
"""verl 0.8.0's pool-name prefixes and the custom resource each worker group declares."""

V1_POOL_RESOURCES: dict[str, str] = {"global_pool": TRAINER_RESOURCE, **DEFAULT_POOL_RESOURCES}
"""verl >= 0.9: the V1 trainer's ``global_pool`` too (``separate_async`` runs its trainer there)."""


def installed_verl_version() -> str | None:
    """verl's version from its distribution metadata: no import of verl (nor torch) needed."""
    from importlib import metadata

    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        return None


def has_v1_trainer(verl_version: str | None) -> bool:
    """Whether this verl release runs fully async as the V1 ``separate_async`` trainer (0.9 on)."""
    m = re.match(r"(\d+)\.(\d+)", verl_version or "")
    return bool(m) and (int(m[1]), int(m[2])) >= (0, 9)


def default_pool_resources(verl_version: str | None) -> dict[str, str]:
    """The defaults for the verl release that runs: V1's names from 0.9 on, else 0.8.0's."""
    return dict(V1_POOL_RESOURCES if has_v1_trainer(verl_version) else DEFAULT_POOL_RESOURCES)


BUNDLE_AMOUNT = 0.001
"""What each bundle asks for. Tiny, so the resource is a tag and not a capacity: a worker group
declaring ``1000`` of it can hold a million bundles, and NPUs and CPUs stay the real limits."""

_WRAPPED_FLAG = "__verl_consistency_pinned__"

# Modules that bind ``placement_group`` by name at import time (``from ... import placement_group``).
# If one of them was imported before the hook ran (a preloaded module), its name is rebound too.
_BINDERS = ("verl.single_controller.ray.base",)


def parse_pool_resources(raw: str | None, verl_version: str | None = None) -> dict[str, str]:
    """Parse :data:`POOL_RESOURCES`. ``None`` gives the defaults of ``verl_version`` (see
    :func:`default_pool_resources`; 0.8.0's when not given); a bad entry is an error."""
    if raw is None:
        return default_pool_resources(verl_version)
    mapping: dict[str, str] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        prefix, sep, resource = item.partition("=")
        if not sep or not prefix.strip() or not resource.strip():
            raise ValueError(
                f"{POOL_RESOURCES}={raw!r}: entry {item!r} is not 'pool_prefix=resource_name'"
                " (example: trainer_pool=verl_consistency_trainer,rollout_pool_=verl_consistency_rollout)"
            )
        mapping[prefix.strip()] = resource.strip()
    return mapping


def resource_for(name: str | None, mapping: Mapping[str, str]) -> str | None:
    """The custom resource of the longest prefix that ``name`` starts with, or ``None``."""
    if not name:
        return None
    matches = [prefix for prefix in mapping if name.startswith(prefix)]
    return mapping[max(matches, key=len)] if matches else None


def pin_bundles(
    bundles: Sequence[Mapping[str, float]], resource: str, amount: float = BUNDLE_AMOUNT
) -> list[dict[str, float]]:
    """A copy of ``bundles`` where each bundle also asks for ``amount`` of ``resource``."""
    return [{**bundle, resource: amount} for bundle in bundles]


def wrap(original: Callable[..., Any], mapping: Mapping[str, str]) -> Callable[..., Any]:
    """Wrap a ``placement_group(bundles, strategy, name, ...)`` function; idempotent."""
    if getattr(original, _WRAPPED_FLAG, False):
        return original

    @functools.wraps(original)
    def placement_group(
        bundles: list[dict[str, float]], strategy: str = "PACK", name: str = "", *args: Any, **kwargs: Any
    ) -> Any:
        resource = resource_for(name, mapping)
        if resource is not None:
            bundles = pin_bundles(bundles, resource)
            logger.info(
                "verl-consistency: placement group %r pinned to nodes with resource %r", name, resource
            )
            _warn_if_absent(resource, name)
            _check_capacity(resource, name, bundles)
        return original(bundles, strategy, name, *args, **kwargs)

    setattr(placement_group, _WRAPPED_FLAG, True)
    return placement_group


def _warn_if_absent(resource: str, name: str) -> None:
    """A pinned group waits forever if no node offers the resource; say so where users look."""
    try:
        import ray

        if ray.is_initialized() and resource not in ray.cluster_resources():
            logger.warning(
                "verl-consistency: no Ray node offers resource %r, so placement group %r waits until one "
                "joins. Check that the worker group declares it (RayJob "
                "workerGroupSpecs[].rayStartParams.resources).",
                resource,
                name,
            )
    except Exception:  # a diagnostic must never break scheduling
        logger.debug("could not read cluster resources", exc_info=True)


DEVICES = ("NPU", "GPU")
"""The accelerators whose total a pinned pool may not exceed on the nodes of its group."""

_ASKED: dict[str, dict[str, float]] = {}
"""Per custom resource, the accelerators that this process's pinned placement groups ask for."""


def capacity_shortfall(
    resource: str, asked: Mapping[str, float], nodes: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why the pools pinned to ``resource`` can never all be placed, or None.

    ``asked``: the accelerators those pools ask for in total; ``nodes``: ``ray.nodes()``. A RayJob
    whose run settings (TRAINER_NODES, ROLLOUT_NODES, NPUS_PER_NODE) were changed without its
    worker groups (replicas, NPU limits) asks for more than its group offers: its placement
    groups would wait, silently, until the RayJob's deadline. This says so instead."""
    group = [n for n in nodes if n.get("Alive") and (n.get("Resources") or {}).get(resource)]
    for device in DEVICES:
        want = asked.get(device, 0.0)
        have = sum(float((n.get("Resources") or {}).get(device, 0.0)) for n in group)
        if want > have:
            return (
                f"the placement groups pinned to {resource!r} ask for {want:g} {device} in total, but the "
                f"{len(group)} Ray node(s) that offer {resource!r} have {have:g}. The run's sizes "
                "(TRAINER_NODES, ROLLOUT_NODES, NPUS_PER_NODE) and the RayJob's worker groups (replicas, "
                "NPU limits, rayStartParams) disagree: change them together, with a kustomize component "
                "(k8s/components/pool-sizes), not in a rendered file alone. The rest waits until then."
            )
    return None


def _check_capacity(resource: str, name: str, bundles: Sequence[Mapping[str, float]]) -> None:
    asked = _ASKED.setdefault(resource, {})
    for device in DEVICES:
        asked[device] = asked.get(device, 0.0) + sum(float(b.get(device, 0.0)) for b in bundles)
    try:
        import ray

        if ray.is_initialized() and (why := capacity_shortfall(resource, asked, ray.nodes())):
            logger.error("verl-consistency: placement group %r: %s", name, why)
    except Exception:  # a diagnostic must never break scheduling
        logger.debug("could not read the cluster's nodes", exc_info=True)


def install(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The setup hook: wrap Ray's ``placement_group`` in this process. Returns the mapping used."""
    import ray.util
    import ray.util.placement_group

    env = os.environ if environ is None else environ
    mapping = parse_pool_resources(env.get(POOL_RESOURCES), installed_verl_version())
    if not mapping:
        return mapping
    module = sys.modules["ray.util.placement_group"]
    wrapped = wrap(module.placement_group, mapping)
    module.placement_group = wrapped  # type: ignore[attr-defined]
    # `ray.util` re-exports the function under the same name as the submodule.
    ray.util.placement_group = wrapped  # type: ignore[attr-defined,assignment]
    for binder in _BINDERS:
        bound = sys.modules.get(binder)
        if bound is not None and hasattr(bound, "placement_group"):
            bound.placement_group = wrap(bound.placement_group, mapping)  # type: ignore[attr-defined]
    return mapping
