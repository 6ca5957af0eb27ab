"""The report per training step: verdicts, worst relative error, first divergence, token mismatch
and verl's metrics for each weight version, in ``report.html``, ``summary.md`` and ``summary.json``.

Run folders built in code (``pairing_trees``) and paired by the real ``pair_run``, so each pair
carries the version its records named. The comparisons stand in for msprobe's (their verdicts and
first divergence are what ``verdict.summarise`` would give a planted weight-sync fault); the token
records are written in the hooks' contract (``contracts/token_records.py``) and read by the real
``token_level.build_section``; the report is the real one.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import orjson
import pytest

from verl_consistency.contracts import token_records as tm
from verl_consistency.contracts.run_manifest import StepMetrics
from verl_consistency.postprocess.compare import token_level
from verl_consistency.postprocess.compare.token_steps import PUBLISHED_MEAN_ABS
from verl_consistency.postprocess.compare.verdict import OutputRow, PairComparison
from verl_consistency.postprocess.output import per_step, report
from verl_consistency.postprocess.pairing.discover import Roots
from verl_consistency.postprocess.pairing.pair import pair_run
from verl_consistency.postprocess.pairing.pair_types import Pair

from .pairing_trees import RunTree, req, vid

FAULT = "model.layers.2.mlp.down_proj"


def _run(tmp_path: Path, versions: dict[int, list[str]] | None) -> tuple[RunTree, list[Pair]]:
    """One request per (version, id); ``versions`` None: the same requests, no version on any record."""
    t = RunTree(tmp_path / "runs")
    plan = versions or {0: ["a0", "a1"], 1: ["b0", "b1"]}
    n = 0
    for v, ids in plan.items():
        for rid in ids:
            version = v if versions is not None else None
            t.rollout_step(1, 0, n, [req(vid(rid))], weight_version=version)
            t.actor_step(2, 0, n, [rid], weight_version=version)
            n += 1
    res = pair_run(Roots.open(t.run_dir, **t.roots_args()))
    assert len(res.pairs) == n, res.unpaired
    return t, res.pairs


def _comparison(pair: Pair, *, diverged: bool, output_only: bool = False) -> PairComparison:
    """What ``verdict.summarise`` gives: kernel noise (tensor mode), or the planted module over the bound."""
    if not diverged:
        return PairComparison(
            pair_id=pair.pair_id, request_id=pair.request_id, task="tensor", status="ok", verdict="healthy",
            max_rel_err=0.0112, min_cosine=0.99993,
        )  # fmt: skip
    if output_only:
        out = OutputRow(
            token=7,
            rollout_log_prob=-1.0,
            train_log_prob=-2.0,
            abs_diff=1.0,
            train_argmax=8,
            status="diverged",
        )
        return PairComparison(
            pair_id=pair.pair_id, request_id=pair.request_id, task="tensor", status="ok", verdict="diverged",
            max_rel_err=0.02, output=out,
        )  # fmt: skip
    return PairComparison(
        pair_id=pair.pair_id, request_id=pair.request_id, task="tensor", status="ok", verdict="diverged",
        first_divergence=FAULT, max_rel_err=0.31 + 0.01 * len(pair.request_id), min_cosine=0.95,
    )  # fmt: skip


def _token_records(run_dir: Path, per_step_values: dict[int, list[list[float | None]]]) -> None:
    """token_mismatch.jsonl: one record per response, per-position |Δ log p| inline."""
    lines = []
    for step, responses in per_step_values.items():
        for sample, row in enumerate(responses):
            valid = [v for v in row if v is not None]
            rec = tm.TokenRecord(
                timestamp="2026-01-01T00:00:00", pid=3, global_step=step, threshold=tm.DEFAULT_THRESHOLD,
                sample=sample, request_id=f"s{step}r{sample}", index=sample, response_length=len(valid),
                tokens=len(valid), abs_diff=sum(valid) / len(valid), max_abs_diff=max(valid),
                abs_logp_diff=row,
            )  # fmt: skip
            lines.append(orjson.dumps(rec.model_dump(mode="json")))
    (run_dir / tm.TOKEN_LOG).write_bytes(b"\n".join(lines) + b"\n")


def _write(
    tmp_path: Path, pairs: list[Pair], comps: list[PairComparison], section=None, run_steps=()
) -> tuple[str, str, per_step.RunSummary]:
    out = tmp_path / "out"
    html, md = report.write_report(
        out, run_id="steps", pairs=pairs, unpaired=[], comparisons=comps,
        sections=report.Sections(token=section, run_steps=run_steps),
    )  # fmt: skip
    summary = per_step.RunSummary.model_validate_json((out / per_step.SUMMARY_JSON).read_bytes())
    return html.read_text(), md.read_text(), summary


def test_two_versions_healthy_then_diverged_name_the_planted_module(tmp_path: Path) -> None:
    """Weights 0 (step 1) healthy; weights 1 and 2 (steps 2, 3) diverged at the skipped tensor."""
    _t, pairs = _run(tmp_path, {0: ["a0", "a1"], 1: ["b0", "b1", "b2"], 2: ["c0", "c1"]})
    assert sorted({p.weight_version for p in pairs}) == [0, 1, 2]
    comps = [_comparison(p, diverged=p.weight_version != 0) for p in pairs]
    html, md, summary = _write(tmp_path, pairs, comps)

    rows = summary.per_step
    assert [(r.global_step, r.weight_version, r.pairs) for r in rows] == [(1, 0, 2), (2, 1, 3), (3, 2, 2)]
    assert [r.verdicts.model_dump() for r in rows] == [
        {"healthy": 2, "suspicious": 0, "diverged": 0, "failed": 0},
        {"healthy": 0, "suspicious": 0, "diverged": 3, "failed": 0},
        {"healthy": 0, "suspicious": 0, "diverged": 2, "failed": 0},
    ]
    assert rows[0].worst_rel_err == pytest.approx(0.0112)
    assert rows[0].first_divergence is None
    assert rows[1].worst_rel_err == pytest.approx(0.33)
    assert rows[1].worst_task == "tensor"
    assert (rows[1].first_divergence, rows[1].first_divergence_module, rows[1].first_divergence_pairs) == (
        "layers.2.mlp",
        FAULT,
        3,
    )
    assert summary.drift == "step 1: healthy · step 2+: diverged at layers.2.mlp"
    assert summary.per_step_note is None
    assert (summary.verdicts.healthy, summary.verdicts.diverged, summary.overall) == (2, 5, "diverged")

    assert "step 2+: diverged at layers.2.mlp" in html
    assert "step 2+: diverged at layers.2.mlp" in md
    table = html[
        html.index('id="per-step-table"') : html.index("</table>", html.index('id="per-step-table"'))
    ]
    assert table.count('class="step-row') == 3
    assert f'<a href="#pair-{rows[1].worst_rel_err_pair}">' in table, "the worst pair is one click away"
    chart = re.search(r'<svg[^>]*class="steps".*?</svg>', html, re.S)
    assert chart is not None
    assert chart.group(0).count("<title>step 2: 3 diverged</title>") == 1
    assert "healthy ≤ 0.045" in chart.group(0), "the tensor bounds: the worst pairs are tensor mode"
    assert "<script" not in html, "the report works offline"
    assert not re.search(r'(src|href)="https?:', html), "the report works offline"


def test_a_run_without_versions_is_one_group_and_says_why(tmp_path: Path) -> None:
    _t, pairs = _run(tmp_path, None)
    assert {p.weight_version for p in pairs} == {None}
    comps = [_comparison(p, diverged=False) for p in pairs]
    html, md, summary = _write(tmp_path, pairs, comps)
    (row,) = summary.per_step
    assert (row.global_step, row.weight_version, row.pairs, row.verdicts.healthy) == (None, None, 4, 4)
    assert summary.per_step_note == per_step.NO_VERSION_NOTE
    assert summary.drift == "all pairs: healthy"
    assert f"One group: {per_step.NO_VERSION_NOTE}" in md
    assert 'id="per-step-note"' in html
    assert "all (no version)" in html
    assert 'class="steps"' not in html, "no step to draw"
    # the manifest of such a run keeps its shape: no weight_version key on its pairs
    assert all("weight_version" not in p.model_dump(mode="json") for p in pairs)


def test_unversioned_pairs_stand_apart_from_the_steps_of_the_token_records(tmp_path: Path) -> None:
    t, pairs = _run(tmp_path, None)
    _token_records(t.run_dir, {1: [[0.01, 0.02]], 2: [[0.03, 0.01]]})
    section = token_level.build_section(t.run_dir)
    rows, note = per_step.build(pairs, [_comparison(p, diverged=False) for p in pairs], section.per_step)
    assert [r.global_step for r in rows] == [None, 1, 2]
    assert note == per_step.NO_VERSION_NOTE, "the pairs are one group; the token records keep their steps"
    assert per_step.drift_line(rows) == "all pairs: healthy"
    # one pair that does know its weights (version 1: step 2) takes its step; the rest stay apart
    mixed = [pairs[0].model_copy(update={"weight_version": 1}), *pairs[1:]]
    rows, note = per_step.build(mixed, [_comparison(p, diverged=False) for p in mixed], section.per_step)
    assert [(r.global_step, r.pairs) for r in rows] == [(None, 3), (1, 0), (2, 1)]
    assert note is None
    assert per_step.drift_line(rows) == "pairs of unknown weights: healthy · step 2: healthy"


def test_token_records_give_each_step_its_mean_and_worst_token(tmp_path: Path) -> None:
    t, pairs = _run(tmp_path, {0: ["a0"], 1: ["b0"]})
    # step 1: 3 + 1 valid tokens; the mean is over tokens, not over responses
    _token_records(
        t.run_dir,
        {1: [[0.01, 0.02, 0.03], [None, 0.05]], 2: [[0.2, 0.9, None, 0.1]]},
    )
    results = tmp_path / "results"
    section = token_level.build_section(t.run_dir, results, pairs)
    assert [(s.global_step, s.responses, s.tokens) for s in section.per_step] == [(1, 2, 4), (2, 1, 3)]
    assert section.per_step[0].mean_abs_diff == pytest.approx((0.01 + 0.02 + 0.03 + 0.05) / 4)
    assert (section.per_step[0].worst_request_id, section.per_step[0].worst_position) == ("s1r1", 1)
    assert (section.per_step[1].max_abs_diff, section.per_step[1].worst_position) == (0.9, 1)
    assert section.top[0].request_id == "s2r0"
    assert section.top[0].worst_position == 1

    with (results / token_level.TOKEN_DIR / token_level.RESPONSES_CSV).open() as fh:
        every = list(csv.DictReader(fh))
    assert [(r["global_step"], r["request_id"], r["worst_position"]) for r in every] == [
        ("1", "s1r0", "2"),
        ("1", "s1r1", "1"),
        ("2", "s2r0", "1"),
    ]

    comps = [_comparison(p, diverged=p.weight_version == 1) for p in pairs]
    html, md, summary = _write(tmp_path, pairs, comps, section)
    one, two = summary.per_step
    assert one.mean_abs_logp_diff == pytest.approx(0.0275)
    assert one.responses == 2
    assert (two.max_abs_logp_diff, two.worst_token_position, two.worst_token_request_id) == (0.9, 1, "s2r0")
    assert f"about <b>{PUBLISHED_MEAN_ABS}</b>" in html, "the published figure stands next to the step mean"
    assert "published bf16 ≈ 0.011" in html, "and in the chart, as a reference line"
    assert 'title="request s2r0">0.9 <small>@1</small>' in html
    assert "| 1 | 2 | 4 | 0.0275 | 0.05 | `s1r1`, token 1 |" in md


def test_without_token_records_the_token_columns_are_empty(tmp_path: Path) -> None:
    t, pairs = _run(tmp_path, {0: ["a0"], 1: ["b0"]})
    section = token_level.build_section(t.run_dir)
    assert section.empty
    assert section.per_step == []
    _, _, summary = _write(tmp_path, pairs, [_comparison(p, diverged=False) for p in pairs], section)
    assert [(r.responses, r.mean_abs_logp_diff, r.max_abs_logp_diff) for r in summary.per_step] == [
        (0, None, None),
        (0, None, None),
    ]


def test_batch_figures_alone_give_the_step_mean(tmp_path: Path) -> None:
    """A step with token_mismatch_steps.jsonl only: the batch's abs_diff is the same mean."""
    step = tm.StepRecord(
        timestamp="2026-01-01T00:00:00",
        pid=3,
        global_step=4,
        threshold=1.0,
        tokens=40,
        responses=4,
        abs_diff=0.012,
    )
    (tmp_path / tm.STEP_LOG).write_bytes(orjson.dumps(step.model_dump(mode="json")) + b"\n")
    (row,) = token_level.build_section(tmp_path).per_step
    assert (row.global_step, row.responses, row.tokens, row.mean_abs_diff) == (4, 4, 40, 0.012)


