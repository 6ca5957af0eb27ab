"""The model loader Job (k8s/model-loader-job.yaml, from k8s/base/model-loader): the one writer of
the model volume, locked down, and its script loading for real.

The Job's own shell script (its container's command and args, unchanged but for /models, which
points at a temporary folder) runs here with the real `verl-consistency load`, against a loopback
HTTP server and a folder standing for a mounted PVC: a model archive, a dataset folder and a reward
file land, a rerun changes nothing, and bad input ends with the exit code that the Job's
podFailurePolicy turns into an immediate failure.
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import zstandard

from tests.fixtures.http_files import serve
from tests.k8s.conftest import (
    CHECK_FILE,
    FILES,
    K8S,
    LOADER_FILE,
    SOURCES,
    kustomize,
    of_kind,
    render,
)
from tests.k8s.test_manifests import KUBE_VERSION
from verl_consistency.entrypoints.load.command import EXIT_BAD_INPUT

MODELS_CLAIM = "verl-consistency-models"
LOADER = ["file:model-loader", "kustomize:base/model-loader"]


def loader_docs(source: str) -> list[dict[str, Any]]:
    if source == "file:model-loader":
        import yaml

        return [d for d in yaml.safe_load_all(LOADER_FILE.read_text()) if d]
    return render(source)[1]


def from_pvc_docs(tmp_path: Path) -> list[dict[str, Any]]:
    """The loader with the from-pvc component, composed by an overlay of a user's own."""
    import yaml

    rel = Path(os.path.relpath(K8S, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [str(rel / "base" / "model-loader")],
                "components": [str(rel / "base" / "model-loader" / "from-pvc")],
            }
        )
    )
    res = kustomize(tmp_path)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def parts(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    (job,) = of_kind(docs, "Job")
    (cm,) = of_kind(docs, "ConfigMap")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return job, cm["data"], container


@pytest.mark.parametrize("source", LOADER)
def test_renders_the_loader_and_the_runs_volumes(source: str) -> None:
    docs = loader_docs(source)
    assert sorted(d["kind"] for d in docs) == sorted(
        ["ConfigMap", "NetworkPolicy", "Job", "PersistentVolumeClaim", "PersistentVolumeClaim"]
    )
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    # the same claims as the runs and the check, byte for byte: any of them may be applied first
    runs = render("file:hybrid")[1]
    assert of_kind(docs, "PersistentVolumeClaim") == of_kind(runs, "PersistentVolumeClaim")


def test_locked_down() -> None:
    docs = loader_docs("file:model-loader")
    job, settings, container = parts(docs)
    spec = job["spec"]
    # bad input (exit 2) fails at once; anything else (a broken download) is retried
    assert spec["podFailurePolicy"]["rules"] == [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": container["name"], "operator": "In", "values": [EXIT_BAD_INPUT]},
        }
    ]
    assert spec["backoffLimit"] > 0
    assert spec["activeDeadlineSeconds"] > 0
    assert spec["ttlSecondsAfterFinished"] > 0
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert not [v for v in pod["volumes"] if "hostPath" in v]
    assert "secret" not in repr(job).lower()
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] != 0
    assert sc["readOnlyRootFilesystem"] is True
    (init,) = pod["initContainers"]
    for c in (init, container):
        csc = c["securityContext"]
        assert csc["allowPrivilegeEscalation"] is False
        assert csc["capabilities"]["drop"] == ["ALL"]
        assert csc["readOnlyRootFilesystem"] is True
        res = c["resources"]
        assert res["requests"] == res["limits"], c["name"]
    assert "add" not in sc["capabilities"]
    assert set(init["securityContext"]["capabilities"]["add"]) == {"CHOWN", "FOWNER"}
    # what prepare-models hands over is what the loader runs as
    assert f"chgrp {sc['runAsGroup']} /models" in init["command"][-1]
    (netpol,) = of_kind(docs, "NetworkPolicy")
    selector = netpol["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    assert netpol["spec"]["policyTypes"] == ["Ingress"]
    assert "ingress" not in netpol["spec"]
    assert settings["DEST"].startswith("/models/")


def _pod_specs(node: Any) -> list[dict[str, Any]]:
    """Every pod spec in a manifest, wherever it sits (RayJob groups, submitter, Job templates)."""
    if isinstance(node, list):
        return [p for item in node for p in _pod_specs(item)]
    if not isinstance(node, dict):
        return []
    found = [node] if "containers" in node else []
    return found + [p for v in node.values() for p in _pod_specs(v)]


def _model_volume_writers(docs: list[dict[str, Any]]) -> list[str]:
    writers = []
    for doc in docs:
        for pod in _pod_specs(doc):
            models = {
                v["name"]: v["persistentVolumeClaim"].get("readOnly") is True
                for v in pod.get("volumes", [])
                if v.get("persistentVolumeClaim", {}).get("claimName") == MODELS_CLAIM
            }
            for c in [*pod.get("initContainers", []), *pod["containers"]]:
                for m in c.get("volumeMounts", []):
                    if m["name"] in models and not (models[m["name"]] and m.get("readOnly") is True):
                        writers.append(f"{doc['kind']}/{doc['metadata']['name']}:{c['name']}")
    return writers


def test_the_loader_is_the_only_writer_of_the_model_volume(tmp_path: Path) -> None:
    import yaml

    everything = [*SOURCES, *FILES, "file:check"]
    for source in everything:
        docs = render(source)[1] if source != "file:check" else yaml.safe_load_all(CHECK_FILE.read_text())
        assert _model_volume_writers([d for d in docs if d]) == [], source
    for name in ("bundle-reader.yaml", "prompts-writer.yaml"):
        docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
        assert _model_volume_writers(docs) == [], name
    assert _model_volume_writers(loader_docs("file:model-loader")) == [
        "Job/verl-consistency-model-loader:prepare-models",
        "Job/verl-consistency-model-loader:load",
    ]
    assert _model_volume_writers(from_pvc_docs(tmp_path)) == _model_volume_writers(
        loader_docs("file:model-loader")
    )


def test_from_pvc_mounts_the_source_read_only(tmp_path: Path) -> None:
    docs = from_pvc_docs(tmp_path)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    job, _, container = parts(docs)
    (source,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "source"]
    assert source["persistentVolumeClaim"]["readOnly"] is True
    assert {"name": "source", "mountPath": "/source", "readOnly": True} in container["volumeMounts"]


def _model_archive() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        files = {"Qwen-tiny/config.json": b"{}", "Qwen-tiny/model.safetensors": b"w" * 4096}
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return zstandard.ZstdCompressor().compress(buf.getvalue())


def run_job_script(container: dict[str, Any], settings: dict[str, str], models: Path, bin_dir: Path):
    """The container's command and args as the kubelet starts them, /models pointed at `models`."""
    argv = [a.replace("/models", str(models)) for a in [*container["command"], *container["args"]]]
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **settings}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_the_jobs_script_loads_model_dataset_and_reward(tmp_path: Path) -> None:
    _, settings, container = parts(loader_docs("file:model-loader"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "verl-consistency"
    exe.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m verl_consistency.entrypoints "$@"\n')
    exe.chmod(0o755)
    models = tmp_path / "models"
    models.mkdir()
    dataset = tmp_path / "source" / "my-set"  # a folder on a mounted PVC (from-pvc: /source)
    dataset.mkdir(parents=True)
    (dataset / "train.parquet").write_bytes(b"PAR1 train")
    (dataset / "val.parquet").write_bytes(b"PAR1 val")
    with serve() as (url, routes):
        routes["/Qwen-tiny.tar.zst"] = (200, _model_archive())
        routes["/my_reward.py"] = (200, b"def compute_score(*args, **kwargs):\n    return 1.0\n")
        settings = {
            **settings,
            "SOURCE": f"{url}/Qwen-tiny.tar.zst",
            "DEST": "/models/Qwen-tiny",
            "DATA_SOURCE": str(dataset),
            "DATA_DEST": "/models/data/my-set",
            "REWARD_SOURCE": f"{url}/my_reward.py",
            "REWARD_DEST": "/models/reward/my_reward.py",
        }
        settings = {k: v.replace("/models", str(models)) for k, v in settings.items()}
        res = run_job_script(container, settings, models, bin_dir)
        assert res.returncode == 0, res.stderr
        assert (models / "Qwen-tiny" / "model.safetensors").read_bytes() == b"w" * 4096
        assert (models / "data" / "my-set" / "val.parquet").read_bytes() == b"PAR1 val"
        assert (models / "reward" / "my_reward.py").read_text().startswith("def compute_score")
        # a retried or re-applied Job changes nothing
        routes.clear()
        again = run_job_script(container, settings, models, bin_dir)
        assert again.returncode == 0, again.stderr
        assert again.stderr.count("already loaded") == 3
        # only the model: empty pairs are skipped
        only = {**settings, "DATA_SOURCE": "", "DATA_DEST": "", "REWARD_SOURCE": "", "REWARD_DEST": ""}
        assert run_job_script(container, only, models, bin_dir).returncode == 0
        # bad input stops the script with the exit code the podFailurePolicy fails at once
        bad = {**settings, "REWARD_SOURCE": f"{url}/gone.py", "REWARD_DEST": f"{models}/reward/gone.py"}
        res = run_job_script(container, bad, models, bin_dir)
        assert res.returncode == EXIT_BAD_INPUT
        assert f"SOURCE {url}/gone.py: the server answered HTTP 404" in " ".join(res.stderr.split())
        assert not (models / "reward" / "gone.py").exists()
        # a DEST outside the volume is refused by --root
        out = {**settings, "DEST": str(tmp_path / "elsewhere")}
        res = run_job_script(container, out, models, bin_dir)
        assert res.returncode == EXIT_BAD_INPUT
        assert "must be a path inside" in res.stderr


def test_the_readmes_from_pvc_overlay_builds(tmp_path: Path) -> None:
    """k8s/README.md's my-loader/kustomization.yaml, with its ../k8s paths pointed at this checkout."""
    import yaml

    text = (K8S / "README.md").read_text()
    start = text.index("```yaml\n# my-loader/kustomization.yaml")
    block = text[start + len("```yaml\n") : text.index("```", start + 3)]
    rel = os.path.relpath(K8S, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(block.replace("../k8s", rel))
    res = kustomize(tmp_path)
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    job, settings, _ = parts(docs)
    (source,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "source"]
    assert source["persistentVolumeClaim"] == {"claimName": "team-models", "readOnly": True}
    assert settings["SOURCE"] == "/source/Qwen2.5-0.5B-Instruct"
