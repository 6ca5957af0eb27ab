"""Request-id threading through the patched real verl clients, on a local Ray (both pin sets).

``request_id_driver.py`` runs in a subprocess with the patched verl of the set in force
first on ``sys.path`` (fixture ``verl_driver_report`` in ``conftest.py``); only the vLLM server is
a stand-in (``StandInVLLMServer``). On verl 0.8.0 the ids go on through ``AgentLoopWorker._postprocess``
to a ``DataProto``; on verl 0.9.1 through the V1 trainer's TransferQueue path to the engines'
micro batches.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from verl_consistency.contracts import capture, pins
from verl_consistency.contracts import token_records as tr
from verl_consistency.patches.hooks.rollout import request_ids

pytestmark = [pytest.mark.timeout(300), pytest.mark.pinset]

V1 = pins.get("set.name") == "next"
"""The next set pins verl 0.9.1, whose default trainer is V1 (TransferQueue)."""


@pytest.fixture(scope="module")
def report(verl_driver_report: dict[str, Any]) -> dict[str, Any]:
    assert verl_driver_report["verl"] == pins.get("upstream.verl")
    return verl_driver_report


def test_hybrid_client_tags_the_id_it_sent(report: dict[str, Any]) -> None:
    hybrid = report["hybrid"]
    ((sent, prompt_len),) = hybrid["server_saw"]
    assert prompt_len == 5
    assert hybrid["extra_fields"]["request_id"] == sent
    assert hybrid["extra_fields"]["request_ids_all"] == [sent]
    assert hybrid["extra_fields"]["global_steps"] == 3, "upstream's own extra_fields are kept"


def test_fully_async_resume_keeps_the_first_id_and_lists_all(report: dict[str, Any]) -> None:
    fa = report["fully_async"]
    (first, first_len), (second, second_len) = fa["server_saw"]
    assert (first_len, second_len) == (5, 7), "the stand-in aborted once; the client resumed with 2 tokens"
    assert first != second
    assert fa["token_ids"] == [11, 12, 13, 14]
    assert fa["extra_fields"]["request_id"] == first, "the prompt-only prefill's id wins (recipe: last won)"
    assert fa["extra_fields"]["request_ids_all"] == [first, second]
    assert (fa["extra_fields"]["min_global_steps"], fa["extra_fields"]["max_global_steps"]) == (3, 4)
    # each generate call's weights and where its tokens begin: 2 tokens at version 3, the rest at 4
    assert fa["extra_fields"][tr.CALL_VERSIONS] == [3, 4]
    assert fa["extra_fields"][tr.CALL_OFFSETS] == [0, 2]
    one = report["hybrid"]["extra_fields"]
    assert (one[tr.CALL_VERSIONS], one[tr.CALL_OFFSETS]) == ([3], [0])


def _expected(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    hybrid_id = report["hybrid"]["server_saw"][0][0]
    fa_first, fa_second = (x[0] for x in report["fully_async"]["server_saw"])
    return [hybrid_id, fa_first], [[hybrid_id], [fa_first, fa_second]]


@pytest.mark.skipif(V1, reason="verl 0.8.0's DataProto path; verl 0.9.1's V1 path is tested below")
def test_ids_reach_the_dataproto_and_the_engine_tensordict(report: dict[str, Any]) -> None:
    first, every = _expected(report)
    assert report["non_tensor_batch"] == {"request_id": first, "request_ids_all": every}
    assert report["tensordict"] == {"request_id": first, "request_ids_all": every}


@pytest.mark.skipif(not V1, reason="verl 0.9.1's V1 trainer (TransferQueue)")
def test_v1_ids_reach_the_workers_fields_and_the_engines_micro_batches(report: dict[str, Any]) -> None:
    """AgentLoopWorkerTQ -> TransferQueue -> what tqbridge hands compute_log_prob -> micro batches."""
    first, every = _expected(report)
    v1 = report["v1"]
    assert v1["is_padding"] == [False, False, True, True], "verl padded 2 samples up to a multiple of 4"
    fields = v1["worker_fields"]
    assert fields["request_id"][:2] == first
    assert fields["request_ids_all"][:2] == every
    assert fields["extra_fields_request_id"][:2] == first, "upstream's extra_fields dict is kept as it was"
    assert v1["micro_batches"][:2] == [[first[0]], [first[1]]]


@pytest.mark.skipif(not V1, reason="verl 0.9.1's synthetic padding samples (padding_utils)")
def test_v1_padding_samples_carry_no_request_id(report: dict[str, Any]) -> None:
    """Upstream copies the first real sample into each padding sample; its id must not come along."""
    v1 = report["v1"]
    assert v1["worker_fields"]["request_id"][2:] == ["", ""]
    assert v1["worker_fields"]["request_ids_all"][2:] == [[], []]
    assert v1["worker_fields"]["extra_fields_request_id"][2:] == [None, None]
    assert v1["micro_batches"][2:] == [[""], [""]]


def test_capture_marks_the_listed_prompts_id_in_the_real_client(report: dict[str, Any]) -> None:
    got = report["capture"]
    assert got["listed"].startswith(capture.CAPTURED_PREFIX)
    assert len(got["listed"]) == 32
    assert not got["unlisted"].startswith(capture.CAPTURED_PREFIX)
    assert len(got["unlisted"]) == 32
    if V1:  # rollout.full_determinism passes the caller's id through (verl 0.9's _vllm_request_id)
        assert got["deterministic_listed"] == capture.CAPTURED_PREFIX + "trajectory-0"
        assert got["deterministic_unlisted"] == "trajectory-0"


def test_tool_loop_later_turns_append_their_ids() -> None:
    """What the patched ToolAgentLoop does per turn: first turn copied by upstream, later turns merged."""
    agent: dict[str, Any] = {}
    turn1: dict[str, Any] = {}
    request_ids.tag_output(turn1, "t1")
    agent.update(turn1)  # upstream: `if not agent_data.extra_fields: agent_data.extra_fields.update(...)`
    for rid in ("t2", "t3"):
        turn: dict[str, Any] = {}
        request_ids.tag_output(turn, rid)
        request_ids.merge_turn(agent, turn)
    assert agent["request_id"] == "t1"
    assert agent["request_ids_all"] == ["t1", "t2", "t3"]


def test_lift_fields_always_sets_both_fields() -> None:
    """TransferQueue refuses a batch where some samples lack a field, so a sample never lacks one."""
    tagged = {"extra_fields": {"request_id": "a", "request_ids_all": ["a", "b"]}}
    request_ids.lift_fields(tagged)
    assert (tagged["request_id"], tagged["request_ids_all"]) == ("a", ["a", "b"])
    bare: dict[str, Any] = {"extra_fields": {}}
    request_ids.lift_fields(bare)
    assert (bare["request_id"], bare["request_ids_all"]) == ("", [])


def test_patched_tool_loop_merges_only_on_later_turns(root: Path) -> None:
    src = (root / "verl/experimental/agent_loop/tool_agent_loop.py").read_text()
    tree = ast.parse(src)
    branches = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "not agent_data.extra_fields"
    ]
    assert len(branches) == 1
    body = ast.unparse(ast.Module(body=branches[0].body, type_ignores=[]))
    orelse = ast.unparse(ast.Module(body=branches[0].orelse, type_ignores=[]))
    assert "merge_turn" not in body
    assert "request_ids.merge_turn(agent_data.extra_fields, output.extra_fields)" in orelse