def test_run_json_steps_fill_grad_norm_and_reward(tmp_path: Path) -> None:
    _t, pairs = _run(tmp_path, {0: ["a0"], 1: ["b0"]})
    warnings: list[str] = []
    run_json = {
        "steps": [
            {"step": 1, "grad_norm": 3.58, "reward_mean": 0.09},
            {"step": 2, "grad_norm": None, "reward_mean": 0.13, "not_finite": ["grad_norm"]},
            {"step": 3, "grad_norm": 4.01},
            {"step": "x"},
        ]
    }
    steps = per_step.read_steps(run_json, warnings)
    assert [s.step for s in steps] == [1, 2, 3]
    assert len(warnings) == 1
    assert warnings[0].startswith("run.json: steps[3] unreadable")
    html, _, summary = _write(
        tmp_path, pairs, [_comparison(p, diverged=False) for p in pairs], run_steps=steps
    )
    assert [(r.global_step, r.pairs, r.grad_norm, r.reward_mean) for r in summary.per_step] == [
        (1, 1, 3.58, 0.09),
        (2, 1, None, 0.13),
        (3, 0, 4.01, None),
    ]
    assert summary.per_step[1].not_finite == ["grad_norm"]
    assert "(NaN)" in html
    assert summary.drift == "step 1+: healthy", "step 3 has no pairs: the line ends at step 2"


