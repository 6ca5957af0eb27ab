"""The report renders in a real headless Chromium and shows the key numbers (Debian `chromium`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from bench.support import realdumps
from verl_consistency.postprocess.compare.msprobe_compare import compare_pairs
from verl_consistency.postprocess.output.report import heatmap_svg, layer_plot_svg, write_report
from verl_consistency.postprocess.pairing.pair_types import Unpaired, UnpairedReason

pytestmark = [pytest.mark.msprobe, pytest.mark.browser]

SCREENSHOT = realdumps.REPO / "out" / "report-screenshot.png"
"""Kept for the README (``out/`` is git-ignored); the lead commits a copy."""

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list, list]:
    runs = realdumps.build_runs(tmp_path_factory.getbasetemp() / "realdumps")
    out = tmp_path_factory.mktemp("report")
    pairs = realdumps.known_pairs(runs.stats) + realdumps.known_pairs(runs.tensor)
    comps = compare_pairs(runs.stats.run_dir, pairs[:2], out, jobs=2)
    comps += compare_pairs(runs.tensor.run_dir, pairs[2:], out, jobs=1)
    unpaired = [
        Unpaired(subject="rollout_step", ref="rollout/1/step1/rank0", reason=UnpairedReason.DECODE_ONLY),
        Unpaired(
            subject="rollout_step", ref="rollout/1/step2/rank0", reason=UnpairedReason.MULTI_REQUEST_STEP
        ),
        Unpaired(subject="request", ref=realdumps.R7, reason=UnpairedReason.NO_ROLLOUT_PREFILL, detail="x<y"),
    ]
    html, _ = write_report(out, run_id="e2e-run", pairs=pairs, unpaired=unpaired, comparisons=comps)
    return html, comps, unpaired


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("Debian's chromium is not installed (CI installs it from .ci/apt/report.txt)")
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return subprocess.run(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def test_report_is_self_contained(report) -> None:
    html, _, _ = report
    text = html.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), "external asset in report.html"
    assert "<link" not in text
    assert "<script" not in text
    assert "x&lt;y" in text, "unpaired details must be HTML-escaped"
    md = html.with_name("summary.md").read_text()
    assert "| `no_rollout_prefill` | 1 |" in md
    assert "| `decode_only` | 1 |" in md


def test_report_renders_in_chromium_with_the_key_numbers(report) -> None:
    html, comps, unpaired = report
    dom = _chromium("--dump-dom", html.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    assert 'id="run-id">e2e-run<' in page
    assert f'id="n-pairs">{len(comps)}<' in page
    assert f'id="n-unpaired">{len(unpaired)}<' in page
    assert f'id="n-diverged">{len(comps)}<' in page
    assert f'id="common-first">{realdumps.CHANGED_MODULE}<' in page
    assert page.count(f'class="mono first-divergence">{realdumps.CHANGED_MODULE}<') == len(comps)
    assert "How to read this" in page
    assert page.count("<svg") == len(comps) + 1  # one plot per pair + the heatmap
    tensor = next(c for c in comps if c.task == "tensor")
    assert f"{tensor.min_cosine:.6f}" in page
    for c in comps:
        assert f"{c.max_rel_err:.4f}".rstrip("0") in page

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shot = _chromium("--window-size=1200,2200", f"--screenshot={SCREENSHOT}", html.as_uri())
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert SCREENSHOT.stat().st_size > 20_000  # a blank page is a few kB


def test_charts_follow_the_data(report) -> None:
    _, comps, _ = report
    c = comps[0]
    svg = layer_plot_svg(c)
    assert svg.count("<circle") == len([p for p in c.layer_profile if p.rel_err is not None])
    assert "#dc2626" in svg  # the diverged layer is drawn red
    heat = heatmap_svg(comps)
    assert heat.count("<rect") == len(comps) * len({p.label for x in comps for p in x.layer_profile})
    assert "<svg" not in heatmap_svg([c.model_copy(update={"status": "failed"})])
