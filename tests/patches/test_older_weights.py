"""The dumped training forward at the weights the rollout used (``patches/hooks/training/older_weights.py``).

verl's real FSDP engine on CPU, patched with the set's series (``bench/support/fsdp_driver.py``,
``VC_TEST_VERSIONS=1``): sync 0, old log-probs of four requests rolled out at version 0, one real
actor update, sync 1, old log-probs of the same batch with requests 0-1 rolled out at version 0
(stale) and 2-3 at version 1, micro batch 4 (one packed micro batch), full responses (ride-along).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.patches.test_training_fsdp import _drive, _msprobe_config, _records, _stats
from verl_consistency.contracts import records

pytestmark = [pytest.mark.timeout(300), pytest.mark.pinset]

RUN = "fully-async-20261206-000000-aaaa"
COMMON = {"VC_TEST_VERSIONS": "1", "VC_TEST_TRIM": "none", "VC_TEST_MICRO": "4", "DUMP_PHASE": "log_prob"}


def _run(root: Path, work: Path, tmp: Path, *, dump: bool, **env: str) -> tuple[dict[str, Any], Path]:
    run_dir = tmp / RUN
    extra = dict(COMMON, **env)
    if dump:
        cfg = _msprobe_config(tmp / "msprobe_actor.json", tmp / "unused")
        extra.update(
            DUMP_ON="1", VERL_CONSISTENCY_ACTOR_CONFIG=str(cfg), VERL_CONSISTENCY_RUN_DIR=str(run_dir)
        )
    report = _drive(root, work, **extra)
    assert report["error"] is None
    assert report["finite"]
    return report, run_dir


def _lane_dump(run_dir: Path, rec: records.UpdateActorRecord, request_id: str) -> Path:
    assert rec.lane_request_ids is not None
    k = rec.lane_request_ids.index(request_id)
    (found,) = (run_dir / rec.dump_path / f"step{rec.step}").glob(f"*/req{k}/dump.json")
    return found


@pytest.fixture(scope="module")
def runs(root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], Path]]:
    work = tmp_path_factory.mktemp("versions-work")
    # one dumped run of both phases serves the log_prob tests too (their records filtered by phase):
    # each run is a real verl FSDP engine in its own process, ~25 s of CI's CPU
    return {
        "plain": _run(root, work, tmp_path_factory.mktemp("plain"), dump=False),
        "keep0": _run(
            root, work, tmp_path_factory.mktemp("keep0"), dump=True, VERL_CONSISTENCY_KEEP_VERSIONS="0"
        ),
        "all": _run(root, work, tmp_path_factory.mktemp("all"), dump=True, DUMP_PHASE="all"),
    }


def _log_prob_records(run_dir: Path) -> list[records.UpdateActorRecord]:
    return [r for r in _records(run_dir) if r.phase == "log_prob"]


def test_stale_requests_are_dumped_by_a_forward_at_their_rollouts_weights(runs: dict) -> None:
    report, run_dir = runs["all"]
    ids = report["request_ids"]
    first, inline, replay = _log_prob_records(run_dir)[:3]  # the third pass (after the 2nd update) follows
    # sync 0: one packed micro batch, every request a lane, at version 0
    assert (first.lane_request_ids, first.weight_version, first.trainer_weight_version) == (ids, 0, None)
    # sync 1: the requests of version 1 in verl's own forward; the stale two in a second one at version 0
    assert inline.lane_request_ids == ids[2:]
    assert inline.lanes_elsewhere == ids[:2]
    assert (inline.weight_version, inline.trainer_weight_version) == (1, None)
    assert replay.lane_request_ids == ids[:2]
    assert replay.lanes_elsewhere == ids[2:]
    assert (replay.weight_version, replay.trainer_weight_version, replay.unsynced_updates) == (0, 1, 0)
    assert replay.request_ids == ids
    assert replay.step == inline.step + 1
    assert report["grad_norm"] > 0
    for rid in ids[:2]:
        # the same micro batch at the same weights: the very same statistics, to the bit
        assert _stats(_lane_dump(run_dir, replay, rid)) == _stats(_lane_dump(run_dir, first, rid))
    for rid in ids[2:]:
        # ... while the weights of version 1 moved: the same request's statistics differ
        assert _stats(_lane_dump(run_dir, inline, rid)) != _stats(_lane_dump(run_dir, first, rid))


def test_verls_own_log_probs_are_the_same_bits_with_the_replay(runs: dict) -> None:
    dumped, plain = runs["all"][0], runs["plain"][0]
    assert dumped["second_log_probs"] == plain["second_log_probs"]
    assert dumped["grad_norm"] == plain["grad_norm"]


def test_keep_versions_zero_dumps_every_request_at_the_trainers_weights(runs: dict) -> None:
    report, run_dir = runs["keep0"]
    _first, second = _log_prob_records(run_dir)[:2]
    assert second.lane_request_ids == report["request_ids"]
    assert second.lanes_elsewhere is None
    assert (second.weight_version, second.trainer_weight_version) == (1, None)
    assert report["second_log_probs"] == runs["plain"][0]["second_log_probs"]


def test_the_records_are_the_contracts(runs: dict) -> None:
    _, run_dir = runs["all"]
    (log,) = (run_dir / "actor").glob(f"*/{records.UPDATE_ACTOR_LOG}")
    raw = [r for r in map(json.loads, log.read_text().splitlines()) if r["phase"] == "log_prob"]
    assert "trainer_weight_version" not in raw[1]
    assert raw[2]["trainer_weight_version"] == 1


def test_an_update_dumps_its_stale_requests_after_verls_backward_and_trains_the_same(runs: dict) -> None:
    """DUMP_PHASE=all: the second update (version 1) replays a and b at version 0 after its backward;
    its grad norm and the weights it leaves (the log-probs after it) are the undumped run's bits."""
    report, run_dir = runs["all"]
    ids = report["request_ids"]
    recs = _records(run_dir)
    updates = [r for r in recs if r.phase == "update_actor"]
    replayed = [r for r in updates if r.trainer_weight_version is not None]
    assert [(r.lane_request_ids, r.weight_version, r.trainer_weight_version) for r in replayed] == [
        (ids[:2], 0, 1)
    ]
    plain = runs["plain"][0]
    assert report["second_grad_norm"] == plain["second_grad_norm"]
    assert report["after_log_probs"] == plain["after_log_probs"]
