"""Pairing on run folders built in code: every rule of pairing.py, and every reason it reports."""

from __future__ import annotations

from collections import Counter

import pytest

from verl_consistency.postprocess.pairing.discover import Roots
from verl_consistency.postprocess.pairing.pair import pair_run
from verl_consistency.postprocess.pairing.pair_types import UnpairedReason as R

from .pairing_trees import RunTree, req, vid


def _pair(tree: RunTree):
    return pair_run(Roots.open(tree.run_dir, **tree.roots_args()))


def _reasons(result, subject: str | None = None) -> Counter:
    return Counter(u.reason for u in result.unpaired if subject is None or u.subject == subject)


def test_one_request_prefill_pairs_with_its_micro_batch(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(100, 0, 0, [req(vid("aaa"), 12)])
    t.rollout_step(100, 0, 1, [req(vid("aaa"), 1, type="cached")], phase="decode")
    t.actor_step(200, 0, 0, ["aaa"])
    res = _pair(t)
    (p,) = res.pairs
    assert p.pair_id == "aaa.r0.a0"
    assert (p.request_id, p.vllm_request_id, p.prompt_tokens) == ("aaa", vid("aaa"), 12)
    assert p.rollout.dir == "rollout/100/step0/rank0"
    assert p.actor.dir == "actor/200/step0/rank0"
    assert (t.run_dir / p.rollout.dir / "dump.json").is_file()
    assert not p.scoped
    assert p.task == "statistics"
    assert res.counts["rollout_step"] == {"decode_only": 1}
    assert (res.dispatch_records, res.actor_records) == (2, 1)


def test_every_unusable_step_gets_its_reason(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("multi1")), req(vid("multi2"))])
    t.rollout_step(1, 0, 1, [req(vid("chunk"), 8, prompt=20)])
    t.rollout_step(1, 0, 2, [req(vid("chunk"), 12, type="cached")])
    t.rollout_step(1, 0, 3, [req(vid("hit"), 4, prompt=10, computed=6)])  # as vLLM logs a cache hit
    t.rollout_step(1, 0, 4, [req(vid("skipped"))], dumped=False)
    t.rollout_step(1, 0, 5, [req(vid("spec"))], attn_state="SpecDecoding")
    t.rollout_step(1, 0, 6, [req(vid("cachestate"))], attn_state="PrefillCacheHit")
    t.rollout_step(1, 0, 7, [req(vid("lonely"))])
    t.rollout_step(1, 0, 8, [req(vid("crowded"))])
    for step, rid in enumerate(["multi1", "chunk", "hit", "skipped", "cachestate", "ghost"]):
        t.actor_step(2, 0, step, [rid])
    t.actor_step(2, 0, 10, ["crowded", "other"])
    res = _pair(t)
    assert res.pairs == []
    assert res.counts["rollout_step"] == {
        "multi_request_step": 1,
        "chunked_prefill": 2,
        "prefix_cache_hit": 2,
        "not_dumped": 1,
        "spec_decoding": 1,
    }
    by_req = {u.ref: u.reason for u in res.unpaired if u.subject == "request"}
    assert by_req == {
        "multi1": R.MULTI_REQUEST_STEP,
        "multi2": R.MULTI_REQUEST_STEP,
        "spec": R.SPEC_DECODING,
        "other": R.NO_ROLLOUT_PREFILL,
        "chunk": R.CHUNKED_PREFILL,
        "hit": R.PREFIX_CACHE_HIT,
        "skipped": R.NOT_DUMPED,
        "cachestate": R.PREFIX_CACHE_HIT,
        "ghost": R.NO_ROLLOUT_PREFILL,
        "lonely": R.NO_TRAINING_MICRO_BATCH,
        "crowded": R.MULTI_REQUEST_MICRO_BATCH,
    }
    assert res.counts["actor_step"] == {"multi_request_micro_batch": 1}
    detail = next(u.detail for u in res.unpaired if u.ref == "multi1")
    assert "rollout/1/dispatch_log.jsonl:1" in detail


def test_a_step_with_dumped_false_is_counted_but_never_located(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("x"))], dumped=False)
    t.write_dump(t.rollout_root / "1" / "step0" / "rank0")  # a stale folder must not be picked up
    t.actor_step(2, 0, 0, ["x"])
    res = _pair(t)
    assert res.pairs == []
    assert res.counts["rollout_step"] == {"not_dumped": 1}