def test_without_run_json_steps_the_metrics_are_empty(tmp_path: Path) -> None:
    _t, pairs = _run(tmp_path, {0: ["a0"]})
    assert per_step.read_steps(None) == []
    assert per_step.read_steps({"steps": []}) == []
    _, _, summary = _write(tmp_path, pairs, [_comparison(pairs[0], diverged=False)])
    (row,) = summary.per_step
    assert (row.grad_norm, row.reward_mean, row.not_finite) == (None, None, [])


def test_diverged_at_the_output_row_only_is_named_output(tmp_path: Path) -> None:
    _t, pairs = _run(tmp_path, {0: ["a0"], 1: ["b0", "b1"]})
    comps = [_comparison(p, diverged=p.weight_version == 1, output_only=True) for p in pairs]
    _, _, summary = _write(tmp_path, pairs, comps)
    assert summary.per_step[1].first_divergence == "output"
    assert summary.drift == "step 1: healthy · step 2: diverged at output"


@pytest.mark.parametrize(
    ("module", "block"),
    [
        (FAULT, "layers.2.mlp"),
        ("model.layers.0.self_attn.o_proj", "layers.0.self_attn"),
        ("model.layers.3", "layers.3"),
        ("model.embed_tokens", "embed_tokens"),
        ("lm_head", "lm_head"),
    ],
)
def test_block_of(module: str, block: str) -> None:
    assert per_step.block_of(module) == block


