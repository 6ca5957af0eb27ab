"""The RayJobs submitted the way KubeRay 1.7 submits them, to a real Ray cluster with its job API.

For each rendered manifest (k8s/fully-async-rayjob.yaml, k8s/hybrid-rayjob.yaml):

1. the submitter container is built from the RayJob exactly as KubeRay v1.7.0 builds it
   (kuberay_submit.py: the wait loop, ``ray job status || ray job submit --no-wait
   --runtime-env-json ... --submission-id ... -- <entrypoint>``, ``ray job logs --follow``);
2. it runs as ``/bin/bash -ce -- <that string>`` in an environment holding only what the
   submitter pod would hold: its envFrom/env from the manifest, KubeRay's three variables, and
   the image's PATH/HOME (a folder with the real ``ray`` CLI and ``python`` of this venv);
3. real ``ray job submit`` reaches a real loopback Ray 2.48 cluster shaped like the RayJob: a
   head with the dashboard and job API, no CPUs and no NPUs, and one node per worker pod with the
   group's Ray resources and its CPU limit as CPUs;
4. Ray's job supervisor starts the driver on the head, where a stand-in ``verl-consistency``
   (standin_verl_consistency.py; a real run needs NPUs) is first on PATH. It records the argv and
   the job config, parses the argv with the real CLI (``--dry-run --json``) and, for fully-async,
   builds the installed verl's real pools with the submitted runtime env only (placement_driver.py:
   verl 0.8.0's fully_async_policy on the current pin set, verl 0.9's V1 separate_async on next).

The test then asserts that the driver got the run id, model path, phase, capture and pool sizes
of the run ConfigMap, the runtime env with ``worker_process_setup_hook``, and that every pool
landed on its own worker group. ``test_the_old_submitter_loses_the_settings`` runs the same
machinery on the manifest as it was before submitterPodTemplate (no envFrom on the submitter, no
``${VAR:?}`` guards) and shows that these assertions fail on it.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s import kuberay_submit, ray_start
from tests.k8s.conftest import FILES, expand_entrypoint, of_kind, render
from tests.k8s.raycluster import LoopbackCluster, NodeSpec
from verl_consistency.contracts import pins
from verl_consistency.patches.hooks.ray_setup import placement

pytestmark = [pytest.mark.ray, pytest.mark.verl, pytest.mark.pinset, pytest.mark.timeout(900)]

STANDIN = Path(__file__).with_name("standin_verl_consistency.py")
HOOK = "verl_consistency.patches.hooks.ray_setup.placement.install"
RAY_CLI = "from ray.scripts.scripts import main; main()"
# The trainer's pool: verl 0.9's V1 trainer_base._init_resource_pool_mgr, or 0.8.0's fully_async_policy.
V1 = placement.has_v1_trainer(placement.installed_verl_version())
TRAINER_POOL = "global_pool" if V1 else "trainer_pool"


# What a user of the pin set in force applies: the plain files (current), or the next set's
# overlay and component (`kubectl apply -k k8s/overlays/next`), whose run ConfigMap names the set.
SOURCES = (
    {"file:fully-async": "file:fully-async", "file:hybrid": "file:hybrid"}
    if pins.selected() == "current"
    else {"file:fully-async": "kustomize:overlays/next", "file:hybrid": "compose:hybrid:next"}
)
# verl 0.9 reads the rollout pool's size under actor_rollout_ref (0.8.0: the top-level block).
ROLLOUT = "actor_rollout_ref.rollout" if V1 else "rollout"


def manifest(name: str) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """(RayJob, {ConfigMap name: data}) of the set's manifest as `kubectl apply` would send it."""
    source = SOURCES[name]
    if source in FILES:
        docs = [d for d in yaml.safe_load_all(FILES[source].read_text()) if d]
    else:
        docs = render(source)[1]
    (job,) = of_kind(docs, "RayJob")
    return job, {c["metadata"]["name"]: c["data"] for c in of_kind(docs, "ConfigMap")}


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The loopback cluster of the fully-async RayJob, plus the image's bin folders."""
    tmp = tmp_path_factory.mktemp("submit")
    records = tmp / "records"
    records.mkdir()
    # The submitter image's `ray` and `python` (this venv's, whatever its scripts' shebangs say).
    image_bin = tmp / "image-bin"
    image_bin.mkdir()
    (image_bin / "python").symlink_to(sys.executable)
    _executable(
        image_bin / "ray",
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(RAY_CLI)} "$@"\n',
    )
    # The head's `verl-consistency`: the stand-in, first on the head's PATH.
    head_bin = tmp / "head-bin"
    head_bin.mkdir()
    _executable(
        head_bin / "verl-consistency",
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(STANDIN))} "$@"\n',
    )
    job, _ = manifest("file:fully-async")
    cluster_spec = job["spec"]["rayClusterSpec"]
    # Each node offers what its pod's `ray start` flags say (ray_start.py: rayStartParams and the
    # CPU limit, as KubeRay passes them, through the shell's quoting).
    head_cpus, head_res = ray_start.node_resources(cluster_spec["headGroupSpec"])
    workers = []
    for group in cluster_spec["workerGroupSpecs"]:
        cpus, res = ray_start.node_resources(group)
        workers += [NodeSpec(f"{group['groupName']}-{i}", int(cpus), res) for i in range(group["replicas"])]
    cluster = LoopbackCluster(
        head_cpus=int(head_cpus),
        head_resources=head_res,
        workers=workers,
        dashboard=True,
        head_env={
            "PATH": f"{head_bin}{os.pathsep}{os.environ['PATH']}",
            "STANDIN_VERL_CONSISTENCY_RECORDS": str(records),
        },
    )
    try:
        cluster.start()
        yield {"cluster": cluster, "records": records, "image_bin": image_bin, "tmp": tmp}
    finally:
        leftovers = cluster.stop()
        assert leftovers == [], f"ray processes left running: {leftovers}"


