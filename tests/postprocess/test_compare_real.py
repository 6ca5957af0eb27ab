"""compare_pairs on real msprobe dumps (tests/postprocess/realdumps.py), both dump modes."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import pytest

from bench.support import realdumps
from verl_consistency.postprocess.compare.msprobe_compare import compare_pairs
from verl_consistency.postprocess.compare.verdict import DIVERGED_REL_ERR, PairComparison
from verl_consistency.postprocess.pairing.pair_types import DumpRef

pytestmark = pytest.mark.msprobe


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> realdumps.RealRuns:
    return realdumps.build_runs(tmp_path_factory.getbasetemp() / "realdumps")


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def stats_result(runs: realdumps.RealRuns, tmp_path_factory: pytest.TempPathFactory):
    before = _tree_digest(runs.stats.run_dir)
    out = tmp_path_factory.mktemp("cmp-stats")
    pairs = realdumps.known_pairs(runs.stats)
    seen: list[str] = []
    res = compare_pairs(runs.stats.run_dir, pairs, out, jobs=2, on_done=lambda c: seen.append(c.pair_id))
    return pairs, res, out, seen, before


@pytest.fixture(scope="module")
def tensor_result(runs: realdumps.RealRuns, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("cmp-tensor")
    pairs = realdumps.known_pairs(runs.tensor)
    return pairs, compare_pairs(runs.tensor.run_dir, pairs, out, jobs=1), out


def test_statistics_first_divergence_is_the_changed_module(stats_result) -> None:
    pairs, res, out, seen, _ = stats_result
    assert [c.pair_id for c in res] == [p.pair_id for p in pairs]
    assert sorted(seen) == sorted(p.pair_id for p in pairs)
    for c in res:
        assert c.status == "ok", c.error
        assert c.task == "statistics"
        assert c.first_divergence == realdumps.CHANGED_MODULE
        assert c.verdict == "diverged"
        prof = {p.label: p.rel_err for p in c.layer_profile}
        assert prof["0"] is not None
        assert prof["0"] < 1e-5
        assert prof["1"] is not None
        assert prof["1"] > DIVERGED_REL_ERR
        assert c.worst_rows[0].module == realdumps.CHANGED_MODULE
        # msprobe flags shape differences ([1,T,H] vs [T,H]) as errors; we count, not judge, them.
        assert c.rows_shape_only_error > 10
        assert c.msprobe_first_diff is not None
        for rel in (c.csv, c.rows_csv, c.first_diff_json, c.log):
            assert rel is not None
            assert (out / rel).is_file(), rel


def test_unmatched_rows_are_filtered(stats_result) -> None:
    _, res, out, _, _ = stats_result
    c = res[0]
    with (out / c.csv).open() as fh:
        raw = list(csv.DictReader(fh))
    na = [r for r in raw if "N/A" in (r["NPU Name"], r["Bench Name"])]
    assert na, "the stand-in has vLLM-only modules (attn, per-layer rotary_emb): msprobe must show N/A rows"
    assert any(r["Bench Name"] == "N/A" and r["Result"] == "pass" for r in raw)
    assert c.rows_unmatched == len(na)
    assert c.rows_total == len(raw)
    with (out / c.rows_csv).open() as fh:
        judged = list(csv.DictReader(fh))
    assert len(judged) == c.rows_matched == len(raw) - len(na)
    assert not [r for r in judged if "N/A" in (r["target"], r["golden"])]
    # fused q/k/v rows are matched and judged on the combined norm
    qkv = [r for r in judged if r["module"] == "model.layers.0.self_attn.qkv_proj" and r["kind"] == "output"]
    assert qkv
    assert float(qkv[0]["rel_err"]) < 1e-5
    assert qkv[0]["target"].count("_proj") == 3


def test_tensor_mode_request_scoped_metrics(tensor_result) -> None:
    pairs, res, _ = tensor_result
    (c,) = res
    assert pairs[0].scoped
    assert c.status == "ok", c.error
    assert c.task == "tensor"
    assert c.first_divergence == realdumps.CHANGED_MODULE
    row = c.first_divergence_row
    assert row is not None
    assert row.cosine is not None
    assert row.cosine < 0.999
    prof = {p.label: p for p in c.layer_profile}
    assert prof["0"].cosine is not None
    assert prof["0"].cosine > 0.99999
    assert prof["1"].cosine is not None
    assert prof["1"].cosine < 0.999
    assert c.min_cosine is not None
    assert c.min_cosine < 0.999
    assert c.max_abs_err is not None
    assert c.max_abs_err > 0
    assert c.rows_shape_only_error == 0


def test_failed_pair_does_not_stop_the_others(runs: realdumps.RealRuns, tmp_path: Path) -> None:
    good = realdumps.known_pairs(runs.stats)[0]
    gone = DumpRef(side="actor", pid=1, rank=0, step=99, dir="actor/1/step99/rank0")
    bad = good.model_copy(update={"pair_id": "missing", "actor": gone})
    res = compare_pairs(runs.stats.run_dir, [bad, good], tmp_path, jobs=2)
    assert [c.status for c in res] == ["failed", "ok"]
    assert "actor/1/step99/rank0/dump.json" in (res[0].error or "")


def test_rerun_is_safe_and_inputs_untouched(runs: realdumps.RealRuns, stats_result) -> None:
    pairs, first, out, _, before = stats_result
    again = compare_pairs(runs.stats.run_dir, pairs[:1], out, jobs=1)
    assert again[0].first_divergence == first[0].first_divergence
    assert again[0].rows_matched == first[0].rows_matched
    assert sorted(p.name for p in (out / "compare").iterdir()) == sorted(p.pair_id for p in pairs)
    stored = PairComparison.model_validate_json(
        (out / "compare" / pairs[0].pair_id / "comparison.json").read_text()
    )
    assert stored.first_divergence == realdumps.CHANGED_MODULE
    assert _tree_digest(runs.stats.run_dir) == before