def test_the_summary_schema_is_json(tmp_path: Path) -> None:
    """summary.json is plain JSON a jq user reads: per_step entries carry every field, nulls included."""
    _t, pairs = _run(tmp_path, {0: ["a0"]})
    _write(
        tmp_path,
        pairs,
        [_comparison(pairs[0], diverged=False)],
        run_steps=[StepMetrics(step=1, grad_norm=1.0)],
    )
    data = json.loads((tmp_path / "out" / per_step.SUMMARY_JSON).read_text())
    assert data["summary_version"] == 1
    assert data["published_mean_abs_logp_diff"] == PUBLISHED_MEAN_ABS
    assert set(data["per_step"][0]) == set(per_step.StepSummary.model_fields)
    assert data["per_step"][0]["grad_norm"] == 1.0


def test_the_pipeline_reads_run_json_steps_and_bundles_summary_json(tmp_path: Path, monkeypatch) -> None:
    """postprocess(): run.json's steps and the token records reach summary.json, which the bundle holds.
    msprobe's compare is stood in for (the H200 fixtures run the real one)."""
    from verl_consistency.postprocess import pipeline
    from verl_consistency.postprocess.compare import msprobe_compare

    t, _ = _run(tmp_path, {0: ["a0"], 1: ["b0", "b1"]})
    _token_records(t.run_dir, {1: [[0.01, 0.01]], 2: [[0.02, 0.4]]})
    t.run_json(steps=[{"step": 1, "grad_norm": 3.6, "reward_mean": 0.1}, {"step": 2, "grad_norm": 3.9}])

    def fake_compare(view, pairs, results, *, jobs, on_done):
        for p in pairs:
            c = _comparison(p, diverged=p.weight_version == 1)
            on_done(c)
            yield c

    monkeypatch.setattr(msprobe_compare, "compare_pairs", fake_compare)
    outcome = pipeline.postprocess(t.run_dir, out=tmp_path / "bundles")
    assert outcome.code == pipeline.Exit.OK, outcome.warnings
    assert f"results/{per_step.SUMMARY_JSON}" in {f.path for f in outcome.manifest.files}
    work = tmp_path / "bundles" / f"work-{outcome.manifest.run_id}" / "results"
    summary = per_step.RunSummary.model_validate_json((work / per_step.SUMMARY_JSON).read_bytes())
    assert [(r.global_step, r.pairs, r.grad_norm, r.verdicts.diverged) for r in summary.per_step] == [
        (1, 1, 3.6, 0),
        (2, 2, 3.9, 2),
    ]
    assert summary.per_step[1].mean_abs_logp_diff == pytest.approx(0.21)
    assert summary.drift == "step 1: healthy · step 2: diverged at layers.2.mlp"
    assert (work / token_level.TOKEN_DIR / token_level.RESPONSES_CSV).is_file()


