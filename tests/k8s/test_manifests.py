"""The k8s manifests: render, lint, validate (built-in kinds and the real KubeRay CRDs), and agree.

Every check runs on every source: the two plain files and every kustomize base and overlay.
The checks are plain functions of the rendered documents, so test_components.py runs the same
ones on every pairwise combination of the components. The RayJob is admitted by the CRD of every
KubeRay release from 1.1.0 to 1.7.0 (tests/k8s/crds/), with nothing pruned and the pools still
split (test_kuberay_releases.py shows what the old form lost on each).
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import tomllib
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.k8s import kuberay_rules, ray_start
from tests.k8s.conftest import (
    FILES,
    K8S,
    RENDERED,
    REPO,
    SOURCES,
    expand_entrypoint,
    of_kind,
    release_schemas,
    render,
    run_settings,
)
from verl_consistency.contracts import pins
from verl_consistency.contracts.layout import check_run_id
from verl_consistency.patches.hooks.ray_setup import placement

NPU_RESOURCE_NAMES = {"huawei.com/Ascend910", "huawei.com/Ascend910B3", "huawei.com/ascend-1980"}
GPU_RESOURCE = "nvidia.com/gpu"
# Every device limit a worker group may carry (k8s/components/npu-*, nvidia).
DEVICE_RESOURCE_NAMES = NPU_RESOURCE_NAMES | {GPU_RESOURCE}
_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def image_names(set_name: str) -> dict[str, str]:
    """What docker/image.mk builds for each value of the RayJob's verl-consistency/accelerator
    label: `make image` (IMAGE, what `make -s image-name` prints), `make image-a3` and
    `make image-cuda`, from the pin set's versions."""
    up = pins.load(set_name=set_name).upstream
    ascend = f"verl-consistency:{_VERSION}-verl{up.verl}-vllm-ascend{up.vllm_ascend}"
    return {
        "ascend-a2": ascend,
        "ascend-a3": f"{ascend}-a3",
        "nvidia": f"verl-consistency:{_VERSION}-verl{up.verl}-vllm{up.vllm}-cuda",
    }


IMAGES = image_names("current")
NEXT_IMAGES = image_names("next")
KUBE_VERSION = "1.31.0"


def rayjob(source: str) -> dict[str, Any]:
    (job,) = of_kind(render(source)[1], "RayJob")
    return job


def mode_of(job: dict[str, Any]) -> str:
    return str(job["metadata"]["labels"]["verl-consistency/mode"])


def groups(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]}


