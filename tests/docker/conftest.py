"""Session fixtures: the stand-in base and the real docker/Dockerfile, each built ONCE per run.

Both builds are real ``buildah bud`` builds (chroot isolation, host network, ``--pull=never``),
so ``docker/Dockerfile``'s ``FROM`` resolves to the local STAND-IN that carries the real base's
name (see ``docker/standin/``). The pip cache is buildah's cache mount: a warm machine reuses it,
a fresh CI machine downloads everything once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from verl_consistency.contracts import env, pins

from ..conftest import lean_disk

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "docker/standin"))
sys.path.insert(0, str(REPO / "docker/helpers"))
import build_standin  # noqa: E402  (a script folder, not a package)
import image_build  # noqa: E402  (a script folder, not a package)

# One image per pin set: `make test-next` builds the next set's beside the current one.
IMAGE = f"localhost/verl-consistency:pytest-{pins.selected()}"
RUN_FLAGS = [
    "--runtime",
    "runc",
    "--network",
    "host",
    "--ulimit",
    "nofile=20000:20000",
    "--ulimit",
    "nproc=32768:32768",
]


def cache_dir() -> Path:
    return Path(os.environ.get(env.CACHE) or REPO / ".cache")


def require_tools() -> None:
    missing = [t for t in ("buildah", "podman", "runc") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: apt-get install $(cat .ci/apt/docker.txt)")


def buildah_bud(context: Path, tag: str, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = build_standin.buildah_bud(
        *("--ignorefile", str(context / "docker/Dockerfile.dockerignore")),
        # The git host of MindSpeed cannot be reached from CI; the pip step for it is skipped.
        *("--build-arg", "WITH_MINDSPEED=0"),
        # what `make image PINS=<set>` passes: the set in force's name, base and versions
        *(a for k, v in image_build.build_args().items() for a in ("--build-arg", f"{k}={v}")),
        *extra,
    )
    cmd += ["-f", str(context / "docker/Dockerfile"), "-t", tag, str(context)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def image_size(ref: str) -> int:
    out = subprocess.run(
        ["podman", "image", "inspect", ref, "--format", "{{.Size}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def discard_images(*refs: str) -> None:
    """Under ``$VERL_CONSISTENCY_LEAN_DISK`` (CI), remove images the tests are done with, and the
    layers only they used: each pin set's images and stand-in bases are 3-6 GB."""
    if not lean_disk():
        return
    subprocess.run(["buildah", "rmi", "-f", *refs], capture_output=True, check=False)
    subprocess.run(["buildah", "rmi", "--prune"], capture_output=True, check=False)


@dataclass(frozen=True)
class BuiltImage:
    ref: str
    base: str
    build_seconds: float
    size: int
    base_size: int


def vcs_ref_arg() -> tuple[str, str]:
    """``--build-arg VCS_REF=<HEAD>``, as ``make image`` passes it. Every build of a session passes
    the same one: an ARG declared above a RUN is in that RUN's cache key, so a build with another
    VCS_REF would redo the pip layers instead of reusing the image build's."""
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return "--build-arg", f"VCS_REF={git.stdout.strip() or 'unknown'}"


@pytest.fixture(scope="session")
def standin_base() -> Iterator[str]:
    require_tools()
    tag = pins.load().image.base.a2
    script = str(REPO / "docker/standin/build_standin.py")
    res = subprocess.run(
        [sys.executable, script, "--tag", tag, "--cache", str(cache_dir())],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, f"stand-in base build failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    yield tag
    discard_images(tag)


@pytest.fixture(scope="session")
def built_image(standin_base: str) -> Iterator[BuiltImage]:
    start = time.monotonic()
    res = buildah_bud(REPO, IMAGE, *vcs_ref_arg())
    seconds = time.monotonic() - start
    assert res.returncode == 0, f"image build failed:\n{res.stdout[-6000:]}\n{res.stderr[-3000:]}"
    built = BuiltImage(IMAGE, standin_base, seconds, image_size(IMAGE), image_size(standin_base))
    _METRICS.append(
        f"docker/Dockerfile on the stand-in base: build {seconds:.0f} s (layer and pip caches as found), "
        f"image {built.size / 1e9:.2f} GB = base {built.base_size / 1e9:.2f} GB "
        f"+ {(built.size - built.base_size) / 1e9:.2f} GB"
    )
    yield built
    discard_images(IMAGE)


_METRICS: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the build time and the size on top of the base (measured, never asserted)."""
    for line in _METRICS:
        terminalreporter.write_line(f"[image] {line}")


def podman_run(
    image: str,
    *args: str,
    volumes: dict[Path, str] | None = None,
    entrypoint: str | None = None,
    timeout: int = 600,
) -> subprocess.CompletedProcess[str]:
    cmd = ["podman", "run", "--rm", *RUN_FLAGS]
    for host, ctr in (volumes or {}).items():
        cmd += ["-v", f"{host}:{ctr}"]
    if entrypoint is not None:
        cmd += ["--entrypoint", entrypoint]
    return subprocess.run([*cmd, image, *args], capture_output=True, text=True, timeout=timeout, check=False)


def labels(image: str) -> dict[str, str]:
    out = subprocess.run(
        ["podman", "image", "inspect", image, "--format", "{{json .Labels}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    data: dict[str, str] = json.loads(out.stdout)
    return data
