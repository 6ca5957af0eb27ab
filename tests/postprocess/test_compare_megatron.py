"""Real Megatron training dumps through pair -> compare -> report (tests/postprocess/megatrondumps.py).

The training side is what the patched Megatron engine wrote on an H200 (committed, since
megatron-core needs CUDA): verl 0.8.0's (the current pin set) and verl 0.9.1's (the next set;
what only that fixture shows is in test_compare_megatron_next.py). Each pairing and compare test
runs on both fixtures, whichever set is in force: they read committed files. The inference side
is the vLLM-layout stand-in loaded with the weights that engine exported for vLLM. msprobe's
``--consistent_check --backend megatron`` name map (``linear_qkv`` -> ``qkv_proj``,
``linear_fc1`` -> ``gate_up_proj``, ...) does the matching.
"""

from __future__ import annotations

import json

import pytest

from tests.postprocess import megatrondumps
from tests.postprocess.test_compare_real import _tree_digest
from verl_consistency.contracts import records
from verl_consistency.postprocess import pipeline
from verl_consistency.postprocess.compare.verdict import PairComparison

pytestmark = pytest.mark.msprobe


ENGINES = {"verl-0.8.0": megatrondumps.FIXTURE, "verl-0.9.1": megatrondumps.FIXTURE_NEXT}


@pytest.fixture(scope="module", params=sorted(ENGINES))
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> megatrondumps.MegatronRuns:
    base = tmp_path_factory.getbasetemp() / f"megatrondumps-{request.param}"
    return megatrondumps.build_runs(base, ENGINES[request.param])


@pytest.fixture(scope="module")
def outcomes(runs: megatrondumps.MegatronRuns, tmp_path_factory: pytest.TempPathFactory):
    out = {}
    for kind, run_dir in (("ok", runs.ok), ("diff", runs.diff)):
        before = _tree_digest(run_dir)
        dst = tmp_path_factory.mktemp(f"mcore-{kind}")
        res = pipeline.postprocess(run_dir, out=dst, jobs=2)
        assert _tree_digest(run_dir) == before, "the postprocess modified its inputs"
        out[kind] = (res, dst)
    return out


def _comparisons(outcome: pipeline.Outcome) -> list[PairComparison]:
    return [PairComparison.model_validate(c) for c in outcome.manifest.comparisons]


def test_fixture_is_the_megatron_engine_dump() -> None:
    """What the patched engine wrote: one dump per forward_step, Megatron's module tree, the ids."""
    (log,) = megatrondumps.FIXTURE.glob(f"actor/*/{records.UPDATE_ACTOR_LOG}")
    recs = [records.UpdateActorRecord.model_validate_json(x) for x in log.read_text().splitlines()]
    ids = list(megatrondumps.meta()["prompts"])
    assert [r.request_ids for r in recs] == [[i] for i in ids]
    assert {(r.backend, r.phase, r.rank, r.num_requests) for r in recs} == {("megatron", "log_prob", 0, 1)}
    assert [r.step for r in recs] == [0, 1, 2, 3]
    for rec, tokens in zip(recs, megatrondumps.meta()["prompts"].values(), strict=True):
        (dump,) = (log.parent / f"step{rec.step}").glob("*/dump.json")
        data = json.loads(dump.read_text())["data"]
        emb = data["Module.module.module.embedding.word_embeddings.VocabParallelEmbedding.forward.0"]
        assert emb["output"][0]["shape"] == [1, len(tokens), 32], "the micro batch is its prompt"
        assert "Module.module.module.decoder.layers.1.mlp.linear_fc2.RowParallelLinear.forward.0" in data
        assert not [k for k in data if ".backward." in k], "Megatron's dump holds the forward only"


def test_every_request_pairs_with_backend_megatron(outcomes, runs: megatrondumps.MegatronRuns) -> None:
    for res, _ in outcomes.values():
        assert res.code == pipeline.Exit.OK
        assert sorted(p.request_id for p in res.result.pairs) == sorted(runs.request_ids)
        assert {p.backend for p in res.result.pairs} == {"megatron"}
        assert not res.result.unpaired


def test_equal_weights_compare_healthy(outcomes) -> None:
    res, dst = outcomes["ok"]
    comps = _comparisons(res)
    assert len(comps) == 4
    for c in comps:
        assert c.status == "ok", c.error
        assert c.backend == "megatron"
        assert c.rows_matched >= 50
        assert c.verdict == "healthy", c.worst_rows
        assert c.first_divergence is None
        assert c.max_rel_err is not None
        assert c.max_rel_err < 0.01
    # the logits row is structural, not a divergence: GPTModel includes the output layer
    folder = next((dst / f"work-{res.manifest.run_id}" / "results" / "compare").iterdir())
    rows = (folder / "rows.csv").read_text()
    assert "GPTModel.forward.0.output.0" in rows
    assert "logits" in rows
    assert (dst / f"work-{res.manifest.run_id}" / "results" / "report.html").is_file()


def test_perturbed_weight_is_the_first_divergence(outcomes) -> None:
    res, _ = outcomes["diff"]
    for c in _comparisons(res):
        assert c.status == "ok", c.error
        assert c.verdict == "diverged"
        assert c.first_divergence == megatrondumps.CHANGED_MODULE
        assert c.first_divergence_target is not None
        assert ".decoder.layers.1.mlp.linear_fc2." in c.first_divergence_target
