"""``bench/bench_lane_host.py`` runs as its docstring says, both ways of writing the lanes' files.

Only that it runs and says what it measured: speed is measured in ``bench/``, not asserted here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.msprobe]


@pytest.mark.parametrize("inline", [False, True], ids=["helper", "inline"])
def test_the_lane_host_bench_runs_and_says_how_the_files_were_written(repo: Path, inline: bool) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "bench.bench_lane_host", "--lanes", "3", "--reps", "2"]
        + (["--inline-write"] if inline else []),
        cwd=repo,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert "292 module calls a step" in out
    if inline:
        assert "lane files written in this process (--inline-write)" in out
        assert "ratio lane-host dumped/off-after:" in out
    else:
        assert "lane files written by the lane writer's helper" in out
        assert "ratio lane-host dumped+wait/off-after:" in out
        assert "dumped+wait wall" in out
    assert "msprobe's per-lane path: none (every tensor took the one pass)" in out