def test_the_h200_fixtures_have_no_versions_and_are_one_group() -> None:
    """The committed H200 runs predate weight versions: re-paired, their pairs are one group."""
    fixtures = Path(__file__).parent / "fixtures" / "h200-next"
    run = fixtures / "h200-next-hybrid-log-prob"
    pairs = pair_run(Roots.open(run)).pairs
    assert len(pairs) == 4
    assert {p.weight_version for p in pairs} == {None}
    rows, note = per_step.build(pairs, [_comparison(p, diverged=False) for p in pairs])
    assert [(r.global_step, r.pairs) for r in rows] == [(None, 4)]
    assert note == per_step.NO_VERSION_NOTE
    assert per_step.read_steps(json.loads((run / "run.json").read_text())) == []


def test_a_fully_async_step_counts_its_stale_pairs_and_names_their_staleness(tmp_path: Path) -> None:
    """Step 2 trains (weights 1) on a, b generated at 0 and c at 1; step 3 (weights 2) on d, e at 0
    and 2. The stale pairs ran their rollout's weights (trainer_weight_version = the step's)."""
    t = RunTree(tmp_path / "runs")
    plan = [("a", 0, 1), ("b", 0, 1), ("c", 1, None), ("d", 0, 2), ("e", 2, None)]
    for n, (rid, v, trainer) in enumerate(plan):
        t.rollout_step(1, 0, n, [req(vid(rid))], weight_version=v)
        extra = {} if trainer is None else {"trainer_weight_version": trainer}
        t.actor_step(2, 0, n, [rid], weight_version=v, **extra)
    pairs = pair_run(Roots.open(t.run_dir, **t.roots_args())).pairs
    assert len(pairs) == 5
    comps = [_comparison(p, diverged=False) for p in pairs]
    html, md, summary = _write(tmp_path, pairs, comps)
    rows = {r.global_step: r for r in summary.per_step}
    assert sorted(rows) == [2, 3], "a pair counts in the step that trained it, not its rollout's"
    assert (rows[2].weight_version, rows[2].rollout_versions, rows[2].max_staleness, rows[2].pairs) == (
        1,
        [0, 1],
        1,
        3,
    )
    assert (rows[3].rollout_versions, rows[3].max_staleness, rows[3].pairs) == ([0, 2], 2, 2)
    assert "| 2 | 1 | 0, 1 | 1 | 3 |" in md
    assert "| 3 | 2 | 0, 2 | 2 | 2 |" in md
    assert "<th>rollout weights</th><th>staleness</th>" in html


