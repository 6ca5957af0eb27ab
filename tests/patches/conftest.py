"""Fixtures shared by the verl patch tests of one pytest session (both pin sets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.verl_support import patched_verl, run_patched

DRIVER = Path(__file__).with_name("test_verl_request_id_driver.py")


@pytest.fixture(scope="session")
def verl_driver_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of ``test_verl_request_id_driver.py`` on the set in force's patched verl.

    It starts a local Ray (and, on verl 0.9, a TransferQueue), so the request-id, capture and
    token-record tests share one run instead of starting Ray each.
    """
    root = patched_verl(tmp_path_factory.getbasetemp())
    out = run_patched(
        root, f"import runpy; runpy.run_path({str(DRIVER)!r}, run_name='__main__')", timeout=280
    )
    line = next(x for x in out.splitlines() if x.startswith("VC_REPORT "))
    return json.loads(line.removeprefix("VC_REPORT "))
