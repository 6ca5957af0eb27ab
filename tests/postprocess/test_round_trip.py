"""The documented round trip on CPU: triage -> capture these -> localise.

1. **Triage.** ``build_plan(..., token_level=True)`` and ``prepare_run_dir`` make a real run
   folder; the real verl 0.8.0 FSDP engine computes old log-probs under exactly that plan's
   environment, and the hook writes token records as ``RayPPOTrainer.fit`` calls it. vLLM's
   log-probs are a STAND-IN (vLLM cannot run here): the engine's own, with one token of one
   prompt drifted.
2. **Capture these.** ``token_level.token_report`` writes ``capture-these.txt``: the drifted prompt.
3. **Localise.** ``verl-consistency run hybrid --capture prompts:capture-these.txt`` (its plan,
   its run folder) under the same engine: request ids made as the patched agent loop makes them,
   the PROMPTS_ONLY trim, real msprobe. Exactly the listed prompt is dumped, with its next-token
   record, and the postprocess bundles the token view.

With the real vLLM engine (issue 10's CPU demo) the same commands pair the dumped prompt with its
vLLM prefill; here the rollout side has nothing to pair, which the postprocess reports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.support.verl_support import patched_verl
from tests.patches.test_training_fsdp import _drive, _records
from verl_consistency.contracts import token_records
from verl_consistency.entrypoints.run.command import prepare_run_dir
from verl_consistency.entrypoints.run.overrides import Mode
from verl_consistency.entrypoints.run.plan import build_plan
from verl_consistency.entrypoints.run.plan_options import PlanOptions
from verl_consistency.patches.hooks.training import token_mismatch as tm
from verl_consistency.postprocess import pipeline
from verl_consistency.postprocess.compare import token_level

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return patched_verl(tmp_path_factory.getbasetemp())


def test_triage_capture_these_localise(root: Path, tmp_path: Path) -> None:
    dump_root = tmp_path / "dump"
    work = tmp_path / "work"

    # 1. triage
    triage = build_plan(
        Mode.HYBRID, PlanOptions(dump_root=str(dump_root), run_id="triage-1", environ={}, token_level=True)
    )
    prepare_run_dir(triage)
    report = _drive(root, work, VC_TEST_TRIM="none", VC_TEST_TOKEN_LEVEL="1", **triage.env)
    assert report["error"] is None
    run1 = Path(triage.run_dir)
    assert not list(run1.glob("*/*/step*")), "a triage run dumps nothing with msprobe"
    recs = [tm.TokenRecord.model_validate_json(x) for x in (run1 / tm.TOKEN_LOG).read_text().splitlines()]
    assert [r.index for r in recs] == [0, 1, 2, 3]

    # 2. capture these
    out1 = tmp_path / "triage-report"
    section = token_level.token_report(run1, out1)
    assert section.top[0].index == 2
    from verl_consistency.entrypoints.run import dataset

    question = dataset.make_rows()[2]["extra_info"]["question"]
    assert section.top[0].prompt is not None
    assert question.startswith(section.top[0].prompt.rstrip("…")), "the prompt's text, by its index"
    capture_file = out1 / token_level.CAPTURE_THESE
    keys = [ln.split()[0] for ln in capture_file.read_text().splitlines() if not ln.startswith("#")]
    assert keys == ["index:2"]
    assert "index:2" in (out1 / "token.md").read_text() or "| 2 |" in (out1 / "token.md").read_text()

    # the same through the postprocess: a triage run bundles its token view alone, exit 0
    triaged = pipeline.postprocess(run1, out=tmp_path / "bundles")
    assert triaged.code == pipeline.Exit.OK
    files = {f.path for f in triaged.manifest.files}
    assert "results/capture-these.txt" in files
    assert "results/token/token_mismatch.jsonl" in files
    # the bundle's batch figures sit next to verl's own values for the same batch, and match them
    (step,) = section.steps
    for ours, verls in (
        ("probs_diff_max", "training/rollout_probs_diff_max"),
        ("probs_diff_mean", "training/rollout_probs_diff_mean"),
        ("pearson_corr", "training/rollout_actor_probs_pearson_corr"),
    ):
        assert getattr(step, ours) == pytest.approx(step.verl[verls], rel=1e-5), ours
    page = (tmp_path / "bundles" / "work-triage-1" / "results" / "report.html").read_text()
    assert 'id="token-steps"' in page

    # 3. localise
    loc = build_plan(
        Mode.HYBRID,
        PlanOptions(
            dump_root=str(dump_root),
            run_id="localise-1",
            environ={},
            capture=f"prompts:{capture_file}",
            prompts_only=True,  # the stand-in's trim (VC_TEST_TRIM=ours) is the recipe's
        ),
    )
    prepare_run_dir(loc)
    report = _drive(
        root, work, VC_TEST_TRIM="ours", VC_TEST_IDS_FROM_AGENT_LOOP="1", VC_TEST_NEXT_TOKEN="1", **loc.env
    )
    assert report["error"] is None
    run2 = Path(loc.run_dir)
    (rec,) = _records(run2)
    assert rec.request_ids == [report["request_ids"][2]], "exactly the listed prompt is dumped"
    assert rec.request_ids[0].startswith("vccap")
    (nxt,) = token_level.next_token_records(run2)
    assert nxt.request_id == rec.request_ids[0]
    assert nxt.step == rec.step

    outcome = pipeline.postprocess(run2, out=tmp_path / "bundles")
    assert outcome.code == pipeline.Exit.NOTHING_PAIRED  # no vLLM side here (see the module doc)
    assert outcome.bundle.is_file()
    names = {f.path for f in outcome.manifest.files}
    assert any(n.endswith(f"-{token_records.NEXT_TOKEN_LOG}") for n in names), names
    manifest = json.loads(outcome.manifest.model_dump_json())
    assert manifest["run_id"] == "localise-1"