def test_a_hybrid_step_has_staleness_zero(tmp_path: Path) -> None:
    _t, pairs = _run(tmp_path, {0: ["a0"], 1: ["b0"]})
    _html, _md, summary = _write(tmp_path, pairs, [_comparison(p, diverged=False) for p in pairs])
    assert [(r.rollout_versions, r.max_staleness) for r in summary.per_step] == [([0], 0), ([1], 0)]


def _rec(step: int, sample: int, diff: float, versions=None, offsets=None) -> tm.TokenRecord:
    return tm.TokenRecord(
        timestamp="2026-01-01T00:00:00", pid=3, global_step=step, threshold=tm.DEFAULT_THRESHOLD,
        sample=sample, request_id=f"s{step}r{sample}", response_length=4, tokens=4, abs_diff=diff,
        max_abs_diff=diff * 2, abs_logp_diff=[diff] * 4, rollout_weight_versions=versions,
        rollout_version_offsets=offsets,
    )  # fmt: skip


def test_a_response_other_weights_made_is_kept_out_of_the_steps_token_figures() -> None:
    """Step 3 (weights 2): r0 made by 2 alone; r1 generated at 1 (stale from token 0); r2 resumed
    after a sync, 2 then 3 from token 2 (stale from 2); r3 without versions (older records)."""
    from verl_consistency.postprocess.compare import token_steps as ts

    recs = [
        _rec(3, 0, 0.01, [2], [0]),
        _rec(3, 1, 0.5, [1], [0]),
        _rec(3, 2, 0.3, [2, 3], [0, 2]),
        _rec(3, 3, 0.03),
    ]
    assert [ts.stale_from(r) for r in recs] == [None, 0, 2, None]
    assert [ts.weights_text(r) for r in recs] == ["2", "1", "2→3@2", ""]
    (step,) = ts.per_step(recs, [0, 0, 0, 0])
    assert (step.responses, step.stale_responses) == (4, 2)
    assert step.mean_abs_diff == pytest.approx(0.02), "the responses the step's weights made end to end"
    assert step.stale_mean_abs_diff == pytest.approx(0.4)
    assert (step.max_abs_diff, step.worst_request_id) == (0.06, "s3r3"), "the worst of those, not the stale"


def test_every_response_stale_leaves_the_steps_mean_empty_and_says_so(tmp_path: Path) -> None:
    from verl_consistency.postprocess.compare import token_steps as ts

    recs = [_rec(2, i, 0.5, [0], [0]) for i in range(2)]
    (step,) = ts.per_step(recs, [0, 0])
    assert (step.mean_abs_diff, step.max_abs_diff, step.stale_responses) == (None, None, 2)
    ts.write_responses_csv(tmp_path / "r.csv", recs, [0, 0], {})
    header, row, _ = (tmp_path / "r.csv").read_text().split("\n", 2)
    assert header.endswith("rollout_weights,stale_from")
    assert row.endswith(",0,0")
