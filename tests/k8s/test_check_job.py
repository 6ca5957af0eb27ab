"""k8s/check-job.yaml: the one-pod `verl-consistency check` Job (no RayJob), from k8s/base/check.

It renders (test_render.py checks that the plain file is what `make manifests` writes); the
built-in kinds validate strictly; it reuses what the RayJobs do (the same two volumes, the image,
the NPU resource, node selector and toleration, the Ascend host mounts) and is locked down like
them (no token,
no secrets, capabilities dropped, requests = limits, one attempt); and its args, expanded as the
kubelet expands $(VAR) from the ConfigMap, are a valid `verl-consistency check` invocation
(tests/fixtures/check_interface.py: the registered command when it exists, issue 22's interface
until then). checkov covers it in test_checkov.py; the bundle download in test_download_bundle.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.fixtures import check_interface
from tests.k8s.conftest import CHECK_FILE, CHECK_SOURCES, FILES, K8S, of_kind, render
from verl_consistency.contracts.layout import check_run_id

KUBE_VERSION = "1.31.0"
NPU = "huawei.com/Ascend910"


@pytest.fixture(params=CHECK_SOURCES)
def docs(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(str(request.param))[1]


def parts(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """(the Job, the ConfigMap's data, the check container)."""
    (job,) = of_kind(docs, "Job")
    (cm,) = of_kind(docs, "ConfigMap")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return job, {k: str(v) for k, v in cm["data"].items()}, container


def kubelet_expand(arg: str, env: dict[str, str]) -> str:
    """$(VAR) as the kubelet expands command and args (k8s.io/kubernetes third_party/forked/golang/expansion):
    a defined VAR is replaced, an undefined one is left as written, and $$ is a literal $."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, arg)


def check_argv(docs: list[dict[str, Any]]) -> list[str]:
    """The command the pod runs: the image's ENTRYPOINT execs `verl-consistency` with the args."""
    _, settings, container = parts(docs)
    args = [kubelet_expand(a, settings) for a in container["args"]]
    unexpanded = [a for a in args if "$(" in a]
    assert not unexpanded, f"the ConfigMap lacks a variable the Job's args use: {unexpanded}"
    return ["verl-consistency", *args]


def test_renders_the_check_and_its_volumes_only(docs: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ConfigMap", "NetworkPolicy", "Job", "PersistentVolumeClaim", "PersistentVolumeClaim"]
    )
    assert not of_kind(docs, "RayJob")  # no KubeRay needed


def test_builtin_kinds_validate_strictly(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_args_are_a_valid_check_invocation(docs: list[dict[str, Any]]) -> None:
    argv = check_argv(docs)
    assert check_interface.problems(argv) == []
    opts = check_interface.options(argv)
    assert opts["--device"] == "npu"
    assert opts["--dump-root"] == "/dump"
    assert opts["--engine"] == "fsdp"
    check_run_id(opts["--run-id"])
    job, settings, container = parts(docs)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert opts["--model"].startswith(mounts["models"]["mountPath"] + "/")
    # One setting, two places: --tp and the NPU limit (the kustomize replacement).
    assert int(opts["--tp"]) == int(container["resources"]["limits"][NPU]) == int(settings["TP"])
    # No `command`: the image's ENTRYPOINT (docker/entrypoint.sh) loads CANN's environment,
    # then execs `verl-consistency` with these args.
    assert "command" not in container
    entrypoint = (K8S.parent / "docker" / "entrypoint.sh").read_text()
    assert 'exec verl-consistency "$@"' in entrypoint
    assert job["metadata"]["name"] == "verl-consistency-check"


STAND_IN_CHECK = """
import enum
from pathlib import Path
from typing import Literal

import typer


class Device(str, enum.Enum):
    cpu = "cpu"
    cuda = "cuda"
    npu = "npu"


app = typer.Typer()


@app.command("check")
def check(
    model: Path | None = typer.Option(None, exists=True, help="a Hugging Face folder"),
    device: Device = typer.Option(Device.cpu),
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = typer.Option("auto"),
    tp: int = typer.Option(1, min=1),
    engine: Literal["fsdp"] = typer.Option("fsdp"),
    dump_root: Path = typer.Option(Path("out")),
    run_id: str | None = typer.Option(None),
    keep: bool = typer.Option(False, "--keep"),
) -> None: ...


@app.command("other")
def other() -> None: ...


app()
"""


def test_a_drifted_invocation_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself can fail, on both of its paths: issue 22's table, and a registered
    command's `--help` (a stand-in typer app with the interface's shapes: an Enum, Literals, an
    int range, a flag), read the way problems() reads the real one."""
    good = check_argv(render("file:check")[1])
    tp_at = good.index("--tp") + 1
    bad = [
        [*good[:-2], "--run-identifier", good[-1]],  # a renamed option
        ["verl-consistency", "check", "--device", "tpu"],  # a choice that does not exist
        [*good[:tp_at], "two", *good[tp_at + 1 :]],  # not an integer
        [*good, "--tp"],  # an option without its value
        [*good, "extra"],  # a positional argument the command does not take
        ["verl-consistency", "run", *good[2:]],  # another command
    ]
    assert check_interface.problems(good) == []
    for argv in bad:
        assert check_interface.problems(argv), argv

    script = tmp_path / "standin_check.py"
    script.write_text(STAND_IN_CHECK)
    res = subprocess.run(
        [sys.executable, str(script), "check", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"},
    )
    assert res.returncode == 0, res.stderr
    spec = check_interface.parse_help(res.stdout)
    assert spec["--device"] == {"cpu", "cuda", "npu"}
    assert spec["--tp"] is int
    assert spec["--keep"] is bool
    assert spec["--model"] is str
    monkeypatch.setattr(check_interface, "registered", lambda: True)
    monkeypatch.setattr(check_interface, "help_text", lambda: res.stdout)
    assert check_interface.problems(good) == []
    assert check_interface.problems([*good, "--keep"]) == []
    for argv in bad:
        assert check_interface.problems(argv), argv
    assert "--prompts" in " ".join(check_interface.problems([*good, "--prompts", "p.jsonl"]))


def test_locked_down(docs: list[dict[str, Any]]) -> None:
    job, _, _ = parts(docs)
    spec = job["spec"]
    assert spec["backoffLimit"] == 0  # a check is read, not retried blindly
    assert spec["ttlSecondsAfterFinished"] > 0
    assert spec["activeDeadlineSeconds"] > 0
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod  # no RBAC: the check reads and writes files only
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    text = repr(job)
    assert "secret" not in text.lower(), "the check needs no Secret"
    host_paths = {v["name"] for v in pod["volumes"] if "hostPath" in v}
    for c in [*pod["initContainers"], *pod["containers"]]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert not sc.get("privileged")
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert set(sc["capabilities"].get("add", [])) <= {"CHOWN", "FOWNER"}, c["name"]
        res = c["resources"]
        assert {k: res["requests"][k] for k in ("cpu", "memory")} == {
            k: res["limits"][k] for k in ("cpu", "memory")
        }, c["name"]
        for m in c.get("volumeMounts", []):
            if m["name"] in host_paths:
                assert m.get("readOnly") is True, m
    (netpol,) = of_kind(docs, "NetworkPolicy")
    labels = spec["template"]["metadata"]["labels"]
    selector = netpol["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert netpol["spec"]["policyTypes"] == ["Ingress"]
    # ingress only from the check pod itself (vLLM's workers and the training engine in one pod)
    assert netpol["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]


def test_reuses_what_the_rayjobs_do(docs: list[dict[str, Any]]) -> None:
    """Same volumes (the same claims, byte for byte), image, NPU resource name, node selector,
    toleration, Ascend host mounts and security context as the RayJobs' trainer workers, and
    the head's prepare-dump step, so that one dump volume serves both and the bundle reader
    (uid 10001, gid 1000) and postprocess Jobs can use /dump/bundles after a check."""
    rayjob_docs = render("file:hybrid")[1]
    assert of_kind(docs, "PersistentVolumeClaim") == of_kind(rayjob_docs, "PersistentVolumeClaim")
    (rayjob,) = of_kind(rayjob_docs, "RayJob")
    cluster = rayjob["spec"]["rayClusterSpec"]
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    job, _, container = parts(docs)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == worker["nodeSelector"]
    assert pod["tolerations"] == worker["tolerations"]
    (w,) = worker["containers"]
    assert container["image"] == w["image"]
    assert container["securityContext"] == w["securityContext"]
    assert pod["initContainers"] == head["initContainers"]
    assert NPU in container["resources"]["limits"]
    assert NPU in w["resources"]["limits"]
    by_name = {v["name"]: v for v in worker["volumes"]}
    for v in pod["volumes"]:
        if v["name"] != "shm":
            assert v == by_name[v["name"]]
    mounts = {m["name"]: m for m in w["volumeMounts"]}
    for m in container["volumeMounts"]:
        assert m == mounts[m["name"]]
    assert {m["name"] for m in container["volumeMounts"]} == set(mounts)


def test_the_rayjob_sources_do_not_include_the_check() -> None:
    """conftest's RayJob sources leave the check's and the shared bases out (they hold no RayJob)."""
    from tests.k8s.conftest import SOURCES

    assert not [s for s in SOURCES if s.endswith(("base/check", "base/volumes", "base/common"))]
    assert CHECK_FILE not in FILES.values()