def overrides(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The entrypoint's verl overrides, expanded with the run settings (as the submitter does)."""
    (job,) = of_kind(docs, "RayJob")
    argv = expand_entrypoint(job["spec"]["entrypoint"], run_settings(docs))
    return dict(tok.split("=", 1) for tok in argv if "=" in tok and not tok.startswith("-"))


def npu_limit(group: dict[str, Any]) -> tuple[str, int]:
    """The group's one device limit (an Ascend NPU name or nvidia.com/gpu) and its count."""
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    (name,) = [k for k in limits if k in DEVICE_RESOURCE_NAMES]
    return name, int(limits[name])


def test_every_source_renders_the_whole_run(source: str) -> None:
    check_whole_run(render(source)[1])


def check_whole_run(docs: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["PersistentVolumeClaim"] * 2
        + ["ConfigMap", "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "RayJob", "Job"]
    )


def test_yamllint() -> None:
    config = "{extends: default, rules: {line-length: {max: 130}, comments: {min-spaces-from-content: 1}}}"
    # The rendered plain files are kubectl's output (its own list indentation): not linted.
    files = sorted(str(p) for p in K8S.rglob("*.yaml") if p not in RENDERED)
    res = subprocess.run(
        [sys.executable, "-m", "yamllint", "-s", "-d", config, *files], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_builtin_kinds_validate_strictly(source: str) -> None:
    check_builtin_kinds(render(source)[1])


def check_builtin_kinds(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        if doc["kind"] == "RayJob":
            continue
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("release", list(release_schemas()))
def test_rayjob_is_admitted_by_every_kuberay_release(source: str, release: str) -> None:
    check_rayjob_admission(rayjob(source), releases=[release])


def check_rayjob_admission(job: dict[str, Any], releases: list[str] | None = None) -> None:
    """Admitted as it is by each release (nothing pruned, the schema passes with the API
    server's defaults), the pools still split in what it stores, and KubeRay 1.7's controller
    rules hold."""
    for release in releases or list(release_schemas()):
        schema = release_schemas()[release]
        stored, pruned = kuberay_rules.prune(job, schema)
        assert pruned == [], f"KubeRay {release} drops {pruned}"
        assert kuberay_rules.schema_errors(job, schema) == [], release
        check_pool_split(stored)
    assert kuberay_rules.controller_errors(job) == []


def check_pool_split(job: dict[str, Any]) -> None:
    """What each worker pod offers Ray (its `ray start` flags, as KubeRay builds them): the
    group's NPUs (GPUs with nvidia) as many as its device limit, and in fully-async each group
    its own placement tag, never the other's. The head offers neither."""
    gs = groups(job)
    fully_async = mode_of(job) == "fully-async"
    tags = {"trainer": placement.TRAINER_RESOURCE, "rollout": placement.ROLLOUT_RESOURCE}
    for name, g in gs.items():
        _, offers = ray_start.node_resources(g)
        device, count = npu_limit(g)
        assert offers.get("GPU" if device == GPU_RESOURCE else "NPU") == count, (name, offers)
        assert offers.get("NPU" if device == GPU_RESOURCE else "GPU") is None, (name, offers)
        offered = {t for t in tags.values() if t in offers}
        assert offered == ({tags[name]} if fully_async else set()), (name, offers)
    head_cpus, head = ray_start.node_resources(job["spec"]["rayClusterSpec"]["headGroupSpec"])
    assert head_cpus == 0
    assert not {k for k, v in head.items() if v}, head


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (lambda j: groups(j)["trainer"].__setitem__("rayStartParams", {"num-cpus": 8}), "not a string"),
        (lambda j: groups(j)["trainer"].__setitem__("rayStartParams", {"labels": "a=b"}), "labels"),
        (lambda j: groups(j)["rollout"].__setitem__("resources", {"CPU": "1"}), "both"),
        (
            lambda j: groups(j)["rollout"].update(minReplicas=3, maxReplicas=2),
            "minReplicas 3 > maxReplicas 2",
        ),
        (
            lambda j: j["spec"].__setitem__("shutdownAfterJobFinishes", False),
            "without shutdownAfterJobFinishes",
        ),
        (lambda j: j["metadata"].__setitem__("name", "x" * 48), "longer than 47"),
        (
            lambda j: j["spec"].__setitem__("submissionMode", "SidecarMode"),
            "doesn't support SubmitterPodTemplate",
        ),
        (lambda j: j["spec"].__setitem__("runtimeEnvYAML", "a: [b"), "not valid YAML"),
    ],
)
def test_controller_rules_catch_what_the_schema_allows(mutate: Any, expect: str) -> None:
    job = copy.deepcopy(rayjob("file:fully-async"))
    mutate(job)
    assert any(expect in e for e in kuberay_rules.controller_errors(job))


@pytest.mark.parametrize("release", list(release_schemas()))
def test_schema_is_strict_and_defaults_are_applied(release: str) -> None:
    schema = release_schemas()[release]
    job = copy.deepcopy(rayjob("file:fully-async"))
    job["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParam"] = {}  # a typo
    assert any("rayStartParam" in e for e in kuberay_rules.schema_errors(job, schema))
    assert kuberay_rules.pruned_fields(job, schema) == ["spec.rayClusterSpec.headGroupSpec.rayStartParam"]
    job = copy.deepcopy(rayjob("file:fully-async"))
    for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        del g["minReplicas"], g["maxReplicas"]  # required by the schema, but defaulted first
    assert kuberay_rules.schema_errors(job, schema) == []
    raw = jsonschema_errors_without_defaults(job, schema)
    assert any("maxReplicas" in e for e in raw)


def jsonschema_errors_without_defaults(job: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    import jsonschema

    return [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(job)]


def test_pool_sizes_agree_with_worker_groups(source: str) -> None:
    check_pool_sizes(render(source)[1])


def pool_key(pool: str, settings: dict[str, str]) -> str:
    """Where verl reads a pool's size: verl 0.9 (the next pin set) moved the rollout pool's
    from the fully-async top-level `rollout.*` block to `actor_rollout_ref.rollout.*`."""
    if pool == "rollout" and settings.get("VERL_CONSISTENCY_PIN_SET") == "next":
        return "actor_rollout_ref.rollout"
    return pool


def check_pool_sizes(docs: list[dict[str, Any]]) -> None:
    """Settings, worker groups and the expanded entrypoint agree on every pool's size."""
    (job,) = of_kind(docs, "RayJob")
    settings = run_settings(docs)
    ov = overrides(docs)
    gs = groups(job)
    pools = ["trainer", "rollout"] if mode_of(job) == "fully-async" else ["trainer"]
    assert sorted(gs) == sorted(pools)
    npus = int(settings["NPUS_PER_NODE"])
    devices = set()
    for pool in pools:
        g = gs[pool]
        name, limit = npu_limit(g)
        devices.add(name)
        nodes = int(settings[f"{pool.upper()}_NODES"])
        key = pool_key(pool, settings)
        assert int(ov[f"{key}.nnodes"]) == nodes == g["replicas"] == g["minReplicas"] == g["maxReplicas"]
        assert int(ov[f"{key}.n_gpus_per_node"]) == npus == limit
        declared = ray_start.declared_resources(g)
        if name == GPU_RESOURCE:
            # KubeRay derives Ray's GPU from the limit (num-gpus); a declared one would be a second
            # source of truth, and an NPU resource a lie.
            assert not {"NPU", "GPU"} & declared.keys()
            assert "num-gpus" not in g["rayStartParams"]
        else:
            assert declared["NPU"] == npus  # KubeRay does not map Ascend limits
        assert "resources" not in g, "per-group `resources` is KubeRay 1.5+: rayStartParams.resources"
    argv = expand_entrypoint(job["spec"]["entrypoint"], settings)
    if devices == {GPU_RESOURCE}:
        # `run --device cuda` adds trainer.device=cuda itself; the head must not be told npu.
        assert argv[argv.index("--device") + 1] == "cuda"
        assert "trainer.device" not in ov
    else:
        assert len(devices) == 1
        assert "--device" not in argv
        assert ov["trainer.device"] == "npu"
    assert settings["RAYJOB_NAME"] == job["metadata"]["name"]


def test_npu_resource_name_is_the_parameter(source: str) -> None:
    by_overlay = {"hami": "huawei.com/Ascend910B3", "cce": "huawei.com/ascend-1980", "nvidia": GPU_RESOURCE}
    expected = by_overlay.get(source.rsplit("/", 1)[-1], "huawei.com/Ascend910")
    check_npu_resource_name(rayjob(source), expected)


def check_npu_resource_name(job: dict[str, Any], expected: str) -> None:
    """Every worker group asks for `expected` (and tolerates its taint), the label that picks
    the replacements' limit key says so, and the Ascend-only parts exist exactly on NPU runs."""
    assert job["metadata"]["labels"]["verl-consistency/npu-resource"] == expected.split("/", 1)[1]
    gpu = expected == GPU_RESOURCE
    assert (job["metadata"]["labels"]["verl-consistency/accelerator"] == "nvidia") == gpu
    for g in groups(job).values():
        name, _ = npu_limit(g)
        assert name == expected
        assert [t["key"] for t in g["template"]["spec"]["tolerations"]] == [expected]
        pod = g["template"]["spec"]
        host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        if gpu:  # NVIDIA's container toolkit brings the driver: no Ascend host paths at all
            assert host_paths == set()
            assert not any(m.startswith(("/usr/local/Ascend", "/usr/local/dcmi")) for m in mounts)
        else:
            assert "/usr/local/Ascend/driver" in host_paths & mounts
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]
    head_limits = head["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert not DEVICE_RESOURCE_NAMES & head_limits.keys()
    # No Ray CPUs on the head; an NPU run also declares NPU 0 there (nvidia: no GPU limit, no GPU).
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert ray_start.node_resources(head)[1] == ({} if gpu else {"NPU": 0.0})


def test_images_are_the_accelerators_build(source: str) -> None:
    docs = render(source)[1]
    check_images(docs)


def check_images(docs: list[dict[str, Any]]) -> None:
    """Every pod runs the build for the RayJob's accelerator: A2, A3 (-a3) or NVIDIA (-cuda)."""
    (job,) = of_kind(docs, "RayJob")
    (post,) = of_kind(docs, "Job")
    accelerator = job["metadata"]["labels"]["verl-consistency/accelerator"]
    pods = pod_specs(job, post)
    images = {c["image"] for pod in pods for c in [*pod.get("initContainers", []), *pod["containers"]]}
    if job["metadata"]["labels"]["verl-consistency/pin-set"] == "next" and images != {IMAGES[accelerator]}:
        # an overlay of the next set names that set's build: `make image-name PINS=next`
        assert images == {NEXT_IMAGES[accelerator]}, accelerator
    else:
        assert images == {IMAGES[accelerator]}, accelerator


@pytest.mark.parametrize("source", [s for s in SOURCES if "hybrid" not in s])
def test_fully_async_installs_the_placement_hook_and_tags_each_group(source: str) -> None:
    job = rayjob(source)
    runtime_env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    hook = runtime_env["worker_process_setup_hook"]
    module, _, func = hook.rpartition(".")
    assert getattr(__import__(module, fromlist=[func]), func) is placement.install
    offers = {name: ray_start.node_resources(g)[1] for name, g in groups(job).items()}
    trainer_tag = placement.resource_for("trainer_poolverl_group_8:0", placement.DEFAULT_POOL_RESOURCES)
    rollout_tag = placement.resource_for("rollout_pool_0verl_group_8:0", placement.DEFAULT_POOL_RESOURCES)
    assert trainer_tag in offers["trainer"]
    assert rollout_tag in offers["rollout"]
    assert trainer_tag not in offers["rollout"]
    assert rollout_tag not in offers["trainer"]


def test_lifecycle_and_run_settings(source: str) -> None:
    check_lifecycle_and_run_settings(render(source)[1])


def check_lifecycle_and_run_settings(docs: list[dict[str, Any]]) -> None:
    (job,) = of_kind(docs, "RayJob")
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0
    # Never retried: KubeRay 1.1 does not retry, 1.2+ default backoffLimit to 0
    # (test_kuberay_releases.py), and 1.1 would drop the field.
    assert "backoffLimit" not in spec
    assert spec["activeDeadlineSeconds"] > 0
    (post,) = of_kind(docs, "Job")
    assert post["spec"]["backoffLimit"] == 0
    assert post["spec"]["activeDeadlineSeconds"] > spec["activeDeadlineSeconds"]
    (cm,) = of_kind(docs, "ConfigMap")
    check_run_id(cm["data"]["RUN_ID"])
    assert cm["data"]["RAYJOB_NAME"] == job["metadata"]["name"]
    assert cm["metadata"]["name"] == f"{job['metadata']['name']}-run"
    assert post["metadata"]["name"] == f"{job['metadata']['name']}-postprocess"
    # Every ${VAR} of the entrypoint is guarded and comes from the ConfigMap; the submitter pod
    # (KubeRay's bash -ce expands them there) and the postprocess Job read that ConfigMap.
    # VERL_OVERRIDES, the user's own overrides, may be empty: `?` (set, maybe empty), and last.
    variables = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(:?\?)?\}?", spec["entrypoint"])
    assert {v for v, _ in variables} <= cm["data"].keys()
    assert variables[-1] == ("VERL_OVERRIDES", "?")
    assert spec["entrypoint"].endswith(" ${VERL_OVERRIDES?}")
    assert cm["data"]["VERL_OVERRIDES"] == ""
    assert all(guard == ":?" for _, guard in variables[:-1]), "use ${VAR:?} in the entrypoint"
    assert re.search(
        r"--run-id \$\{RUN_ID:\?\} .* actor_rollout_ref\.model\.path=\$\{MODEL_PATH:\?\} ", spec["entrypoint"]
    )
    assert spec.get("submissionMode", "K8sJobMode") == "K8sJobMode"
    (submitter,) = spec["submitterPodTemplate"]["spec"]["containers"]
    post_c = post["spec"]["template"]["spec"]["containers"][0]
    for container in (submitter, post_c):
        assert {"configMapRef": {"name": cm["metadata"]["name"]}} in container["envFrom"]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert submitter["image"] == head["image"]  # KubeRay's default: no client/server version skew
    assert "command" not in submitter  # KubeRay fills in its own submit command
    # every pod that touches the dump volume mounts the one RWX claim at /dump
    (dump_pvc,) = [
        p for p in of_kind(docs, "PersistentVolumeClaim") if p["metadata"]["name"].endswith("dump")
    ]
    assert dump_pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for pod in [*pod_specs(job, post)[:-2], pod_specs(job, post)[-1]]:  # all but the submitter
        claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
        assert claims["dump"] == dump_pvc["metadata"]["name"]
        mounts = {m["name"]: m["mountPath"] for c in pod["containers"] for m in c["volumeMounts"]}
        assert mounts["dump"] == "/dump"
    assert "wait-rayjob" in post_c["args"][0]
    assert 'postprocess "/dump/$RUN_ID" --out /dump/bundles' in post_c["args"][0]


def pod_specs(job: dict[str, Any], post: dict[str, Any]) -> list[dict[str, Any]]:
    """The Ray pods and the submitter pod (all of the RayJob), then the postprocess pod."""
    cluster = job["spec"]["rayClusterSpec"]
    return [
        cluster["headGroupSpec"]["template"]["spec"],
        *(g["template"]["spec"] for g in cluster["workerGroupSpecs"]),
        job["spec"]["submitterPodTemplate"]["spec"],
        post["spec"]["template"]["spec"],
    ]


def test_pod_templates_are_locked_down(source: str) -> None:
    """checkov does not look inside a RayJob, so its pod templates are checked here."""
    check_pod_templates(render(source)[1])


def check_pod_templates(docs: list[dict[str, Any]]) -> None:
    (job,) = of_kind(docs, "RayJob")
    (post,) = of_kind(docs, "Job")
    ray_pods, post_pod = pod_specs(job, post)[:-1], pod_specs(job, post)[-1]
    for pod in [*ray_pods, post_pod]:
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert not sc.get("privileged")
            assert "ALL" in sc["capabilities"]["drop"]
            assert set(sc["capabilities"].get("add", [])) <= {"CHOWN", "FOWNER"}, c["name"]
            image = c["image"]
            assert ":" in image, image
            assert not image.endswith(":latest"), image
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= c["resources"][kind].keys(), (c["name"], kind)
        host_paths = {v["name"] for v in pod.get("volumes", []) if "hostPath" in v}
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] in host_paths:
                    assert m.get("readOnly") is True, m
    for pod in ray_pods:  # and the submitter
        assert pod["automountServiceAccountToken"] is False
        assert pod["containers"][0]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ray_pods[-1]["restartPolicy"] == "Never"  # the submitter; KubeRay's Job retries it
    sc = post_pod["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] != 0
    assert post_pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert post_pod["serviceAccountName"] == "verl-consistency-postprocess"


def test_postprocess_service_account_may_only_read_rayjobs(source: str) -> None:
    docs = render(source)[1]
    (role,) = of_kind(docs, "Role")
    assert role["rules"] == [
        {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get", "list", "watch"]}
    ]
    (binding,) = of_kind(docs, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    (post,) = of_kind(docs, "Job")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": post["spec"]["template"]["spec"]["serviceAccountName"]}
    ]
    assert not of_kind(docs, "ClusterRole")
    assert not of_kind(docs, "ClusterRoleBinding")


def test_plain_files_are_the_documented_paths() -> None:
    for path in FILES.values():
        assert path.parent == K8S
        assert path.is_file()
        assert not path.is_symlink()
