"""A check run's batch variance, end to end through the CLI, on REAL msprobe dumps.

``tests/fixtures/checkdumps.py`` makes the run folder ``verl-consistency check`` leaves: vLLM's
batched pass and alone pass of four prompts (per-request lanes cut out of packed steps by the
dispatch hook's own code), the training engine's pass under the alone ids (FSDP1), and
``check.json``. The batched pass of prompt 2 scales one module's output (a vLLM-only batch
effect); prompt 3's batched request was chunked. ``verl-consistency postprocess`` then has to
show: identical computation -> batch variance healthy; the batch effect -> batch variance
diverged at that module and the engine gap untouched; the chunk -> the pairing's reason; an
ordinary run (no ``check.json``) -> the bundle it made before; a torn ``check.json`` -> exit 3.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bench.support.realdumps import generate_once
from tests.fixtures import checkdumps
from tests.fixtures.subprocess_run import bundle_through_cli
from verl_consistency.entrypoints.cli import app
from verl_consistency.postprocess.pipeline import Exit

pytestmark = pytest.mark.msprobe

CHECK_ADDITIONS = ("check_manifest", "batch_variance")
ORDINARY_KEYS = [
    "manifest_version",
    "tool",
    "tool_version",
    "run_id",
    "created",
    "source",
    "run_manifest",
    "pairing",
    "pairs",
    "unpaired",
    "results_dir",
    "comparisons",
    "warnings",
    "files",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("check-dumps")
    generate_once("tests.fixtures.checkdumps", root)
    return root / checkdumps.RUN


def _bundle(run: Path, out: Path) -> dict[str, Any]:
    done = bundle_through_cli(run, out)
    return {"raw": done.manifest(), "x": done.extracted, "stderr": done.stderr}


@pytest.fixture(scope="module")
def check(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = _bundle(run_dir, tmp_path_factory.mktemp("check-bundle"))
    out["summary"] = json.loads((out["x"] / "results" / "check.json").read_text())
    out["by_index"] = {v["index"]: v for v in out["raw"]["batch_variance"]}
    out["requests"] = {r["index"]: r for r in out["summary"]["requests"]}
    return out


@pytest.fixture(scope="module")
def ordinary(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same run folder without check.json: an ordinary collection run."""
    tmp = tmp_path_factory.mktemp("ordinary")
    copy = tmp / checkdumps.RUN
    shutil.copytree(run_dir, copy)
    (copy / "check.json").unlink()
    return _bundle(copy, tmp)


def test_identical_computation_gives_a_healthy_batch_variance(check: dict[str, Any]) -> None:
    for k in (0, 1):
        v = check["by_index"][k]
        assert v["batched_request_id"] == checkdumps.batched_id(k)
        assert v["alone_request_id"] == checkdumps.alone_id(k)
        assert v["verdict"] == "healthy", v
        assert v["first_divergence"] is None
        # the same fp32 maths on CPU: the lane of a packed step is the prompt computed alone
        assert v["max_rel_err"] is not None
        assert v["max_rel_err"] <= 1e-6
        assert v["comparison"]["rows_matched"] > 60, "msprobe's plain compare matched vLLM to vLLM"
        assert v["comparison"]["backend"] == "vllm"
        # the two dumps are the batched lane and the alone lane of the same prompt
        assert v["batched"]["dir"].endswith("/req" + str(k))
        assert v["alone"]["dir"].endswith("/req0")
        assert v["batched"]["step"] == 0
        assert v["alone"]["step"] == 3 + k


def test_engine_gap_is_healthy_for_every_prompt(check: dict[str, Any]) -> None:
    for k in range(4):
        gap = check["requests"][k]["engine_gap"]
        assert gap["verdict"] == "healthy", gap
        assert gap["first_divergence"] is None
        assert gap["max_rel_err"] < 1e-5
        assert gap["id"].startswith(checkdumps.alone_id(k))
    assert {p["request_id"] for p in check["raw"]["pairs"]} == {checkdumps.alone_id(k) for k in range(4)}


def test_a_batch_effect_at_one_module_shows_in_batch_variance_only(check: dict[str, Any]) -> None:
    v = check["by_index"][2]
    assert v["verdict"] == "diverged"
    assert v["first_divergence"] == checkdumps.BATCH_MODULE
    assert v["max_rel_err"] == pytest.approx(checkdumps.BATCH_EFFECT, abs=1e-3)
    req = check["requests"][2]
    assert req["batch_variance"]["first_divergence"] == checkdumps.BATCH_MODULE
    assert req["engine_gap"]["verdict"] == "healthy"
    modules = [m["module"] for m in check["summary"]["modules"]]
    row = check["summary"]["modules"][modules.index(checkdumps.BATCH_MODULE)]
    assert row["batch_variance_status"] == "diverged"
    assert row["batch_variance_index"] == 2
    assert row["batch_variance_rel_err"] == pytest.approx(checkdumps.BATCH_EFFECT, abs=1e-3)
    assert row["engine_gap_status"] == "ok"
    assert row["engine_gap_rel_err"] < 1e-5
    # upstream of it nothing moved: the module is where the batch effect enters
    for m in check["summary"]["modules"][: modules.index(checkdumps.BATCH_MODULE)]:
        assert m["batch_variance_status"] in ("ok", None), m


