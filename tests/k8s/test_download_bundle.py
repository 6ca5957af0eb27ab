"""`make download-bundle RUN=<id>`: start a reader pod, wait, copy, always delete it.

No API server runs here, so `kubectl` is a stand-in script on PATH that logs each call and
plays the cluster's part (`cp` writes the file; `exec test -f` answers from a list). The make
target, the script and the reader pod manifest are the real ones.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.k8s.conftest import REPO

STAND_IN_KUBECTL = r"""#!/usr/bin/env python3
# Stand-in for kubectl: records argv, answers like a cluster holding the files in $PRESENT.
import json, os, sys
args = sys.argv[1:]
with open(os.environ["KUBECTL_LOG"], "a") as f:
    f.write(json.dumps({"args": args, "stdin": sys.stdin.read() if "apply" in args else ""}) + "\n")
present = os.environ.get("PRESENT", "").split(",")
if "wait" in args and os.environ.get("NOT_READY"):
    sys.exit(1)  # e.g. an image the node cannot pull
if "exec" in args:
    path = args[-1]
    sys.exit(0 if ("test" in args and path in present) or "ls" in args else 1)
if "cp" in args:
    src, dst = args[-2], args[-1]
    with open(dst, "w") as f:
        f.write("copied " + src)
"""


@pytest.fixture
def kubectl(tmp_path: Path) -> Path:
    exe = tmp_path / "bin" / "kubectl"
    exe.parent.mkdir()
    exe.write_text(STAND_IN_KUBECTL)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def make(
    tmp_path: Path, kubectl: Path, *args: str, present: str = "", env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list]:
    log = tmp_path / "kubectl.log"
    log.unlink(missing_ok=True)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("IMAGE", "READER_IMAGE")},
        "PATH": f"{kubectl.parent}:{os.environ['PATH']}",
        "KUBECTL_LOG": str(log),
        "PRESENT": present,
        **(env or {}),
    }
    res = subprocess.run(
        ["make", "--no-print-directory", "download-bundle", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return res, calls


def test_downloads_and_cleans_up(tmp_path: Path, kubectl: Path) -> None:
    dest = tmp_path / "bundles"
    res, calls = make(
        tmp_path,
        kubectl,
        "RUN=fully-async_001",
        f"BUNDLE_DIR={dest}",
        "NAMESPACE=team",
        present="/dump/bundles/bundle-fully-async_001.tar.zst",
    )
    assert res.returncode == 0, res.stderr
    out = dest / "bundle-fully-async_001.tar.zst"
    assert res.stdout.strip() == f"bundle: {out}"
    assert (
        out.read_text()
        == "copied verl-consistency-reader-fully-async-001:/dump/bundles/bundle-fully-async_001.tar.zst"
    )
    verbs = [c["args"][2] for c in calls]
    assert verbs == ["apply", "wait", "exec", "cp", "exec", "delete"]
    assert all(c["args"][:2] == ["--namespace", "team"] for c in calls)
    pod = yaml.safe_load_all(calls[0]["stdin"])
    (pod,) = [d for d in pod if d]
    assert pod["metadata"]["name"] == "verl-consistency-reader-fully-async-001"
    kubernetes_validate.validate(pod, "1.31.0", strict=True)
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "verl-consistency-dump",
        "readOnly": True,
    }
    assert not list(dest.glob(".*part"))


def test_missing_bundle_is_a_clear_error_and_the_pod_is_still_deleted(tmp_path: Path, kubectl: Path) -> None:
    res, calls = make(tmp_path, kubectl, "RUN=r1", f"BUNDLE_DIR={tmp_path / 'b'}")
    assert res.returncode != 0
    assert "/dump/bundles/bundle-r1.tar.zst is not on the dump volume" in res.stderr
    assert calls[-1]["args"][0] == "delete"
    assert "cp" not in [c["args"][0] for c in calls]
    assert not (tmp_path / "b").exists()


def test_run_is_required(tmp_path: Path, kubectl: Path) -> None:
    res, calls = make(tmp_path, kubectl)
    assert res.returncode == 2
    assert "usage: make download-bundle RUN=<run id>" in res.stderr
    assert calls == []


def test_a_checks_bundle_downloads_the_same_way(tmp_path: Path, kubectl: Path) -> None:
    """The check Job (k8s/check-job.yaml) writes /dump/bundles/bundle-<RUN_ID>.tar.zst on the
    same volume and no rayjob-<run>.json (there is no RayJob): the bundle alone comes back."""
    check = yaml.safe_load_all((REPO / "k8s" / "check-job.yaml").read_text())
    (run_id,) = [d["data"]["RUN_ID"] for d in check if d and d["kind"] == "ConfigMap"]
    dest = tmp_path / "bundles"
    res, calls = make(
        tmp_path,
        kubectl,
        f"RUN={run_id}",
        f"BUNDLE_DIR={dest}",
        present=f"/dump/bundles/bundle-{run_id}.tar.zst",
    )
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in dest.iterdir()) == [f"bundle-{run_id}.tar.zst"]
    assert [c["args"][0] for c in calls] == ["apply", "wait", "exec", "cp", "exec", "delete"]
    # a check that has not written its bundle yet: the hint names the check Job too
    res, _ = make(tmp_path, kubectl, f"RUN={run_id}", f"BUNDLE_DIR={tmp_path / 'none'}")
    assert res.returncode != 0
    assert "kubectl logs job/verl-consistency-check)" in res.stderr


def applied_pod(calls: list) -> dict:
    (pod,) = [d for d in yaml.safe_load_all(calls[0]["stdin"]) if d]
    return pod


def test_the_reader_runs_the_bundle_s_own_image(tmp_path: Path, kubectl: Path) -> None:
    """Not busybox: the image the plain files run (an air-gapped cluster has it), or IMAGE=."""
    docs = yaml.safe_load_all((REPO / "k8s" / "fully-async-rayjob.yaml").read_text())
    (job,) = [d for d in docs if d and d["kind"] == "RayJob"]
    head_image = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    present = "/dump/bundles/bundle-r1.tar.zst"
    res, calls = make(tmp_path, kubectl, "RUN=r1", f"BUNDLE_DIR={tmp_path / 'a'}", present=present)
    assert res.returncode == 0, res.stderr
    (reader,) = applied_pod(calls)["spec"]["containers"]
    assert reader["image"] == head_image
    assert reader["command"] == ["sleep", "3600"]  # not the image's ENTRYPOINT
    mine = "registry.example.com/ml/verl-consistency:0.1.0-site"
    res, calls = make(
        tmp_path, kubectl, "RUN=r1", f"BUNDLE_DIR={tmp_path / 'b'}", f"IMAGE={mine}", present=present
    )
    assert res.returncode == 0, res.stderr
    pod = applied_pod(calls)
    assert [c["image"] for c in pod["spec"]["containers"]] == [mine]
    kubernetes_validate.validate(pod, "1.31.0", strict=True)


def test_a_reader_that_never_gets_ready_says_why(tmp_path: Path, kubectl: Path) -> None:
    res, calls = make(tmp_path, kubectl, "RUN=r1", f"BUNDLE_DIR={tmp_path / 'b'}", env={"NOT_READY": "1"})
    assert res.returncode != 0
    assert "did not become ready" in res.stderr
    assert "make download-bundle RUN=r1 IMAGE=<registry/name:tag>" in res.stderr
    assert calls[-1]["args"][0] == "delete"
    assert "cp" not in [c["args"][0] for c in calls]
