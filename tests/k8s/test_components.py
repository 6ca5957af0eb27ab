"""Components combine: every pairwise combination builds with `kubectl kustomize` and passes the checks.

Each pair of k8s/components is composed on each mode's base in a throw-away overlay (as a user's
own overlay would list them), rendered once (conftest.render caches it), and run through the same
checks as every shipped source in test_manifests.py: the whole run is there, built-in kinds
validate strictly, the RayJob passes the CRD of every KubeRay release from 1.1.0 to 1.7.0 (nothing
pruned, the pools still split) and KubeRay 1.7's controller rules, settings,
worker groups and entrypoint agree on the pool sizes, pod templates are locked down, and the NPU
resource name is the plugin's. test_checkov.py runs checkov over the same renderings.

Some pairs are refused on purpose, and the tests check that they are refused (in both orders,
with the reason in kustomize's error), not skipped: the npu-* components and nvidia exclude each
other (a cluster's worker groups use one device plugin), a3-16npu and nvidia exclude each other
(an Atlas A3 is an Ascend machine), a3-16npu and one-node exclude each other (16 NPUs per pod
or 4), and pool-sizes and one-node are for fully-async (hybrid has no rollout group).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s import test_manifests as checks
from tests.k8s.conftest import COMPONENTS, K8S, MODES, compose, kustomize, of_kind, render, run_settings

# Pairs that exclude each other, with the words of kustomize's error that say why.
MOVED = "Unable to remove nonexistent key: huawei.com/Ascend910"  # the device limit was moved already
ACCELERATOR = "testing value /metadata/labels/verl-consistency~1accelerator failed"  # two accelerators
# nvidia is built for the current set: it checks the pin-set label, next checks the head's NPU
PIN_SET = (
    "testing value /metadata/labels/verl-consistency~1pin-set failed",
    "headGroupSpec/rayStartParams/resources",
)
NPUS_PER_NODE = "testing value /data/NPUS_PER_NODE failed"  # a3-16npu's 16 or one-node's 4
EXCLUSIVE = {
    frozenset({"next", "nvidia"}): PIN_SET,
    frozenset({"a3-16npu", "one-node"}): NPUS_PER_NODE,
    frozenset({"npu-cce", "npu-hami"}): MOVED,
    frozenset({"npu-cce", "nvidia"}): MOVED,
    frozenset({"npu-hami", "nvidia"}): MOVED,
    frozenset({"a3-16npu", "nvidia"}): ACCELERATOR,
}
# Each with the words of kustomize's error on hybrid: pool-sizes finds no rollout group to size,
# one-node checks the mode label.
FULLY_ASYNC_ONLY = {
    "pool-sizes": "groupName=rollout",
    "one-node": "testing value /metadata/labels/verl-consistency~1mode failed",
}
NPU_NAMES = {
    "npu-cce": "huawei.com/ascend-1980",
    "npu-hami": "huawei.com/Ascend910B3",
    "nvidia": "nvidia.com/gpu",
}


def allowed(mode: str, combo: tuple[str, ...]) -> bool:
    if frozenset(combo) in EXCLUSIVE:
        return False
    return mode == "fully-async" or not FULLY_ASYNC_ONLY.keys() & set(combo)


PAIRS = [(m, c) for m in MODES for c in itertools.combinations(COMPONENTS, 2) if allowed(m, c)]
REFUSED = [(m, c) for m in MODES for c in itertools.combinations(COMPONENTS, 2) if not allowed(m, c)]
COMBOS = [f"compose:{m}:{'+'.join(c)}" for m, c in PAIRS]


def test_there_are_components_to_combine() -> None:
    assert {"a3-16npu", "pool-sizes", "volcano", "npu-cce", "npu-hami", "nvidia", "one-node"} <= set(
        COMPONENTS
    )
    assert len(PAIRS) >= 25  # 18 on fully-async, 10 on hybrid
    assert any("nvidia" in c for _, c in PAIRS if _ == "hybrid")


@pytest.mark.parametrize("combo", COMBOS)
def test_pair_builds_and_passes_the_checks(combo: str) -> None:
    _, mode, names = combo.split(":", 2)
    components = names.split("+")
    docs = render(combo)[1]
    (job,) = of_kind(docs, "RayJob")
    checks.check_whole_run(docs)
    checks.check_builtin_kinds(docs)
    checks.check_rayjob_admission(job)
    checks.check_pool_sizes(docs)
    checks.check_lifecycle_and_run_settings(docs)
    checks.check_pod_templates(docs)
    npu = [NPU_NAMES[c] for c in components if c in NPU_NAMES]
    checks.check_npu_resource_name(job, npu[0] if npu else "huawei.com/Ascend910")
    checks.check_images(docs)
    # Each component did its part, whatever the other one did.
    settings = run_settings(docs)
    assert settings["NPUS_PER_NODE"] == (
        "16" if "a3-16npu" in components else "4" if "one-node" in components else "8"
    )
    assert settings["TRAINER_NODES"] == ("2" if "pool-sizes" in components else "1")
    images = {c["image"] for pod in checks.pod_specs(job, of_kind(docs, "Job")[0]) for c in pod["containers"]}
    accelerator = (
        "ascend-a3" if "a3-16npu" in components else "nvidia" if "nvidia" in components else "ascend-a2"
    )
    assert images == {checks.IMAGES[accelerator]}
    labels = job["metadata"]["labels"]
    assert (labels.get("ray.io/scheduler-name") == "volcano") == ("volcano" in components)
    assert labels["verl-consistency/mode"] == mode


@pytest.mark.parametrize("combo", COMBOS)
def test_pair_order_does_not_matter(combo: str) -> None:
    _, mode, names = combo.split(":", 2)
    reverse = compose(mode, tuple(reversed(names.split("+"))))
    assert reverse.returncode == 0, reverse.stderr
    assert list(yaml.safe_load_all(reverse.stdout)) == list(yaml.safe_load_all(render(combo)[0]))


@pytest.mark.parametrize(("mode", "combo"), REFUSED, ids=[f"{m}:{'+'.join(c)}" for m, c in REFUSED])
def test_refused_pairs_fail_to_build_with_the_reason(mode: str, combo: tuple[str, ...]) -> None:
    for order in (combo, combo[::-1]):
        res = compose(mode, order)
        assert res.returncode != 0, f"{mode}: {' + '.join(order)} built, but it should be refused"
        # Either reason may come first: kustomize stops at the first failing component.
        exclusive = EXCLUSIVE.get(frozenset(combo), ())
        reasons = [exclusive] if isinstance(exclusive, str) else list(exclusive)
        if mode != "fully-async":
            reasons += [FULLY_ASYNC_ONLY[c] for c in combo if c in FULLY_ASYNC_ONLY]
        assert reasons, combo
        assert any(r in res.stderr for r in reasons), res.stderr


@pytest.mark.parametrize("mode", MODES)
def test_nvidia_changes_the_entrypoint_in_the_device_only(mode: str) -> None:
    """The nvidia component restates the mode's entrypoint (a JSON patch cannot edit one word):
    it must be the base's, with `trainer.device=npu` replaced by `--device cuda` where
    `verl-consistency run` puts it, before the first override. A base that changes its
    entrypoint without the component fails here."""
    (base,) = of_kind(render(f"kustomize:base/{mode}")[1], "RayJob")
    (gpu,) = of_kind(render(f"compose:{mode}:nvidia")[1], "RayJob")
    words = base["spec"]["entrypoint"].split()
    words.remove("trainer.device=npu")
    first_override = next(i for i, w in enumerate(words) if "=" in w)
    words[first_override:first_override] = ["--device", "cuda"]
    assert gpu["spec"]["entrypoint"].split() == words


def _replacements(path: str) -> dict[str, Any]:
    doc = yaml.safe_load((K8S / path / "kustomization.yaml").read_text())
    return {r["source"]["fieldPath"]: r for r in doc.get("replacements", [])}


@pytest.mark.parametrize("component", COMPONENTS)
def test_a_component_copies_a_setting_as_the_base_does(component: str) -> None:
    """A component that changes a size repeats the base's replacement for it, word for word."""
    base = _replacements("base/fully-async")
    mine = _replacements(f"components/{component}")
    for field, replacement in mine.items():
        assert replacement == base[field], f"{component}: the replacement of {field} differs from the base's"
    hybrid = _replacements("base/hybrid")
    for field, replacement in hybrid.items():
        assert replacement == base[field], (
            f"base/hybrid: the replacement of {field} differs from fully-async's"
        )


