"""Fixtures of the patch tests that read the pin set's real upstream sources or run its patched verl.

Each reads the distribution of the set in force (``VERL_CONSISTENCY_PIN_SET``), so one test runs
against vLLM 0.18.0 / vllm-ascend 0.18.0 / verl 0.8.0 on the current set and vLLM 0.23.0 /
vllm-ascend 0.23.0.post1 / verl 0.9.1 on the next one.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest

from bench.support.verl_support import patched_verl, run_patched
from tests.patches.test_vllm_patch import read_member
from verl_consistency.patches.tooling import upstream


def _extract_atomically(wheel: Path, dest: Path, prefix: str) -> Path:
    if dest.is_dir():
        return dest
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith(prefix) and name.endswith(".py"):
                zf.extract(name, tmp)
    with contextlib.suppress(OSError):  # another run won the race; its copy is identical
        os.replace(tmp, dest)
    return dest


@pytest.fixture(scope="session")
def vllm_src() -> Path:
    """The set's vLLM wheel's Python sources (no compiled parts: the scheduler dataclasses need none)."""
    wheel = upstream.fetch_wheel("vllm")
    return _extract_atomically(wheel, wheel.parent / "py-src", "vllm/")


@pytest.fixture(scope="session")
def attn_states() -> list[str]:
    """``AscendAttentionState``'s member names, read from the set's vllm-ascend source (wheel or sdist).

    Importing it needs torch_npu, so the names are read with ``ast``.
    """
    dist = upstream.fetch_wheel("vllm-ascend")
    src = read_member(dist, "vllm_ascend/attention/attention_v1.py").decode()
    for node in ast.parse(src).body:
        if isinstance(node, ast.ClassDef) and node.name == "AscendAttentionState":
            return [
                t.id
                for stmt in node.body
                if isinstance(stmt, ast.Assign)
                for t in stmt.targets
                if isinstance(t, ast.Name)
            ]
    raise AssertionError("AscendAttentionState not found in the pinned vllm-ascend")


DRIVER = Path(__file__).with_name("request_id_driver.py")


@pytest.fixture(scope="session")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The set in force's verl, unpacked from its pinned wheel and patched (once per session)."""
    return patched_verl(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def verl_driver_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of ``request_id_driver.py`` on the set in force's patched verl.

    It starts a local Ray (and, on verl 0.9, a TransferQueue), so the request-id, capture and
    token-record tests share one run instead of starting Ray each.
    """
    root = patched_verl(tmp_path_factory.getbasetemp())
    out = run_patched(
        root, f"import runpy; runpy.run_path({str(DRIVER)!r}, run_name='__main__')", timeout=280
    )
    line = next(x for x in out.splitlines() if x.startswith("VC_REPORT "))
    return json.loads(line.removeprefix("VC_REPORT "))
