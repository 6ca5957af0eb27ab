"""Shared helpers for the verl patch tests (no tests here).

The tests never patch the installed verl: they unpack the pinned verl wheel (downloaded into the
cache on first use), apply ``patches/verl/series`` with the real applier, and run the patched
code in a subprocess whose ``sys.path`` starts with that tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from verl_consistency.patches import apply, upstream

REPO = Path(__file__).resolve().parents[2]


def patched_verl(base: Path) -> Path:
    """A fresh, patched copy of the pinned verl under ``base`` (made once per pytest session)."""
    root = base / "verl-patched"
    done = root / ".vc-patched"
    if not done.exists():
        wheel = upstream.fetch_wheel("verl")
        upstream.unpack(wheel, root)
        apply.apply_series("verl", root)
        done.write_text("ok\n")
    return root


def run_patched(root: Path, script: str, *, env: dict[str, str] | None = None, timeout: int = 240) -> str:
    """Run ``script`` with the patched verl first on ``sys.path``; return stdout, fail loudly."""
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DUMP_", "PROMPTS_", "VERL_CONSISTENCY_"))
    }
    full_env.update(
        PYTHONPATH=os.pathsep.join([str(root), str(REPO)]),
        CUDA_VISIBLE_DEVICES="",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
    )
    full_env.update(env or {})
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )
    if res.returncode != 0:
        raise AssertionError(
            f"patched-verl subprocess failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
        )
    return res.stdout