def test_tp_ranks_pair_rank_with_rank_when_sharding_matches(tmp_path):
    """vLLM TP=2 (two worker pids) against Megatron TP=2 on global ranks 2 and 3."""
    t = RunTree(tmp_path)
    for pid, rank in ((101, 0), (102, 1)):
        t.rollout_step(pid, rank, 5, [req(vid("tp"))])
        t.rollout_step(pid, rank, 6, [req(vid("tp"), 1, type="cached")], phase="decode")
    for pid, rank in ((203, 3), (202, 2)):
        t.actor_step(pid, rank, 0, ["tp"], backend="megatron")
    res = _pair(t)
    assert sorted(p.pair_id for p in res.pairs) == ["tp.r0.a2", "tp.r1.a3"]
    assert {p.backend for p in res.pairs} == {"megatron"}
    assert {(p.rollout.pid, p.actor.pid) for p in res.pairs} == {(101, 202), (102, 203)}
    assert res.counts["rollout_step"] == {"decode_only": 2}


def test_tp_rollout_against_unsharded_fsdp_pairs_lowest_ranks_and_reports_the_rest(tmp_path):
    t = RunTree(tmp_path)
    for pid, rank in ((101, 0), (102, 1), (103, 2), (104, 3)):
        t.rollout_step(pid, rank, 0, [req(vid("r"))])
    t.actor_step(200, 0, 0, ["r"])
    res = _pair(t)
    (p,) = res.pairs
    assert (p.rollout.rank, p.actor.rank) == (0, 0)
    mism = [u for u in res.unpaired if u.reason is R.TP_SHARDING_MISMATCH]
    assert sorted(u.ref for u in mism) == [
        f"rollout/{pid}/step0/rank{r}" for pid, r in ((102, 1), (103, 2), (104, 3))
    ]
    assert "4 rank(s), training on 1" in mism[0].detail


def test_n_children_pair_the_lowest_child_and_report_siblings(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("par", 1, "aaaaaaaa"))])
    t.rollout_step(1, 0, 1, [req(vid("par", 0, "bbbbbbbb"))])
    t.rollout_step(1, 0, 2, [req(vid("par", 2, "cccccccc"), 8, prompt=16, computed=8)])
    t.actor_step(2, 0, 0, ["par"])
    res = _pair(t)
    (p,) = res.pairs
    assert p.vllm_request_id == "0_par-bbbbbbbb"
    assert p.pair_id == "par.c0.r0.a0"
    assert p.rollout.step == 1
    sib = [u for u in res.unpaired if u.reason is R.DUPLICATE_ID]
    assert [(u.subject, u.ref) for u in sib] == [("rollout_step", "rollout/1/dispatch_log.jsonl:1")]
    assert "sibling 1_par" in sib[0].detail
    assert res.counts["rollout_step"] == {"prefix_cache_hit": 1, "duplicate_id": 1}
    assert (res.requests_seen, res.requests_paired, res.requests_unpaired) == (1, 1, 0)


def test_repeated_micro_batches_prefer_log_prob_then_earliest(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("rep"))])
    t.actor_step(2, 0, 0, ["rep"], phase="update_actor", ts="2026-01-01T00:00:01")
    t.actor_step(2, 0, 1, ["rep"], phase="log_prob", ts="2026-01-01T00:00:09")
    t.actor_step(2, 0, 2, ["rep"], phase="log_prob", ts="2026-01-01T00:00:10")
    res = _pair(t)
    (p,) = res.pairs
    assert p.actor.step == 1
    rep = sorted(u.ref for u in res.unpaired if u.reason is R.REPEATED_MICRO_BATCH)
    assert rep == ["actor/2/step0/rank0", "actor/2/step2/rank0"]


def test_same_request_prefilled_twice_on_one_rank_is_a_duplicate(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 3, [req(vid("dup", suffix="11111111"))])
    t.rollout_step(9, 0, 4, [req(vid("dup", suffix="22222222"))])
    t.actor_step(2, 0, 0, ["dup"])
    res = _pair(t)
    (p,) = res.pairs
    assert p.rollout.pid == 1
    assert [u.ref for u in res.unpaired if u.reason is R.DUPLICATE_ID] == ["rollout/9/step4/rank0"]


