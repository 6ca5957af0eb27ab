"""verl 0.9.1's real Megatron training dumps (the ``next`` pin set) through pair -> compare -> report.

The training side is what verl 0.9.1's Megatron engine, patched with
``patches/next/verl/0003-megatron-training-dump.patch``, wrote on an H200 (committed in
``fixtures/megatron-h200-next/``; see its meta.json and ``bench/megatron_h200.sh``); the request
ids reached the engine only inside each row's ``extra_fields`` dict, as verl 0.9.1's V1 data path
hands them over. The inference side is the vLLM-layout stand-in loaded with the weights that engine
exported for vLLM (:mod:`tests.postprocess.megatrondumps`). The tests read committed files only, so
they hold on either pin set. Pairing and compare run on this fixture in test_compare_megatron.py
(parametrized over both engines); here is what only verl 0.9.1's dump shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.postprocess import megatrondumps
from verl_consistency.contracts import records

pytestmark = pytest.mark.msprobe

FIXTURE = megatrondumps.FIXTURE_NEXT
EMBEDDING = "Module.module.module.embedding.word_embeddings.VocabParallelEmbedding.forward.0"


def _records(log: Path) -> list[records.UpdateActorRecord]:
    return [records.UpdateActorRecord.model_validate_json(x) for x in log.read_text().splitlines()]


def _data(dump: Path) -> dict[str, Any]:
    return json.loads(dump.read_text())["data"]


def test_fixture_is_verl_091_megatron_engine_dump() -> None:
    """One dump per forward_step, Megatron's module tree, the ids (and the resumed id) from extra_fields."""
    info = megatrondumps.meta(FIXTURE)
    assert "verl 0.9.1" in info["hardware"]
    (log,) = FIXTURE.glob(f"actor/*/{records.UPDATE_ACTOR_LOG}")
    recs = _records(log)
    ids = list(info["prompts"])
    assert [r.request_ids for r in recs] == [[i] for i in ids]
    assert {(r.backend, r.phase, r.rank, r.num_requests) for r in recs} == {("megatron", "log_prob", 0, 1)}
    assert [r.step for r in recs] == [0, 1, 2, 3]
    # sample 0 was resumed once (the driver's rollout batch): both vLLM ids came through extra_fields
    first = json.loads(log.read_text().splitlines()[0])
    assert len(first["request_ids_all"][0]) == 2
    assert first["request_ids_all"][0][0] == ids[0]
    for rec, tokens in zip(recs, info["prompts"].values(), strict=True):
        (dump,) = (log.parent / f"step{rec.step}").glob("*/dump.json")
        data = _data(dump)
        assert data[EMBEDDING]["output"][0]["shape"] == [1, len(tokens), 32], "the micro batch is its prompt"
        assert "Module.module.module.decoder.layers.1.mlp.linear_fc2.RowParallelLinear.forward.0" in data
        assert not [k for k in data if ".backward." in k], "Megatron's dump holds the forward only"


def test_update_actor_phase_dumped_the_same_modules() -> None:
    recs = _records(FIXTURE / "update-phase" / records.UPDATE_ACTOR_LOG)
    ids = list(megatrondumps.meta(FIXTURE)["prompts"])
    assert [(r.phase, r.step, r.request_ids) for r in recs] == [
        ("update_actor", 4 + i, [rid]) for i, rid in enumerate(ids)
    ]
    update = _data(FIXTURE / "update-phase" / "step4" / "rank0" / "dump.json")
    (log_prob,) = FIXTURE.glob("actor/*/step0/rank0/dump.json")
    assert set(update) == set(_data(log_prob))
    assert not [k for k in update if ".backward." in k]


def test_same_engine_output_as_verl_080() -> None:
    """Same seeds, model, prompts and megatron-core: 0.9.1's dumps and exported weights are 0.8.0's."""
    for step in range(4):
        (old,) = megatrondumps.FIXTURE.glob(f"actor/*/step{step}/rank0/dump.json")
        (new,) = FIXTURE.glob(f"actor/*/step{step}/rank0/dump.json")
        assert _data(new) == _data(old), f"step {step}"
    assert megatrondumps.meta(FIXTURE)["prompts"] == megatrondumps.meta()["prompts"]


def test_default_bshd_padding_puts_pad_tokens_into_the_statistics() -> None:
    """verl 0.9.1's default pad_bshd_to_minibatch_max pads the 3-token request to the batch's 6."""
    (rec,) = _records(FIXTURE / "padmax" / records.UPDATE_ACTOR_LOG)
    rid = rec.request_ids[0]
    assert len(megatrondumps.meta(FIXTURE)["prompts"][rid]) == 3
    padded = _data(FIXTURE / "padmax" / f"step{rec.step}" / "rank0" / "dump.json")
    (plain,) = FIXTURE.glob(f"actor/*/step{rec.step}/rank0/dump.json")
    assert padded[EMBEDDING]["output"][0]["shape"] == [1, 6, 32]
    assert padded[EMBEDDING]["input_args"][0]["Min"] == 0, "the pad token id"
    assert padded[EMBEDDING]["output"][0] != _data(plain)[EMBEDDING]["output"][0]