def test_a_chunked_batched_request_gets_the_pairings_reason(check: dict[str, Any]) -> None:
    v = check["by_index"][3]
    assert v["verdict"] == "not_compared"
    assert v["reason"] == "chunked_prefill"
    assert checkdumps.batched_id(3) in v["detail"]
    assert v["comparison"] is None
    assert v["batched"] is None
    assert check["requests"][3]["batch_variance"]["verdict"] == "not_compared"
    assert any("prompt 3 not compared: chunked_prefill" in w for w in check["raw"]["warnings"])


def test_the_bundle_carries_the_check_and_its_dumps(check: dict[str, Any]) -> None:
    raw, x = check["raw"], check["x"]
    files = {f["path"] for f in raw["files"]}
    assert raw["check_manifest"] == "check.json"
    assert "check.json" in files
    assert "results/check.json" in files
    for k in (0, 1, 2):
        v = check["by_index"][k]
        for f in ("compare_result.csv", "rows.csv", "comparison.json", "compare.log"):
            assert f"results/batch_variance/{v['id']}/{f}" in files
        # the batched lane belongs to no pair, and is bundled for the batch variance
        assert f"{v['batched']['dir']}/dump.json" in files
        assert v["comparison"]["rows_csv"] == f"batch_variance/{v['id']}/rows.csv"
    html = (x / "results" / "report.html").read_text()
    assert 'id="check"' in html
    assert "Engine gap and batch variance" in html
    assert html.count('class="check-request"') == 4
    assert 'data-module="model.layers.1.mlp.down_proj"' in html
    md = (x / "results" / "summary.md").read_text()
    assert "## Engine gap and batch variance" in md
    assert f"| 2 | `{checkdumps.alone_id(2)}` |" in md
    assert f"`{checkdumps.BATCH_MODULE}`" in md


def test_an_ordinary_run_keeps_its_bundle(check: dict[str, Any], ordinary: dict[str, Any]) -> None:
    """The same folder without check.json: the manifest has the keys it always had, and the
    bundle is the check run's minus what the check added."""
    raw = ordinary["raw"]
    assert list(raw) == ORDINARY_KEYS
    assert list(check["raw"]) == ORDINARY_KEYS + list(CHECK_ADDITIONS)
    files = {f["path"] for f in raw["files"]}
    added = {
        "check.json",
        "results/check.json",
        *(f for f in (f["path"] for f in check["raw"]["files"]) if f.startswith("results/batch_variance/")),
        *(
            f
            for v in check["raw"]["batch_variance"]
            if v["batched"]
            for f in (f["path"] for f in check["raw"]["files"])
            if f.startswith(v["batched"]["dir"] + "/")
        ),
    }
    check_files = {f["path"] for f in check["raw"]["files"]}
    differ = {"manifest.schema.json", "results/report.html", "results/summary.md"}  # the same names
    assert files == check_files - added
    assert not any(f.startswith("results/batch_variance") for f in files)
    for f in files - differ:
        a, b = ordinary["x"] / f, check["x"] / f
        if f.endswith(("comparison.json", "compare.log")):
            continue  # timings and msprobe's timestamps
        if f.endswith(".csv") or not f.startswith("results/"):
            assert a.read_bytes() == b.read_bytes(), f
    assert raw["pairs"] == check["raw"]["pairs"]
    assert [c["verdict"] for c in raw["comparisons"]] == [c["verdict"] for c in check["raw"]["comparisons"]]
    assert raw["warnings"] == []
    assert "Engine gap and batch variance" not in (ordinary["x"] / "results" / "report.html").read_text()


@pytest.mark.parametrize("text", ['{"kind": "check", "model": "m"', '{"kind": "check"}', "[]"])
def test_a_torn_check_json_exits_3_naming_the_file(run_dir: Path, tmp_path: Path, text: str) -> None:
    copy = tmp_path / checkdumps.RUN
    shutil.copytree(run_dir, copy)
    (copy / "check.json").write_text(text)
    res = CliRunner().invoke(
        app, ["postprocess", str(copy), "--no-compare", "--out", str(tmp_path / "o")], env={"COLUMNS": "400"}
    )
    assert res.exit_code == Exit.BAD_INPUT, res.output
    # the console folds long lines (inside the path, too, on a narrow CI terminal): compare without spaces
    flat = "".join(res.output.split())
    assert f"{copy / 'check.json'}:notavalidcheckmanifest" in flat
    assert "removethefiletopostprocessthefolderasanordinaryrun" in flat
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").glob("bundle-*"))
