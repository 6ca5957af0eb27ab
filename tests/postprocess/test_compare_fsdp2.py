"""FSDP2 training dumps through the real msprobe compare (tests/postprocess/fsdp2dumps.py).

The same tiny Qwen2 is dumped under verl's FSDP1 and FSDP2 (verl's own ``apply_fsdp2``) against
the same vLLM stand-in; the FSDP2 pair must compare exactly as well as the FSDP1 one.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bench.support import realdumps
from tests.fixtures import fsdp2dumps
from tests.postprocess.test_compare_real import _tree_digest
from verl_consistency.postprocess.compare import fsdp2_names, verdict
from verl_consistency.postprocess.compare import msprobe_compare as compare
from verl_consistency.postprocess.compare.msprobe_compare import compare_pairs
from verl_consistency.postprocess.compare.verdict import PairComparison

pytestmark = pytest.mark.msprobe

TASKS = ("statistics", "tensor")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> fsdp2dumps.StrategyRuns:
    return fsdp2dumps.build_runs(tmp_path_factory.getbasetemp() / "fsdp2dumps")


def _training_dump(spec: realdumps.RunSpec) -> Path:
    (pair,) = realdumps.known_pairs(spec)
    return spec.run_dir / pair.actor.dir / "dump.json"


def _keys(path: Path) -> list[str]:
    return list(json.loads(path.read_text())["data"])


@pytest.fixture(scope="module")
def compared(runs: fsdp2dumps.StrategyRuns, tmp_path_factory: pytest.TempPathFactory):
    """(strategy, task) → (comparison, out_dir); input digests before and after."""
    out: dict[tuple[str, str], tuple[PairComparison, Path]] = {}
    before = {k: _tree_digest(s.run_dir) for k, s in runs.runs.items()}
    for key, spec in runs.runs.items():
        dst = tmp_path_factory.mktemp(f"cmp-{key[0]}-{key[1]}")
        (res,) = compare_pairs(spec.run_dir, realdumps.known_pairs(spec), dst, jobs=1)
        out[key] = (res, dst)
    after = {k: _tree_digest(s.run_dir) for k, s in runs.runs.items()}
    return out, before, after


def test_fsdp2_names_differ_and_map_onto_fsdp1(runs: fsdp2dumps.StrategyRuns) -> None:
    fsdp1 = _keys(_training_dump(runs.runs[("fsdp", "statistics")]))
    fsdp2 = _keys(_training_dump(runs.runs[("fsdp2", "statistics")]))
    assert all(k.startswith("Module._fsdp_wrapped_module.") for k in fsdp1)
    assert not [k for k in fsdp2 if fsdp2_names.WRAPPER in k]
    assert "Module.model.embed_tokens.FSDPEmbedding.forward.0" in fsdp2
    assert "Module.model.layers.1.FSDPQwen2DecoderLayer.forward.0" in fsdp2
    assert fsdp2_names.is_fsdp2(fsdp2)
    assert not fsdp2_names.is_fsdp2(fsdp1)
    renamed = fsdp2_names.fsdp1_names(fsdp2)
    # Every FSDP2 module becomes the name FSDP1 dumps for it, in the same order. The one FSDP1
    # row left over is Qwen2Model: under verl, msprobe skips the model's second named module,
    # which is FSDP1's inner Qwen2ForCausalLM but FSDP2's Qwen2Model.
    assert [renamed[k] for k in fsdp2] == [k for k in fsdp1 if "Qwen2Model" not in k]
    leftover = [k for k in fsdp1 if "Qwen2Model" in k]
    assert leftover == ["Module._fsdp_wrapped_module.model.Qwen2Model.forward.0"]


def test_msprobe_alone_matches_nothing_on_fsdp2(runs: fsdp2dumps.StrategyRuns, tmp_path: Path) -> None:
    """The gap this module closes: msprobe 26.2.0 on the FSDP2 names as dumped."""
    spec = runs.runs[("fsdp2", "statistics")]
    (pair,) = realdumps.known_pairs(spec)
    golden = spec.run_dir / pair.rollout.dir / "dump.json"
    csv_path, _ = compare._run_msprobe(_training_dump(spec), golden, tmp_path, "fsdp")
    rows, total, _, _ = verdict.read_rows(csv_path)
    assert total > 0
    assert not [r for r in rows if r.status != "unmatched"]


def test_verl_in_sys_modules_drops_first_and_last_submodule(
    runs: fsdp2dumps.StrategyRuns, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """msprobe 26.2.0 skips a model's 2nd and last ``named_modules()`` entry once ``verl`` is imported."""
    plain = realdumps.build_runs(tmp_path_factory.getbasetemp() / "realdumps")  # no verl imported
    (plain_pair,) = realdumps.known_pairs(plain.tensor)
    plain_keys = _keys(plain.tensor.run_dir / plain_pair.actor.dir / "dump.json")
    assert "Module._fsdp_wrapped_module.lm_head.Linear.forward.0" in plain_keys
    assert "Module._fsdp_wrapped_module.Qwen2ForCausalLM.forward.0" in plain_keys
    for (strategy, _), spec in runs.runs.items():
        keys = _keys(_training_dump(spec))
        assert not [k for k in keys if ".lm_head." in k], strategy
        assert not [k for k in keys if "Qwen2ForCausalLM" in k], strategy
        (pair,) = realdumps.known_pairs(spec)
        vllm_keys = _keys(spec.run_dir / pair.rollout.dir / "dump.json")
        assert "Module.model.Qwen2Model.forward.0" not in vllm_keys
        assert not [k for k in vllm_keys if ".lm_head." in k]
    fsdp2 = _keys(_training_dump(runs.runs[("fsdp2", "statistics")]))
    assert not [k for k in fsdp2 if "Qwen2Model" in k]


