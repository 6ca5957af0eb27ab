"""``make image-cuda`` for real: docker/Dockerfile on the STAND-IN NVIDIA base, FLAVOUR=cuda.

The stand-in carries exactly the name ``vllm/vllm-openai:v0.18.0`` (pins ``image.base.cuda``) and
vLLM 0.18.0's Python sources as the distribution ``vllm`` (``docker/standin/install_as.py``); the
build is the one ``make image-cuda`` runs (``FLAVOUR=cuda``, ``WITH_MINDSPEED=0``), with buildah.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from verl_consistency.contracts import pins
from verl_consistency.patches.tooling import apply

from . import conftest
from .conftest import REPO, buildah_bud, discard_images, image_size, labels, podman_run, require_tools

pytestmark = pytest.mark.image
IMAGE = "localhost/verl-consistency:pytest-cuda"


@pytest.fixture(scope="module")
def cuda_image() -> Iterator[str]:
    require_tools()
    base = pins.load().image.base.cuda
    start = time.monotonic()
    res = subprocess.run(
        [
            sys.executable,
            str(REPO / "docker/standin/build_standin.py"),
            "--flavour",
            "cuda",
            "--tag",
            base,
            "--cache",
            str(conftest.cache_dir()),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, f"stand-in build failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    standin = time.monotonic() - start
    start = time.monotonic()
    res = buildah_bud(REPO, IMAGE, "--build-arg", f"BASE_IMAGE={base}", "--build-arg", "FLAVOUR=cuda")
    seconds = time.monotonic() - start
    assert res.returncode == 0, f"image build failed:\n{res.stdout[-6000:]}\n{res.stderr[-3000:]}"
    conftest._METRICS.append(
        f"image-cuda: stand-in base {standin:.0f} s, build {seconds:.0f} s, image "
        f"{image_size(IMAGE) / 1e9:.2f} GB = base {image_size(base) / 1e9:.2f} GB + the bundle's layers"
    )
    yield IMAGE
    discard_images(IMAGE, base)


def sh(image: str, script: str) -> subprocess.CompletedProcess[str]:
    return podman_run(image, "-c", script, entrypoint="/bin/sh")


def test_patch_step_follows_the_cuda_flavour(cuda_image: str) -> None:
    res = sh(
        cuda_image,
        "H=/opt/verl-consistency; cat $H/patched-components.txt; echo ---; cat $H/patched-roots.env; "
        '. $H/patched-roots.env && verl-consistency patches verify -c verl --root "$VERL_ROOT"',
    )
    assert res.returncode == 0, res.stdout + res.stderr
    components, _, env = res.stdout.partition("---")
    names = [line.split()[0] for line in components.strip().splitlines()]
    assert names == (["verl", "vllm"] if "vllm" in apply.COMPONENTS else ["verl"])
    assert "VLLM_ASCEND_ROOT" not in env
    assert "verl: " in res.stdout


def test_vllm_from_the_base_is_checked_and_kept(cuda_image: str) -> None:
    probe = (
        "python3 -c \"import importlib.metadata as m; print(m.version('vllm'), m.version('verl'), "
        "m.version('megatron-core'), m.version('mindstudio-probe'))\"; "
        "python3 -c \"import importlib.util as u; print(u.find_spec('vllm_ascend'))\""
    )
    res = sh(cuda_image, probe)
    assert res.returncode == 0, res.stdout + res.stderr
    p = pins.load()
    versions, ascend = res.stdout.strip().splitlines()
    assert versions.split() == [
        p.upstream.vllm,
        p.upstream.verl,
        p.install.megatron_core,
        p.upstream.mindstudio_probe,
    ]
    assert ascend == "None"


def test_labels_and_device_cuda_dry_run(cuda_image: str) -> None:
    lab = labels(cuda_image)
    assert lab["io.github.verl-consistency.flavour"] == "cuda"
    assert lab["io.github.verl-consistency.with-mindspeed"] == "0"
    assert lab["org.opencontainers.image.base.name"] == pins.load().image.base.cuda
    res = podman_run(cuda_image, "run", "hybrid", "--device", "cuda", "--dry-run", "model=/models/m")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "trainer.device=cuda" in res.stdout


def test_standin_sits_where_the_real_base_name_resolves(cuda_image: str) -> None:
    """``FROM vllm/vllm-openai:v0.18.0`` means Docker Hub: the stand-in is stored as docker.io/..."""
    name = f"docker.io/{pins.load().image.base.cuda}"
    cmd = ["podman", "image", "inspect", name, "--format", "{{json .Labels}}"]
    res = subprocess.run(cmd, capture_output=True, check=False)
    assert res.returncode == 0, res.stderr
    assert b'"io.github.verl-consistency.standin":"base"' in res.stdout