def test_request_scoped_step_pairs_the_captured_request_only(tmp_path):
    t = RunTree(tmp_path)
    cap = vid("cap")
    t.rollout_step(
        1,
        0,
        0,
        [req(vid("other"), 30), req(cap, 12), req(vid("old"), 1, type="cached")],
        captured=cap,
        attn_state="ChunkedPrefill",
        task="tensor",
    )
    t.actor_step(2, 0, 0, ["cap"], task="tensor")
    t.actor_step(2, 0, 1, ["other"])
    res = _pair(t)
    (p,) = res.pairs
    assert (p.request_id, p.scoped, p.task, p.prompt_tokens) == ("cap", True, "tensor", 12)
    assert {u.ref: u.reason for u in res.unpaired if u.subject == "request"} == {
        "other": R.MULTI_REQUEST_STEP,
        "old": R.DECODE_ONLY,
    }


def test_a_scoped_capture_that_is_itself_a_chunk_does_not_pair(tmp_path):
    t = RunTree(tmp_path)
    cap = vid("cap")
    t.rollout_step(1, 0, 0, [req(vid("o"), 30), req(cap, 12, prompt=40)], captured=cap)
    t.actor_step(2, 0, 0, ["cap"])
    res = _pair(t)
    assert res.pairs == []
    assert {u.ref: u.reason for u in res.unpaired if u.subject == "request"} == {
        "cap": R.CHUNKED_PREFILL,
        "o": R.MULTI_REQUEST_STEP,
    }


def test_recipe_layout_made_by_hand(tmp_path):
    """Dumps made with the public recipe: no dump_path, actor steps under the actor root,
    msprobe's other rank-folder spellings, the recipe's step_N spelling."""
    t = RunTree(tmp_path, recipe=True)
    t.rollout_step(4242, 0, 0, [req(vid("r1"))], rank_folder="proc4242")
    t.rollout_step(4242, 0, 1, [req(vid("r2"))], rank_folder="rank", step_folder="step_1")
    t.rollout_step(4343, 1, 0, [req(vid("r3"))])
    t.actor_step(77, 0, 0, ["r1"], backend=None)
    t.actor_step(77, 0, 1, ["r2"], backend=None)
    t.actor_step(78, 1, 1, ["r3"], backend=None)  # same step number, another rank: rank1 folder
    res = _pair(t)
    got = {p.request_id: (p.rollout.dir, p.actor.dir, p.backend) for p in res.pairs}
    assert got == {
        "r1": ("rollout/4242/step0/proc4242", "actor/step0/rank0", "fsdp"),
        "r2": ("rollout/4242/step_1/rank", "actor/step1/rank0", "fsdp"),
        "r3": ("rollout/4343/step0/rank1", "actor/step1/rank1", "fsdp"),
    }
    assert not any(u.reason is R.DUMP_MISSING for u in res.unpaired)


def test_dump_path_in_the_record_wins_over_the_log_folder(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("moved"))], dump=False)
    t.write_dump(t.rollout_root / "elsewhere" / "step0" / "rank0", vllm=True)
    log = t.rollout_root / "1" / "dispatch_log.jsonl"
    log.write_text(log.read_text().replace('"rollout/1"', '"rollout/elsewhere"'))
    t.actor_step(2, 0, 0, ["moved"])
    (p,) = _pair(t).pairs
    assert p.rollout.dir == "rollout/elsewhere/step0/rank0"


@pytest.mark.parametrize("replicas", [1, 3])
def test_many_pids_and_ranks_mixed(tmp_path, replicas):
    """Several replicas of TP=2 and an FSDP trainer of 4 ranks; 1 request in 3 is pairable."""
    t = RunTree(tmp_path)
    expected = set()
    step = {}
    for n in range(24):
        base = f"{n:032x}"
        rep = n % replicas
        for rank in (0, 1):
            pid = 1000 + 10 * rep + rank
            s = step.setdefault(pid, 0)
            if n % 3 == 0:
                t.rollout_step(pid, rank, s, [req(vid(base))])
            else:
                t.rollout_step(pid, rank, s, [req(vid(base)), req(vid(f"{n:031x}z"))])
            t.rollout_step(pid, rank, s + 1, [req(vid(base), 1, type="cached")], phase="decode")
            step[pid] = s + 2
        arank = n % 4
        t.actor_step(2000 + arank, arank, n, [base])
        if n % 3 == 0:
            expected.add(f"{base}.r0.a{arank}")
    res = _pair(t)
    assert {p.pair_id for p in res.pairs} == expected
    assert res.counts["rollout_step"]["tp_sharding_mismatch"] == len(expected)
    assert res.counts["rollout_step"]["decode_only"] == 48
