"""Weight versions: a prefill pairs only with a micro batch that ran the same weights.

Run folders built in code (``pairing_trees``), paired by the real ``pair_run``; the summary and
the report are the real ones. The property test (``test_pairing_property.py``) checks the same
rule on random runs against its oracle.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from verl_consistency.postprocess.output.bundle_manifest import PairingSummary
from verl_consistency.postprocess.output.report import write_report
from verl_consistency.postprocess.pairing.discover import Roots
from verl_consistency.postprocess.pairing.pair import pair_run
from verl_consistency.postprocess.pairing.pair_types import UnpairedReason as R
from verl_consistency.postprocess.pairing.reasons import MEANING

from .pairing_trees import RunTree, req, vid

REPO = Path(__file__).resolve().parents[2]


def _pair(tree: RunTree):
    return pair_run(Roots.open(tree.run_dir, **tree.roots_args()))


def _counts(res) -> dict[str, dict[str, int]]:
    """The tally without the reasons counted zero times."""
    return {s: {r: n for r, n in by.items() if n} for s, by in res.counts.items() if any(by.values())}


def _requests(res) -> dict[str, tuple[R, str]]:
    return {u.ref: (u.reason, u.detail) for u in res.unpaired if u.subject == "request"}


def test_equal_versions_pair(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("a"))], weight_version=3)
    t.actor_step(2, 0, 0, ["a"], weight_version=3)
    res = _pair(t)
    assert [p.request_id for p in res.pairs] == ["a"]
    assert res.unpaired == []


def test_different_versions_are_weights_differ_naming_both(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("stale"))], weight_version=3)
    t.actor_step(2, 0, 0, ["stale"], weight_version=4)
    t.rollout_step(1, 0, 1, [req(vid("fresh"))], weight_version=4)
    t.actor_step(2, 0, 1, ["fresh"], weight_version=4)
    res = _pair(t)
    assert [p.request_id for p in res.pairs] == ["fresh"]
    assert _requests(res) == {
        "stale": (
            R.WEIGHTS_DIFFER,
            "vLLM computed with weights of step 3, the trainer's forward was at step 4",
        )
    }
    # the request's verdict alone: its steps are not counted a second time
    assert _counts(res) == {"request": {"weights_differ": 1}}
    assert (res.requests_seen, res.requests_paired, res.requests_unpaired) == (2, 1, 1)


def test_several_versions_on_a_side_are_all_named(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("s"))], weight_version=5)
    t.actor_step(2, 0, 0, ["s"], weight_version=7, phase="log_prob")
    t.actor_step(2, 0, 1, ["s"], weight_version=6, phase="update_actor")
    res = _pair(t)
    assert res.pairs == []
    assert _requests(res)["s"] == (
        R.WEIGHTS_DIFFER,
        "vLLM computed with weights of step 5, the trainer's forward was at steps 6, 7",
    )


@pytest.mark.parametrize(
    ("rollout", "actor"),
    [(None, None), (None, 4), (3, None)],
    ids=["neither-side", "vllm-unknown", "trainer-unknown"],
)
def test_an_unknown_version_pairs_as_before(tmp_path, rollout, actor):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("a"))], weight_version=rollout)
    t.actor_step(2, 0, 0, ["a"], weight_version=actor)
    res = _pair(t)
    assert [p.request_id for p in res.pairs] == ["a"]
    assert res.unpaired == []


def test_the_recipes_format_has_no_versions_and_pairs_as_before(tmp_path):
    t = RunTree(tmp_path, recipe=True)
    t.rollout_step(1, 0, 0, [req("r1")])
    t.actor_step(2, 0, 0, ["r1"])
    res = _pair(t)
    assert [p.request_id for p in res.pairs] == ["r1"]


def test_the_prefill_of_the_trainers_version_pairs_and_the_other_is_set_aside(tmp_path):
    """The same request prefilled twice (a retry, or resumed after a sync), with the weights of
    steps 3 and 4, and trained at step 4: the step-4 prefill pairs, though it came second."""
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("r", suffix="11111111"))], weight_version=3)
    t.rollout_step(1, 0, 1, [req(vid("r", suffix="22222222"))], weight_version=4)
    t.actor_step(2, 0, 0, ["r"], weight_version=4)
    res = _pair(t)
    (p,) = res.pairs
    assert p.rollout.dir == "rollout/1/step1/rank0"
    (aside,) = [u for u in res.unpaired if u.subject == "rollout_step"]
    assert aside.reason is R.WEIGHTS_DIFFER
    assert aside.ref.endswith("dispatch_log.jsonl:1")
    assert aside.detail == "vLLM computed it with weights of step 3; the request pairs at step 4"
    assert _counts(res) == {"rollout_step": {"weights_differ": 1}}


def test_the_version_rule_comes_before_log_prob_first(tmp_path):
    """log_prob wins among micro batches of the same weights only: here the log_prob forward ran
    later weights than vLLM, the update_actor forward the same ones."""
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("x"))], weight_version=3)
    t.actor_step(2, 0, 0, ["x"], phase="log_prob", weight_version=4)
    t.actor_step(2, 0, 1, ["x"], phase="update_actor", weight_version=3)
    res = _pair(t)
    (p,) = res.pairs
    assert p.actor.dir == "actor/2/step1/rank0"
    (aside,) = [u for u in res.unpaired if u.subject == "actor_step"]
    assert aside.reason is R.WEIGHTS_DIFFER
    assert "forward ran with weights of step 4; the request pairs at step 3" in aside.detail


def test_the_lowest_version_both_sides_hold_pairs(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("y", suffix="11111111"))], weight_version=5)
    t.rollout_step(1, 0, 1, [req(vid("y", suffix="22222222"))], weight_version=4)
    t.actor_step(2, 0, 0, ["y"], weight_version=5)
    t.actor_step(2, 0, 1, ["y"], weight_version=4)
    t.actor_step(2, 0, 2, ["y"], weight_version=2)
    res = _pair(t)
    (p,) = res.pairs
    assert (p.rollout.dir, p.actor.dir) == ("rollout/1/step1/rank0", "actor/2/step1/rank0")
    assert _counts(res) == {"rollout_step": {"weights_differ": 1}, "actor_step": {"weights_differ": 2}}


def test_a_forward_after_an_unsynced_update_never_pairs(tmp_path):
    """update_actor's second mini-batch runs weights one optimizer step past sync 3: vLLM never
    held them, even though the next sync may carry label 4 after more updates."""
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("a"))], weight_version=3)
    t.rollout_step(1, 0, 1, [req(vid("b"))], weight_version=4)
    t.actor_step(2, 0, 0, ["a"], weight_version=3, phase="update_actor")
    t.actor_step(2, 0, 1, ["b"], weight_version=3, unsynced_updates=1, phase="update_actor")
    res = _pair(t)
    assert [p.request_id for p in res.pairs] == ["a"]
    assert _requests(res) == {
        "b": (
            R.WEIGHTS_DIFFER,
            "vLLM computed with weights of step 4, the trainer's forward was at "
            "step 3 + 1 optimizer step not synced to vLLM",
        )
    }


def test_an_unsynced_forward_is_set_aside_when_vllm_has_no_version(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("a"))])
    t.actor_step(2, 0, 0, ["a"], weight_version=0, unsynced_updates=2, phase="update_actor")
    t.actor_step(2, 0, 1, ["a"], weight_version=0, phase="log_prob")
    res = _pair(t)
    (p,) = res.pairs
    assert p.actor.dir == "actor/2/step1/rank0"
    (aside,) = [u for u in res.unpaired if u.subject == "actor_step"]
    assert aside.reason is R.WEIGHTS_DIFFER
    assert aside.detail == (
        "the trainer's forward ran with weights of step 0 + 2 optimizer steps not synced to vLLM"
    )


@pytest.mark.parametrize("bad", ["-1", '"1"', "true", "1.5"])
def test_unsynced_updates_that_is_not_a_count_is_a_bad_line(tmp_path, bad):
    t = RunTree(tmp_path)
    act = t.actor_root / "2" / "update_actor_log.jsonl"
    act.parent.mkdir(parents=True, exist_ok=True)
    act.write_text(f'{{"pid": 2, "rank": 0, "step": 0, "request_ids": ["b"], "unsynced_updates": {bad}}}\n')
    res = _pair(t)
    (u,) = [u for u in res.unpaired if u.reason is R.BAD_LOG_LINE]
    assert "unsynced_updates must be a non-negative integer" in u.detail


@pytest.mark.parametrize("bad", ['"3"', "true", "3.0", "[3]"])
def test_a_version_that_is_not_an_integer_is_a_bad_line(tmp_path, bad):
    t = RunTree(tmp_path)
    roll = t.rollout_root / "1" / "dispatch_log.jsonl"
    act = t.actor_root / "2" / "update_actor_log.jsonl"
    for path, line in (
        (
            roll,
            '{"pid": 1, "rank": 0, "step": 0, "phase": "prefill", "weight_version": %s, '
            '"requests": [{"request_id": "b", "type": "new", "tokens": 2}]}',
        ),
        (act, '{"pid": 2, "rank": 0, "step": 0, "request_ids": ["b"], "weight_version": %s}'),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line % bad + "\n")
    res = _pair(t)
    assert res.pairs == []
    bad_lines = [u for u in res.unpaired if u.reason is R.BAD_LOG_LINE]
    assert sorted(u.ref for u in bad_lines) == [
        "actor/2/update_actor_log.jsonl:1",
        "rollout/1/dispatch_log.jsonl:1",
    ]
    assert all("weight_version must be an integer" in u.detail for u in bad_lines)


def _stale_and_fresh(t: RunTree, **replay: object) -> None:
    """Step 2 of a fully-async run: a, b rolled out at version 0, c, d at version 1; the trainer at 1
    dumps c, d in its own forward and a, b in a second one at version 0 (hooks/training/older_weights.py)."""
    for k, (rid, v) in enumerate((("a", 0), ("b", 0), ("c", 1), ("d", 1))):
        t.rollout_step(1, 0, k, [req(vid(rid))], weight_version=v)
    ids = ["a", "b", "c", "d"]
    t.actor_step(2, 0, 0, ids, weight_version=1, lanes=["c", "d"], lanes_elsewhere=["a", "b"])
    t.actor_step(2, 0, 1, ids, weight_version=0, lanes=["a", "b"], lanes_elsewhere=["c", "d"], **replay)


def test_a_stale_request_pairs_with_the_forward_at_its_rollouts_weights(tmp_path):
    t = RunTree(tmp_path)
    _stale_and_fresh(t, trainer_weight_version=1)
    res = _pair(t)
    assert res.unpaired == [], "lanes named elsewhere are not a mixed micro batch"
    got = {p.request_id: (p.weight_version, p.trainer_weight_version) for p in res.pairs}
    assert got == {"a": (0, 1), "b": (0, 1), "c": (1, None), "d": (1, None)}


@pytest.mark.parametrize(
    ("field", "bad", "says"),
    [
        ("lanes_elsewhere", ["c"], "lanes_elsewhere must name request_ids without a lane"),
        ("lanes_elsewhere", ["zz"], "lanes_elsewhere must name request_ids without a lane"),
        ("lanes_elsewhere", "a", "lanes_elsewhere must be a list of strings"),
        ("trainer_weight_version", "1", "trainer_weight_version must be an integer"),
    ],
)
def test_a_bad_replay_field_is_a_bad_line(tmp_path, field, bad, says):
    t = RunTree(tmp_path)
    act = t.actor_root / "2" / "update_actor_log.jsonl"
    act.parent.mkdir(parents=True, exist_ok=True)
    rec = {"pid": 2, "rank": 0, "step": 0, "request_ids": ["a", "c"], "lane_request_ids": ["c"], field: bad}
    act.write_text(json.dumps(rec) + "\n")
    res = _pair(t)
    (u,) = [u for u in res.unpaired if u.reason is R.BAD_LOG_LINE]
    assert says in u.detail


def test_the_summary_and_the_report_show_weights_differ_with_its_meaning(tmp_path):
    t = RunTree(tmp_path / "run")
    t.rollout_step(1, 0, 0, [req(vid("stale"))], weight_version=3)
    t.actor_step(2, 0, 0, ["stale"], weight_version=4)
    res = _pair(t)
    summary = PairingSummary.of(res)
    assert summary.unpaired_counts["request"]["weights_differ"] == 1
    assert (summary.requests_seen, summary.requests_unpaired, summary.pairs) == (1, 1, 0)

    html, md = write_report(
        tmp_path / "out",
        run_id="versions",
        pairs=res.pairs,
        unpaired=res.unpaired,
        comparisons=[],
        unpaired_counts=res.counts,
    )
    meaning = MEANING[R.WEIGHTS_DIFFER]
    assert f"| `weights_differ` | 1 | {meaning} |" in md.read_text()
    page = html.read_text()
    assert re.search(
        r"<td><code>weights_differ</code></td><td class=\"num\">1</td><td>[^<]*<code>weight_version</code>",
        page,
    )
    assert "vLLM computed with weights of step 3, the trainer&#39;s forward was at step 4" in page


def test_every_reason_has_a_meaning_and_the_readme_says_the_same():
    """The report's meaning column and postprocess/README.md's "Reasons" table, word for word."""
    text = (REPO / "postprocess" / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| [^|]+ \| (.+) \|$", text, re.M))
    assert set(MEANING) == set(R)
    assert {r.value: MEANING[r] for r in R} == rows
