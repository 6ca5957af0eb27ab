"""The token-level view: the output row of each pair, the report section, the capture file.

The output-row test runs the real verl 0.8.0 FSDP engine on CPU in a PROMPTS_ONLY collection run
with real msprobe dumps (``bench/support/fsdp_driver.py``). vLLM cannot run here, so
its side of the output row is a STAND-IN: the same weights in plain transformers (fp32) give the
token vLLM would sample after each prompt and its log-prob. The layer comparison of each pair is a
STAND-IN too (a healthy ``PairComparison``): the test is about what the output row adds to it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bench.support.verl_support import patched_verl
from tests.patches.test_training_fsdp import _drive, _msprobe_config, _records
from verl_consistency.patches.hooks.training import token_mismatch as tm
from verl_consistency.postprocess.compare import token_level
from verl_consistency.postprocess.compare.verdict import PairComparison
from verl_consistency.postprocess.output import report
from verl_consistency.postprocess.pairing.pair_types import DumpRef, Pair

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return patched_verl(tmp_path_factory.getbasetemp())


def _collection_run(root: Path, base: Path, perturb: str) -> Path:
    run_dir = base / f"run-perturb{perturb}"
    cfg = _msprobe_config(base / f"cfg{perturb}.json", base / "unused")
    report_ = _drive(
        root,
        base / "work",
        DUMP_ON="1",
        VERL_CONSISTENCY_ACTOR_CONFIG=str(cfg),
        VERL_CONSISTENCY_RUN_DIR=str(run_dir),
        VERL_CONSISTENCY_TOKEN_LEVEL="1",
        VC_TEST_TRIM="ours",
        VC_TEST_NEXT_TOKEN="1",
        VC_TEST_PERTURB=perturb,
        VC_TEST_INIT_RANGE="0.5",
    )
    assert report_["error"] is None
    assert report_["finite"], "the stash must not disturb the collection run's update"
    return run_dir


def _stand_in_pairs(run_dir: Path) -> tuple[list[Pair], list[PairComparison]]:
    pairs, comps = [], []
    for rec in _records(run_dir):
        if rec.phase != "log_prob":
            continue
        (dump,) = (run_dir / (rec.dump_path or "")).glob(f"step{rec.step}/*/dump.json")
        actor = DumpRef(
            side="actor", pid=rec.pid, rank=0, step=rec.step, dir=str(dump.parent.relative_to(run_dir))
        )
        rollout = DumpRef(side="rollout", pid=1, rank=0, step=rec.step, dir=f"rollout/1/step{rec.step}/rank0")
        pid = f"{rec.request_ids[0]}.r0.a0"
        pairs.append(
            Pair(
                pair_id=pid,
                request_id=rec.request_ids[0],
                vllm_request_id=rec.request_ids[0] + "-0123abcd",
                rollout=rollout,
                actor=actor,
                backend="fsdp",
                prompt_tokens=4,
            )
        )
        comps.append(
            PairComparison(pair_id=pid, request_id=rec.request_ids[0], status="ok", verdict="healthy")
        )
    return pairs, comps


def test_a_scale_before_the_final_norm_makes_the_pair_diverged_at_the_output_row(
    root: Path, tmp_path: Path
) -> None:
    # reference: the same weights on both sides; bf16 engine against fp32 stand-in
    clean = _collection_run(root, tmp_path, "0")
    pairs, comps = _stand_in_pairs(clean)
    assert len(pairs) == 4
    out = token_level.attach_output_rows(clean, pairs, comps)
    assert all(c.output is not None for c in out), "every dumped micro batch has its next-token record"
    assert all(c.output.status != "diverged" for c in out if c.output)
    assert all(c.verdict != "diverged" for c in out)

    # training side only: the last layer's down_proj output x1.5, which the final RMSNorm rescales
    scaled = _collection_run(root, tmp_path, "1")
    pairs, comps = _stand_in_pairs(scaled)
    out = token_level.attach_output_rows(scaled, pairs, comps)
    diverged = [c for c in out if c.output is not None and c.output.status == "diverged"]
    assert len(diverged) >= 3, [c.output for c in out]
    assert all(c.verdict == "diverged" for c in diverged), "a pair whose predictions differ is never healthy"
    for c in out:
        assert c.output is not None
        nxt = c.output
        assert nxt.abs_diff == pytest.approx(abs(nxt.train_log_prob - nxt.rollout_log_prob))

    html, md = report.write_report(
        tmp_path / "results", run_id="t", pairs=pairs, unpaired=[], comparisons=out
    )
    assert html.read_text().count("output-row") == 4, "the output row is the last row of every pair"
    assert "## Output row" in md.read_text()


def _fake_batch(n: int, length: int, drift: dict[int, float]) -> SimpleNamespace:
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(n, length, generator=g)
    roll = old.clone()
    for i, d in drift.items():
        roll[i, length // 2 :] += d
    mask = torch.ones(n, length, dtype=torch.long)
    return SimpleNamespace(
        batch={
            "responses": torch.ones(n, length, dtype=torch.long),
            "response_mask": mask,
            "old_log_probs": old,
            "rollout_log_probs": roll,
        },
        non_tensor_batch={
            "request_id": np.array([f"r{i}" for i in range(n)], dtype=object),
            "index": np.array(list(range(100, 100 + n)), dtype=object),
            "uid": np.array([f"u{i}" for i in range(n)], dtype=object),
        },
    )


def test_section_top_requests_position_profile_and_capture_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    environ = {"VERL_CONSISTENCY_TOKEN_LEVEL": "1", "VERL_CONSISTENCY_RUN_DIR": str(run_dir)}
    tm.reset_for_tests()
    verl_values = {"training/rollout_probs_diff_max": 0.5}
    tm.record(_fake_batch(6, 100, {4: 0.8, 1: 0.3}), global_step=1, verl_metrics=verl_values, environ=environ)
    tm.record(_fake_batch(6, 100, {}), global_step=2, environ=environ)
    tm.reset_for_tests()

    results = tmp_path / "results"
    section = token_level.build_section(run_dir, results)
    assert section.responses == 12
    assert [s.global_step for s in section.steps] == [1, 2]
    assert section.steps[0].verl == verl_values
    assert [t.request_id for t in section.top[:2]] == ["r4", "r1"]
    assert section.top[0].first_above == 50
    assert section.over_threshold == 2
    assert sum(n for _, n in section.histogram) == 12
    assert dict(section.histogram)["1e-1"] == 2, "the two drifted responses' mean |dlogp| (0.15, 0.4)"
    # the drift starts half-way along the response: the profile is flat zero, then positive
    profile = dict(section.position_mean)
    assert profile[0] == pytest.approx(0.0, abs=1e-6)
    assert max(v for p, v in profile.items() if p >= 50) > 0.05
    text = (results / token_level.CAPTURE_THESE).read_text()
    keys = [line.split()[0] for line in text.splitlines() if not line.startswith("#")]
    assert keys[:2] == ["index:104", "index:101"]
    assert (results / "token" / tm.TOKEN_LOG).is_file()
    assert (results / "token" / tm.SIDE_FILE).stat().st_size == 12 * 100 * 2

    html, md = report.write_report(
        results, run_id="t", pairs=[], unpaired=[], comparisons=[], sections=report.Sections(token=section)
    )
    page = html.read_text()
    assert 'id="token-level"' in page
    assert "capture-these.txt" in page
    assert "0.5" in md.read_text()
    assert json.loads(json.dumps(section.model_dump(mode="json")))["responses"] == 12
