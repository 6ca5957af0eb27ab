"""`make upload-prompts FILE=<file>`: a writer pod, `kubectl cp`, checks, a rename, always a delete.

No API server runs here, so `kubectl` is a stand-in script on PATH that logs each call and plays
the pod's part on a folder standing for the dump volume: `cp` writes there, `exec` runs the pod's
command on it (sha256sum, mv, rm, and the image's python3 reading the prompts file with this
checkout's package). The make target, the script and the writer pod manifest are the real ones.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.k8s.conftest import REPO
from tests.k8s.test_manifests import KUBE_VERSION

STAND_IN_KUBECTL = r"""#!/usr/bin/env python3
# Stand-in for kubectl: records argv; `cp` and `exec` act on $VOLUME, the pod's /dump.
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["KUBECTL_LOG"], "a") as f:
    f.write(json.dumps({"args": args, "stdin": sys.stdin.read() if "apply" in args else ""}) + "\n")
volume = os.environ["VOLUME"]
def local(path):
    return volume + path[len("/dump"):] if path.startswith("/dump") else path
if "wait" in args and os.environ.get("FAIL_WAIT"):
    sys.exit("error: timed out waiting for the condition")
if "cp" in args:
    src, dst = args[-2], local(args[-1].split(":", 1)[1])
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    data = open(src, "rb").read()
    open(dst, "wb").write(data[: len(data) // 2] if os.environ.get("CORRUPT") else data)
if "exec" in args:
    cmd = args[args.index("--") + 1:]
    cmd = [local(a) for a in cmd]
    if cmd[0] == "python3":
        cmd[0] = os.environ["PYTHON"]
    res = subprocess.run(cmd, capture_output=True, text=True)  # the pod's paths in its output
    sys.stdout.write(res.stdout.replace(volume, "/dump"))
    sys.stderr.write(res.stderr.replace(volume, "/dump"))
    sys.exit(res.returncode)
"""


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    exe = tmp_path / "bin" / "kubectl"
    exe.parent.mkdir()
    exe.write_text(STAND_IN_KUBECTL)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    volume = tmp_path / "volume"
    volume.mkdir()
    prompts = tmp_path / "capture-these.txt"
    prompts.write_text("# from report.html\nindex:3\nindex:17\nuid:abc-123\n")
    return {"tmp": tmp_path, "kubectl": exe, "volume": volume, "prompts": prompts}


def make(world: dict[str, Path], *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list]:
    log = world["tmp"] / "kubectl.log"
    log.unlink(missing_ok=True)
    full_env = {
        **os.environ,
        "PATH": f"{world['kubectl'].parent}:{os.environ['PATH']}",
        "KUBECTL_LOG": str(log),
        "VOLUME": str(world["volume"]),
        "PYTHON": sys.executable,
        **env,
    }
    # make exits 2 whenever a recipe fails: the script's own codes (2 bad input, 1 a failed copy)
    # are read by running it directly (SCRIPT=1), with the image make would pass.
    argv = ["make", "--no-print-directory", "upload-prompts", *args]
    if env.get("SCRIPT"):
        full_env["IMAGE"] = "verl-consistency:test"
        argv = ["k8s/upload-prompts.sh", *args]
    res = subprocess.run(
        argv,
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return res, calls


def verbs(calls: list) -> list[str]:
    return [c["args"][2] if c["args"][0] == "--namespace" else c["args"][0] for c in calls]


def test_uploads_checks_and_cleans_up(world: dict[str, Path]) -> None:
    res, calls = make(world, f"FILE={world['prompts']}", "NAMESPACE=team")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == (
        f"uploaded {world['prompts']} to /dump/inputs/capture-these.txt (3 prompts). "
        "In the run ConfigMap set: CAPTURE: prompts:/dump/inputs/capture-these.txt"
    )
    assert (world["volume"] / "inputs" / "capture-these.txt").read_bytes() == world["prompts"].read_bytes()
    assert [p.name for p in (world["volume"] / "inputs").iterdir()] == ["capture-these.txt"]  # no .part
    assert verbs(calls) == ["apply", "wait", "cp", "exec", "exec", "exec", "delete"]
    assert all(c["args"][:2] == ["--namespace", "team"] for c in calls)
    (pod,) = [d for d in yaml.safe_load_all(calls[0]["stdin"]) if d]
    kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)
    name = pod["metadata"]["name"]
    assert name.startswith("verl-consistency-prompts-writer-")
    assert calls[-1]["args"][2:] == ["delete", "pod", name, "--ignore-not-found", "--wait=false"]
    # the runs' image (make passes `make -s image-name`), the dump volume read-write, non-root
    image = subprocess.run(["make", "-s", "image-name"], cwd=REPO, capture_output=True, text=True).stdout
    image = image.strip()
    spec = pod["spec"]
    assert {c["image"] for c in [*spec["initContainers"], *spec["containers"]]} == {image}
    (volume,) = spec["volumes"]
    assert volume == {"name": "dump", "persistentVolumeClaim": {"claimName": "verl-consistency-dump"}}
    (writer,) = spec["containers"]
    assert writer["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False
    assert "mkdir -p /dump/inputs" in spec["initContainers"][0]["command"][-1]


def test_a_name_of_its_own_and_a_rerun_replaces_it(world: dict[str, Path]) -> None:
    res, _ = make(world, f"FILE={world['prompts']}", "NAME=week-3.txt")
    assert res.returncode == 0, res.stderr
    world["prompts"].write_text("index:5\n")
    res, _ = make(world, f"FILE={world['prompts']}", "NAME=week-3.txt")
    assert res.returncode == 0, res.stderr
    assert (world["volume"] / "inputs" / "week-3.txt").read_text() == "index:5\n"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "usage: make upload-prompts FILE=<prompts file>"),
        (["FILE=/nowhere/prompts.txt"], "/nowhere/prompts.txt: no such readable file"),
        (["FILE={prompts}", "NAME=../escape"], "NAME '../escape': letters, digits"),
        (["FILE={prompts}", "NAME=.hidden"], "not starting with '.'"),
        (["FILE={empty}"], "is empty"),
    ],
)
def test_bad_arguments_touch_nothing(world: dict[str, Path], args: list[str], words: str) -> None:
    empty = world["tmp"] / "empty.txt"
    empty.write_text("")
    res, calls = make(world, *(a.format(prompts=world["prompts"], empty=empty) for a in args))
    assert res.returncode == 2  # make's code for a failed recipe
    if args:  # and the script's own, for bad input
        script_args = [a.split("=", 1)[1] for a in args]
        assert make(world, *script_args, SCRIPT="1")[0].returncode == 2
    assert words in res.stderr
    assert calls == []


def test_a_bad_line_is_named_and_nothing_is_put_in_place(world: dict[str, Path]) -> None:
    world["prompts"].write_text("index:3\nprompt 17\n")
    res, calls = make(world, str(world["prompts"]), SCRIPT="1")
    assert res.returncode == 2
    assert f"{world['prompts']}:2: 'prompt' is not a prompt key" in res.stderr
    assert list((world["volume"] / "inputs").iterdir()) == []
    assert verbs(calls)[-1] == "delete"


def test_a_copy_that_differs_is_removed(world: dict[str, Path]) -> None:
    res, calls = make(world, str(world["prompts"]), CORRUPT="1", SCRIPT="1")
    assert res.returncode == 1
    assert "the copy on the volume differs" in res.stderr
    assert list((world["volume"] / "inputs").iterdir()) == []
    assert verbs(calls) == ["apply", "wait", "cp", "exec", "exec", "delete"]


def test_the_pod_is_deleted_when_it_never_starts(world: dict[str, Path]) -> None:
    res, calls = make(world, f"FILE={world['prompts']}", FAIL_WAIT="1")
    assert res.returncode != 0
    assert verbs(calls) == ["apply", "wait", "delete"]
