"""Request-id threading through the patched real verl clients, on a local Ray.

``test_verl_request_id_driver.py`` runs in a subprocess with the patched verl first on
``sys.path``; only the vLLM server is a stand-in (``StandInVLLMServer``).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.verl_support import patched_verl, run_patched
from verl_consistency.patches.hooks import request_ids

DRIVER = Path(__file__).with_name("test_verl_request_id_driver.py")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return patched_verl(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def report(root: Path) -> dict[str, Any]:
    out = run_patched(
        root, f"import runpy; runpy.run_path({str(DRIVER)!r}, run_name='__main__')", timeout=280
    )
    line = next(x for x in out.splitlines() if x.startswith("VC_REPORT "))
    return json.loads(line.removeprefix("VC_REPORT "))


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
    assert fa["extra_fields"]["max_global_steps"] == 3


def test_ids_reach_the_dataproto_and_the_engine_tensordict(report: dict[str, Any]) -> None:
    hybrid_id = report["hybrid"]["server_saw"][0][0]
    fa_first, fa_second = (x[0] for x in report["fully_async"]["server_saw"])
    expected_first = [hybrid_id, fa_first]
    expected_all = [[hybrid_id], [fa_first, fa_second]]
    assert report["non_tensor_batch"] == {"request_id": expected_first, "request_ids_all": expected_all}
    assert report["tensordict"] == {"request_id": expected_first, "request_ids_all": expected_all}


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