@pytest.mark.parametrize("task", TASKS)
def test_fsdp2_pair_compares_like_fsdp1(compared, task: str) -> None:
    out, _, _ = compared
    (c1, _), (c2, dst) = out[("fsdp", task)], out[("fsdp2", task)]
    for c in (c1, c2):
        assert c.status == "ok", c.error
        assert c.task == task
        assert c.first_divergence == realdumps.CHANGED_MODULE
        assert c.verdict == "diverged"
    assert (c1.fsdp2_normalised, c2.fsdp2_normalised) == (False, True)
    assert c2.rows_matched == c1.rows_matched > 40
    assert [(p.label, p.module) for p in c2.layer_profile] == [(p.label, p.module) for p in c1.layer_profile]
    for p1, p2 in zip(c1.layer_profile, c2.layer_profile, strict=True):
        assert p2.rel_err == pytest.approx(p1.rel_err, rel=1e-6, abs=1e-12)
    # our fields and rows.csv speak the dump's own FSDP2 names
    own = "Module.model.layers.1.mlp.down_proj.Linear.forward.0.parameters.weight"
    assert c2.first_divergence_target == own
    assert c2.msprobe_first_diff is not None
    assert fsdp2_names.WRAPPER not in c2.msprobe_first_diff
    assert c2.rows_csv is not None
    with (dst / c2.rows_csv).open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == c2.rows_matched
    assert not [r for r in rows if fsdp2_names.WRAPPER in r["target"]]
    qkv = next(
        r for r in rows if r["module"] == "model.layers.0.self_attn.qkv_proj" and r["kind"] == "output"
    )
    parts = [p.strip() for p in qkv["target"].split(";")]
    assert [p.split(".")[5] for p in parts] == ["q_proj", "k_proj", "v_proj"]
    assert all(p.startswith("Module.model.layers.0.self_attn.") for p in parts)
    # the renamed copy (and its links into the run) is gone; only results remain
    (folder,) = (dst / compare.COMPARE_DIR).iterdir()
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["compare.log", "compare_result.csv", "comparison.json", "first_diff.json", "rows.csv"]
    )


def test_inputs_untouched(compared) -> None:
    _, before, after = compared
    assert before == after
