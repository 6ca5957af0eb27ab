"""``.ci/lanes.py``: lanes side by side, every log printed, the first failure's exit, the totals line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LANES = Path(__file__).resolve().parents[1] / ".ci" / "lanes.py"

XML = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_ok" time="1.5"/>
<testcase classname="tests.test_a" name="test_slow" time="9.0"/>
<testcase classname="tests.test_a" name="test_bad" time="0.1"><failure message="x"/></testcase>
<testcase classname="tests.test_a" name="test_skip" time="0.0"><skipped message="y"/></testcase>
</testsuite></testsuites>"""


def lanes(tmp_path: Path, *specs: str, serial: bool = False) -> subprocess.CompletedProcess[str]:
    args = [
        sys.executable,
        str(LANES),
        "--dir",
        str(tmp_path / "lanes"),
        *(["--serial"] if serial else []),
        *specs,
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def test_every_lane_runs_and_the_first_failure_is_the_exit(tmp_path):
    res = lanes(tmp_path, "a=echo from-a", "b=echo from-b; exit 3", "c=sleep 0.2; echo from-c")
    assert res.returncode == 3
    for word in ("from-a", "from-b", "from-c"):
        assert word in res.stdout
    assert "total: 0 passed, 0 failed, 0 skipped" in res.stdout


def test_the_totals_and_the_slowest_come_from_every_junit_xml(tmp_path):
    folder = tmp_path / "lanes"
    write = f"cat > {folder}/one.xml <<'X'\n{XML}\nX"
    res = lanes(tmp_path, f"a={write}", "b=true", serial=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "total: 2 passed, 1 failed, 1 skipped" in res.stdout.splitlines()
    slow = res.stdout[res.stdout.index("slowest") :]
    assert slow.index("test_slow") < slow.index("test_ok")