@pytest.mark.parametrize("mode", MODES)
def test_gpus_per_pod_follow_the_setting_with_nvidia(mode: str, tmp_path: Path) -> None:
    """A user's component that sets NPUS_PER_NODE=4 (as a3-16npu does, with its replacement)
    gives every group 4 nvidia.com/gpu and the entrypoint n_gpus_per_node=4, in either order:
    the replacements pick the limit key by the label that nvidia sets."""
    a3 = yaml.safe_load((K8S / "components" / "a3-16npu" / "kustomization.yaml").read_text())
    (mine := tmp_path / "gpus-4").mkdir()
    (mine / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1alpha1",
                "kind": "Component",
                "patches": [
                    {
                        "target": {"kind": "ConfigMap", "name": "verl-consistency-run"},
                        "patch": '[{"op": "replace", "path": "/data/NPUS_PER_NODE", "value": "4"}]',
                    }
                ],
                "replacements": a3["replacements"],
            }
        )
    )
    for order in (["nvidia", str(mine)], [str(mine), "nvidia"]):
        overlay = tmp_path / f"overlay-{order[0] == 'nvidia'}"
        overlay.mkdir()
        rel = Path(os.path.relpath(K8S, overlay))
        components = [c if c.startswith("/") else str(rel / "components" / c) for c in order]
        components = [os.path.relpath(c, overlay) if c.startswith("/") else c for c in components]
        (overlay / "kustomization.yaml").write_text(
            yaml.safe_dump({"resources": [str(rel / "base" / mode)], "components": components})
        )
        res = kustomize(overlay)
        assert res.returncode == 0, res.stderr
        docs = [d for d in yaml.safe_load_all(res.stdout) if d]
        checks.check_pool_sizes(docs)
        (job,) = of_kind(docs, "RayJob")
        checks.check_npu_resource_name(job, "nvidia.com/gpu")
        assert {checks.npu_limit(g) for g in checks.groups(job).values()} == {("nvidia.com/gpu", 4)}
