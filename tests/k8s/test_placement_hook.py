"""The placement hook's own logic, in-process (the loopback-cluster proof is test_placement.py)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from verl_consistency.contracts import pins
from verl_consistency.patches.hooks.ray_setup import placement

pytestmark = pytest.mark.pinset


def test_import_pulls_in_neither_torch_nor_verl_nor_ray() -> None:
    code = (
        "import sys, verl_consistency.patches.hooks.ray_setup.placement as p;"
        "bad=[m for m in ('torch','verl','vllm','torch_npu','ray') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_prefixes_match_verl_pool_names() -> None:
    m = placement.DEFAULT_POOL_RESOURCES
    assert placement.resource_for("trainer_poolverl_group_8_8:1", m) == placement.TRAINER_RESOURCE
    assert placement.resource_for("rollout_pool_3verl_group_8:0", m) == placement.ROLLOUT_RESOURCE
    assert placement.resource_for("rollout_pool_reward_0verl_group_1:0", m) == placement.ROLLOUT_RESOURCE
    assert placement.resource_for("global_poolverl_group_8:0", m) is None
    assert placement.resource_for("", m) is None
    longest = {"rollout_pool_": "a", "rollout_pool_reward_": "b"}
    assert placement.resource_for("rollout_pool_reward_0x", longest) == "b"


def test_v1_defaults_add_global_pool_for_verl_09_only() -> None:
    """verl 0.9's V1 separate_async trainer runs in ``global_pool``; 0.8.0's hybrid trainer too."""
    v1 = placement.default_pool_resources("0.9.1")
    assert placement.resource_for("global_poolverl_group_8_8:0", v1) == placement.TRAINER_RESOURCE
    assert placement.resource_for("trainer_poolverl_group_8:0", v1) == placement.TRAINER_RESOURCE
    assert placement.resource_for("rollout_pool_2verl_group_8:0", v1) == placement.ROLLOUT_RESOURCE
    assert placement.resource_for("reward_poolverl_group_1:0", v1) is None
    assert placement.default_pool_resources("0.10.0.dev0") == v1
    assert placement.default_pool_resources("0.8.0") == placement.DEFAULT_POOL_RESOURCES
    assert placement.default_pool_resources(None) == placement.DEFAULT_POOL_RESOURCES
    assert placement.parse_pool_resources(None, "0.9.1") == v1
    assert placement.parse_pool_resources("", "0.9.1") == {}, "an empty setting still turns pinning off"


def test_the_installed_verl_picks_its_set_s_defaults() -> None:
    """What ``install`` reads in a Ray worker: the installed verl is the pin set's."""
    assert placement.installed_verl_version() == pins.get("upstream.verl")
    got = placement.default_pool_resources(placement.installed_verl_version())
    next_set = pins.get("set.name") == "next"
    expected = placement.V1_POOL_RESOURCES if next_set else placement.DEFAULT_POOL_RESOURCES
    assert got == expected


def test_env_mapping_parses_and_rejects_bad_entries() -> None:
    assert placement.parse_pool_resources(None) == placement.DEFAULT_POOL_RESOURCES
    assert placement.parse_pool_resources("") == {}
    assert placement.parse_pool_resources(" trainer_pool = t , rollout_pool_=r ") == {
        "trainer_pool": "t",
        "rollout_pool_": "r",
    }
    with pytest.raises(ValueError, match="pool_prefix=resource_name"):
        placement.parse_pool_resources("trainer_pool")


def test_install_wraps_ray_and_pins_only_named_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray.util

    # `ray.util.placement_group` is the function (re-exported); the module is only in sys.modules.
    pg_module = sys.modules["ray.util.placement_group"]

    calls: list[tuple[Any, ...]] = []

    def recorder(bundles: Any, strategy: str = "PACK", name: str = "", *args: Any, **kwargs: Any) -> str:
        calls.append((bundles, strategy, name, args, kwargs))
        return "pg"

    monkeypatch.setattr(pg_module, "placement_group", recorder)
    monkeypatch.setattr(ray.util, "placement_group", recorder)
    mapping = placement.install({})
    assert mapping == placement.default_pool_resources(placement.installed_verl_version())
    assert ray.util.placement_group is pg_module.placement_group is not recorder
    placement.install({})  # idempotent: wrapping twice would not add twice, but must not nest either
    pg_module.placement_group(
        [{"CPU": 3, "NPU": 1}], "STRICT_PACK", "trainer_poolverl_group_1:0", lifetime=None
    )
    pg_module.placement_group([{"CPU": 1}], "PACK", "other")
    assert calls[0][0] == [{"CPU": 3, "NPU": 1, placement.TRAINER_RESOURCE: placement.BUNDLE_AMOUNT}]
    assert calls[0][1:3] == ("STRICT_PACK", "trainer_poolverl_group_1:0")
    assert calls[0][4] == {"lifetime": None}
    assert calls[1][0] == [{"CPU": 1}]
    assert len(calls) == 2


@pytest.mark.verl
def test_verl_binds_the_wrapped_function_when_imported_after_the_hook() -> None:
    """verl's base.py does `from ray.util.placement_group import placement_group` at import."""
    code = (
        "from verl_consistency.patches.hooks.ray_setup import placement; placement.install({});"
        "import verl.single_controller.ray.base as b;"
        "import sys; sys.exit(0 if getattr(b.placement_group, '__verl_consistency_pinned__', False) else 1)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


def _node(alive: bool = True, **resources: float) -> dict[str, Any]:
    """A stand-in for one entry of ``ray.nodes()`` (its Alive and Resources keys)."""
    return {"Alive": alive, "Resources": resources}


def test_a_pool_larger_than_its_group_is_named_with_the_sizes_to_fix() -> None:
    tag = placement.TRAINER_RESOURCE
    nodes = [
        _node(NPU=8, **{tag: 1000}),
        _node(NPU=8, **{placement.ROLLOUT_RESOURCE: 1000}),  # another group's NPUs do not count
        _node(alive=False, NPU=8, **{tag: 1000}),  # nor a dead node's
        _node(NPU=0),  # the head
    ]
    assert placement.capacity_shortfall(tag, {"NPU": 8}, nodes) is None
    why = placement.capacity_shortfall(tag, {"NPU": 16}, nodes)
    assert why is not None
    assert "ask for 16 NPU in total" in why
    assert "1 Ray node(s) that offer 'verl_consistency_trainer' have 8" in why
    assert "TRAINER_NODES, ROLLOUT_NODES, NPUS_PER_NODE" in why
    assert placement.capacity_shortfall(tag, {"GPU": 1}, nodes) is not None  # GPUs count the same way


def test_the_wrapper_adds_up_what_one_process_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl makes one placement group per node of a pool: the shortfall shows on their sum."""
    import ray

    monkeypatch.setattr(placement, "_ASKED", {})
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: [_node(NPU=8, **{placement.TRAINER_RESOURCE: 1000})])
    errors: list[str] = []
    monkeypatch.setattr(placement.logger, "error", lambda msg, *a: errors.append(msg % a))
    pg = placement.wrap(lambda bundles, strategy="PACK", name="": name, placement.DEFAULT_POOL_RESOURCES)
    pg([{"CPU": 3, "NPU": 1}] * 8, "STRICT_PACK", "trainer_poolverl_group_8_8:0")
    assert errors == []
    pg([{"CPU": 3, "NPU": 1}] * 8, "STRICT_PACK", "trainer_poolverl_group_8_8:1")
    assert len(errors) == 1
    assert "'trainer_poolverl_group_8_8:1'" in errors[0]
    assert "ask for 16 NPU in total" in errors[0]