def submit(
    world: dict[str, Any], job: dict[str, Any], configmaps: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """Run KubeRay's submitter for `job`; return its exit code, output and the driver's record."""
    cluster: LoopbackCluster = world["cluster"]
    job_id = kuberay_submit.new_submission_id(job)
    sub = kuberay_submit.submitter(job, configmaps, cluster.dashboard_url, job_id)
    home = world["tmp"] / f"home-{job_id}"
    home.mkdir()
    image_env = {"PATH": f"{world['image_bin']}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home)}
    before = set(world["records"].glob("record-*.json"))
    started = time.monotonic()
    res = subprocess.run(sub.argv, env={**image_env, **sub.env}, capture_output=True, text=True, timeout=600)
    records = []
    for path in set(world["records"].glob("record-*.json")) - before:
        rec = json.loads(path.read_text())
        if (rec.get("job_config") or {}).get("metadata", {}).get("job_submission_id") == job_id:
            records.append(rec)
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(f"http://{cluster.dashboard_url}")
    known = {j.submission_id for j in client.list_jobs()}
    status = str(client.get_job_status(job_id)) if job_id in known else None
    return {
        "argv": sub.argv,
        "rc": res.returncode,
        "output": res.stdout + res.stderr,
        "records": records,
        "status": status,
        "job_id": job_id,
        "wall_s": time.monotonic() - started,
    }


def assert_driver_got_the_run(result: dict[str, Any], job: dict[str, Any], settings: dict[str, str]) -> None:
    """What the driver on the head must have received for this RayJob to collect the right run."""
    assert result["rc"] == 0, f"the submitter failed:\n{result['output'][-5000:]}"
    assert result["status"] == "SUCCEEDED", result["output"][-5000:]
    (rec,) = result["records"]
    argv = expand_entrypoint(job["spec"]["entrypoint"], settings)
    assert argv[0] == "verl-consistency"
    assert rec["argv"] == argv[1:]
    assert rec["dry_run"]["rc"] == 0, rec["dry_run"]["stderr"]
    plan = json.loads(rec["dry_run"]["stdout"])
    assert plan["run_id"] == settings["RUN_ID"]
    assert plan["run_dir"] == f"/dump/{settings['RUN_ID']}"
    # PHASE auto: the run picks log_prob, or update_actor when bypass mode is in force
    auto = ("log_prob", "update_actor")
    assert plan["phase"] in auto if settings["PHASE"] == "auto" else plan["phase"] == settings["PHASE"]
    assert plan["collection"] == settings["COLLECTION"]
    assert plan["capture"] == settings["CAPTURE"]
    ov = dict(o.split("=", 1) for o in plan["overrides"])
    assert ov["actor_rollout_ref.model.path"] == settings["MODEL_PATH"]
    assert ov["trainer.nnodes"] == settings["TRAINER_NODES"]
    assert ov["trainer.n_gpus_per_node"] == settings["NPUS_PER_NODE"]
    runtime_env = rec["job_config"]["runtime_env"]
    if "ROLLOUT_NODES" in settings:
        assert ov[f"{ROLLOUT}.nnodes"] == settings["ROLLOUT_NODES"]
        assert ov[f"{ROLLOUT}.n_gpus_per_node"] == settings["NPUS_PER_NODE"]
        assert runtime_env.get("worker_process_setup_hook") == HOOK


def assert_pools_on_their_groups(rec: dict[str, Any], settings: dict[str, str]) -> None:
    report = rec["placement"]
    assert report, rec.get("placement_log")
    npus, trainer_nodes = int(settings["NPUS_PER_NODE"]), int(settings["TRAINER_NODES"])
    trainer = [r for r in report if r["pg"].startswith(TRAINER_POOL)]
    rollout = [r for r in report if r["pg"].startswith("rollout_pool_")]
    assert len(trainer) + len(rollout) == len(report), f"a pool of another name: {report}"
    # verl's own pools: the trainer pool (nnodes x NPUs bundles), one 1-NPU-per-bundle pool per replica
    counts = "_".join([str(npus)] * trainer_nodes)
    assert [r["pg"] for r in trainer] == [f"{TRAINER_POOL}verl_group_{counts}:0"]
    # tensor parallel 1: a replica per NPU. verl 0.9's separate_async first makes one hybrid replica
    # per trainer NPU (on the trainer's workers, no pool), so its standalone ranks start after them.
    first = npus * trainer_nodes if V1 else 0
    ranks = range(first, first + int(settings["ROLLOUT_NODES"]) * npus)
    assert {r["pg"] for r in rollout} == {f"rollout_pool_{i}verl_group_1:0" for i in ranks}
    assert all(r["state"] == "CREATED" for r in report), report
    assert {n.rsplit("-", 1)[0] for r in trainer for n in r["nodes"]} == {"trainer"}
    assert {n.rsplit("-", 1)[0] for r in rollout for n in r["nodes"]} == {"rollout"}
    assert all(
        b[placement.TRAINER_RESOURCE] == placement.BUNDLE_AMOUNT for r in trainer for b in r["bundles"]
    )
    assert all(
        b[placement.ROLLOUT_RESOURCE] == placement.BUNDLE_AMOUNT for r in rollout for b in r["bundles"]
    )


@pytest.fixture(scope="module")
def fully_async(world: dict[str, Any]) -> dict[str, Any]:
    job, cms = manifest("file:fully-async")
    return {"job": job, "cms": cms, "result": submit(world, job, cms)}


def test_kuberay_runs_one_bash_string_in_the_submitter(fully_async: dict[str, Any]) -> None:
    job, argv = fully_async["job"], fully_async["result"]["argv"]
    assert argv[:3] == ["/bin/bash", "-ce", "--"]
    assert len(argv) == 4
    assert '--runtime-env-json "{\\"worker_process_setup_hook\\":\\"' + HOOK + '\\"}"' in argv[3]
    assert (
        f"--submission-id {fully_async['result']['job_id']} -- {job['spec']['entrypoint']} ; fi ;" in argv[3]
    )


def test_fully_async_driver_gets_the_settings_and_the_hook(fully_async: dict[str, Any]) -> None:
    job, cms = fully_async["job"], fully_async["cms"]
    (settings,) = cms.values()
    assert_driver_got_the_run(fully_async["result"], job, settings)
    assert fully_async["result"]["records"][0]["env_run_id"] is None  # the head has no settings: not needed


def test_fully_async_pools_land_on_their_groups(fully_async: dict[str, Any]) -> None:
    (settings,) = fully_async["cms"].values()
    assert_pools_on_their_groups(fully_async["result"]["records"][0], settings)


def test_hybrid_driver_gets_the_settings(world: dict[str, Any]) -> None:
    job, cms = manifest("file:hybrid")
    (settings,) = cms.values()
    result = submit(world, job, cms)
    assert_driver_got_the_run(result, job, settings)
    assert "worker_process_setup_hook" not in (result["records"][0]["job_config"]["runtime_env"] or {})


def test_a_submitter_without_the_settings_refuses_to_submit(world: dict[str, Any]) -> None:
    """KubeRay's default submitter pod (no submitterPodTemplate): the ${VAR:?} guards stop it."""
    job, cms = manifest("file:fully-async")
    job = copy.deepcopy(job)
    del job["spec"]["submitterPodTemplate"]
    result = submit(world, job, cms)
    assert result["rc"] != 0
    assert "RUN_ID: parameter null or not set" in result["output"]
    assert result["status"] is None  # nothing reached Ray
    assert result["records"] == []


def test_the_old_submitter_loses_the_settings(world: dict[str, Any]) -> None:
    """The manifest as it was (default submitter, plain ${VAR}s): a run starts, with empty settings."""
    job, cms = manifest("file:fully-async")
    (settings,) = cms.values()
    job = copy.deepcopy(job)
    del job["spec"]["submitterPodTemplate"]
    # (and without VERL_OVERRIDES, which came later: its `?` guard would stop this submitter too)
    job["spec"]["entrypoint"] = (
        job["spec"]["entrypoint"].replace(" ${VERL_OVERRIDES?}", "").replace(":?}", "}")
    )
    result = submit(world, job, cms)
    assert result["rc"] == 0, result["output"][-3000:]  # KubeRay would call this submission fine
    (rec,) = result["records"]
    assert "--run-id" in rec["argv"]
    assert settings["RUN_ID"] not in rec["argv"]
    assert "actor_rollout_ref.model.path=" in rec["argv"]  # the model path expanded to nothing
    with pytest.raises(AssertionError):
        assert_driver_got_the_run(result, job, settings)


def test_verl_overrides_reach_the_driver_as_documented(world: dict[str, Any]) -> None:
    """VERL_OVERRIDES through KubeRay's submitter, the real `ray job submit` and Ray's job supervisor:
    the quoting that k8s/README.md ("Your own job") documents holds end to end, and an override
    that `run` refuses fails the Ray job (test_verl_overrides.py covers more cases without Ray)."""
    job, cms = manifest("file:hybrid")
    ((name, settings),) = cms.items()
    mine = (
        "data.train_files=/models/data/my-set/train.parquet "
        r"+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG=\'1\' trainer.experiment_name='my run'"
    )
    result = submit(world, job, {name: {**settings, "VERL_OVERRIDES": mine}})
    assert result["rc"] == 0, result["output"][-5000:]
    assert result["status"] == "SUCCEEDED", result["output"][-5000:]
    (rec,) = result["records"]
    arrived = [
        "data.train_files=/models/data/my-set/train.parquet",
        "+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG='1'",
        "trainer.experiment_name=my run",
    ]
    assert rec["argv"][-3:] == arrived
    assert rec["dry_run"]["rc"] == 0, rec["dry_run"]["stderr"]
    assert json.loads(rec["dry_run"]["stdout"])["argv"][-3:] == arrived

    refused = submit(
        world, job, {name: {**settings, "VERL_OVERRIDES": "actor_rollout_ref.rollout.mode=sync"}}
    )
    assert refused["status"] == "FAILED", refused["output"][-5000:]
    (rec,) = refused["records"]
    assert rec["dry_run"]["rc"] == 2
    assert "refused `actor_rollout_ref.rollout.mode=sync`" in rec["dry_run"]["stderr"]
