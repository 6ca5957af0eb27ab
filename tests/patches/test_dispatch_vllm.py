"""The hook pieces only vLLM's own runner (``patches/current/vllm``) uses: set-up and the derived state.

The real engine drives both in ``tests/demo/``; here each rule is pinned on its own. The
scheduler output is a plain object with the fields the hook reads (``SchedulerOutputLike``);
the last tests check those fields, and the rule :func:`dispatch.derived_attn_state` copies,
against the real sources of the pin set in force (vLLM 0.18.0 / 0.23.0, vllm-ascend 0.18.0 /
0.23.0.post1), and drive the hook with vLLM's real scheduler dataclasses in a subprocess.
``tests/patches/test_dispatch_msprobe.py`` drives the same code with real msprobe.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_type_hints

import pytest

from tests.patches.test_vllm_patch import read_member
from verl_consistency.patches.hooks.rollout import dispatch
from verl_consistency.patches.tooling import upstream

pytestmark = [pytest.mark.upstream, pytest.mark.pinset]


@dataclass
class _New:
    req_id: str
    prompt_token_ids: list[int]
    num_computed_tokens: int = 0


@dataclass
class _Cached:
    req_ids: list[str] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class _Sched:
    scheduled_new_reqs: list[_New]
    scheduled_cached_reqs: _Cached
    num_scheduled_tokens: dict[str, int]

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


def _new(rid: str, n: int, computed: int = 0, tokens: int | None = None) -> tuple[_New, int]:
    return _New(rid, list(range(n)), computed), n - computed if tokens is None else tokens


def _so(new: list[tuple[_New, int]] = (), cached: dict[str, tuple[int, int]] | None = None) -> _Sched:  # type: ignore[assignment]
    cached = cached or {}
    counts = {r.req_id: t for r, t in new} | {rid: t for rid, (t, _) in cached.items()}
    return _Sched(
        [r for r, _ in new],
        _Cached(list(cached), [c for _, c in cached.values()]),
        counts,
    )


def test_only_fresh_prompts_is_prefill_no_cache():
    assert dispatch.derived_attn_state(_so([_new("a", 5), _new("b", 3)])) == "PrefillNoCache"


def test_one_token_each_is_decode_only():
    assert dispatch.derived_attn_state(_so(cached={"a": (1, 9), "b": (1, 4)})) == "DecodeOnly"


@pytest.mark.parametrize(
    "so",
    [
        _so([_new("a", 5)], cached={"b": (1, 9)}),  # a new prompt joins running decodes
        _so([_new("a", 40, computed=32)]),  # a prefix-cache hit computes only the suffix
        _so(cached={"a": (16, 16)}),  # the next chunk of a chunked prefill
    ],
)
def test_everything_else_is_chunked_prefill(so):
    """vLLM V1 always schedules with chunked prefill: vllm-ascend's branch for that is ChunkedPrefill."""
    assert dispatch.derived_attn_state(so) == "ChunkedPrefill"


def test_a_new_prompt_of_one_token_after_a_hit_is_decode_like():
    """vllm-ascend's rule looks at token counts only: a 1-token suffix after a hit reads as decode."""
    assert dispatch.derived_attn_state(_so([_new("a", 17, computed=16)])) == "DecodeOnly"


def test_no_dump_config_sets_nothing_up():
    assert dispatch.setup_rollout_debugger(None, enforce_eager=False) == (None, None)
    assert dispatch.setup_rollout_debugger({"other": 1}, enforce_eager=True) == (None, None)


def test_dump_config_needs_eager_mode_as_in_vllm_ascend(tmp_path):
    with pytest.raises(RuntimeError, match="eager mode"):
        dispatch.setup_rollout_debugger({"dump_config_path": str(tmp_path / "c.json")}, enforce_eager=False)


def test_speculative_drafts_are_logged_per_cached_request():
    """A cached request with k draft tokens advances by 1 + k: the record says k (``spec_tokens``)."""
    so = _so([_new("n", 4)], cached={"a": (3, 9), "b": (1, 4)})
    so.scheduled_spec_decode_tokens = {"a": [11, 12]}  # type: ignore[attr-defined]
    reqs = {r.request_id: r for r in dispatch.scheduled_requests(so)}
    assert reqs["a"].spec_tokens == 2
    assert reqs["a"].tokens == 1 + reqs["a"].spec_tokens
    assert reqs["b"].spec_tokens is None
    assert reqs["n"].spec_tokens is None
    assert "spec_tokens" not in reqs["b"].model_dump(exclude_none=True)


# What the hook reads from vLLM's scheduler output: the protocol's annotations, plus the fields it
# reads with getattr (speculative drafts; cached requests' computed tokens for the derived state).
_READ_BY_GETATTR = {
    "SchedulerOutput": {"scheduled_spec_decode_tokens"},
    "CachedRequestData": {"num_computed_tokens"},
    "NewRequestData": set(),
}


def _read_fields() -> dict[str, set[str]]:
    protocols = {
        "SchedulerOutput": dispatch.SchedulerOutputLike,
        "NewRequestData": dispatch._NewRequest,
        "CachedRequestData": dispatch._CachedRequests,
    }
    return {name: set(get_type_hints(proto)) | _READ_BY_GETATTR[name] for name, proto in protocols.items()}


_REAL_CLASSES = r"""
import dataclasses, json, sys
sys.path.insert(0, sys.argv[1])
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from verl_consistency.patches.hooks.rollout import dispatch

classes = (SchedulerOutput, NewRequestData, CachedRequestData)
fields = {c.__name__: [f.name for f in dataclasses.fields(c)] for c in classes}
def new(rid, n, computed=0):
    return NewRequestData(
        req_id=rid, prompt_token_ids=list(range(n)), mm_features=[], sampling_params=None,
        pooling_params=None, block_ids=([0],), num_computed_tokens=computed, lora_request=None)
def so(new_reqs, cached, counts, spec=None):
    return SchedulerOutput(
        scheduled_new_reqs=new_reqs,
        scheduled_cached_reqs=CachedRequestData(
            req_ids=list(cached), resumed_req_ids=set(), new_token_ids=[], all_token_ids={},
            new_block_ids=[None] * len(cached), num_computed_tokens=list(cached.values()),
            num_output_tokens=[1] * len(cached)),
        num_scheduled_tokens=counts, total_num_scheduled_tokens=sum(counts.values()),
        scheduled_spec_decode_tokens=spec or {}, scheduled_encoder_inputs={}, num_common_prefix_blocks=[0],
        finished_req_ids=set(), free_encoder_mm_hashes=[])
steps = [
    so([new("a", 5), new("b", 3)], {}, {"a": 5, "b": 3}),
    so([], {"a": 5, "b": 3}, {"a": 1, "b": 1}),
    so([new("c", 40, 32)], {"a": 6}, {"c": 8, "a": 3}, {"a": [7, 8]}),
]
out = [{"state": dispatch.derived_attn_state(s),
        "requests": [r.model_dump(exclude_none=True) for r in dispatch.scheduled_requests(s)]} for s in steps]
print(json.dumps({"fields": fields, "steps": out}))
"""


@pytest.fixture(scope="module")
def real_run(vllm_src: Path, repo: Path) -> dict:
    """The hook fed vLLM's own dataclasses (the set's wheel, on CPU), in a process of its own."""
    res = subprocess.run(
        [sys.executable, "-c", _REAL_CLASSES, str(vllm_src)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_sets_vllm_has_every_field_the_hook_reads(real_run):
    """0.18.0 → 0.23.0 only added ``NewRequestData.prompt_is_token_ids``; a rename must fail here."""
    real = {name: set(names) for name, names in real_run["fields"].items()}
    for cls, read in _read_fields().items():
        assert read <= real[cls], f"{cls} lacks {sorted(read - real[cls])}"


def test_the_hook_reads_real_scheduler_outputs(real_run):
    prefill, decode, mixed = real_run["steps"]
    assert prefill["state"] == "PrefillNoCache"
    assert prefill["requests"] == [
        {"request_id": "a", "type": "new", "tokens": 5, "prompt_tokens": 5, "num_computed_tokens": 0},
        {"request_id": "b", "type": "new", "tokens": 3, "prompt_tokens": 3, "num_computed_tokens": 0},
    ]
    assert decode["state"] == "DecodeOnly"
    assert [(r["request_id"], r["type"], r["tokens"]) for r in decode["requests"]] == [
        ("a", "cached", 1),
        ("b", "cached", 1),
    ]
    assert mixed["state"] == "ChunkedPrefill"
    assert mixed["requests"] == [
        {"request_id": "c", "type": "new", "tokens": 8, "prompt_tokens": 40, "num_computed_tokens": 32},
        {"request_id": "a", "type": "cached", "tokens": 3, "spec_tokens": 2},
    ]


def test_the_sets_vllm_names_the_draft_tokens_field_the_hook_reads():
    """The field name is the set's vLLM's own (read from the pinned wheel, not assumed)."""
    source = read_member(upstream.fetch_wheel("vllm"), "vllm/v1/core/sched/output.py").decode()
    assert "scheduled_spec_decode_tokens: dict[str, list[int]]" in source


def _branch_states(fn: ast.FunctionDef) -> list[str]:
    """The ``AscendAttentionState.X`` names assigned in ``fn``, in source order."""
    return [
        n.value.attr
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Attribute)
        and isinstance(n.value.value, ast.Name)
        and n.value.value.id == "AscendAttentionState"
        and any(isinstance(t, ast.Name) and t.id == "attn_state" for t in n.targets)
    ]


def test_derived_state_follows_the_sets_vllm_ascend_rule():
    """derived_attn_state copies vllm-ascend's ``_build_attn_state`` (same in 0.18.0 and 0.23.0.post1).

    Its branches, in order: nothing computed → PrefillNoCache; one token each → DecodeOnly (MTP:
    SpecDecoding); one valid token each → SpecDecoding or ChunkedPrefill; chunked prefill on →
    ChunkedPrefill; else PrefillCacheHit. vLLM V1 always chunks, so the derived rule stops at
    ChunkedPrefill; a release that reorders these branches must fail here.
    """
    dist = upstream.fetch_wheel("vllm-ascend")
    module = ast.parse(read_member(dist, "vllm_ascend/worker/model_runner_v1.py").decode())
    (fn,) = [n for n in ast.walk(module) if isinstance(n, ast.FunctionDef) and n.name == "_build_attn_state"]
    first = fn.body[0]
    assert isinstance(first, ast.If)
    assert "num_computed_tokens_cpu" in ast.unparse(first.test)
    assert _branch_states(fn) == [
        "PrefillNoCache",
        "DecodeOnly",
        "SpecDecoding",
        "SpecDecoding",
        "ChunkedPrefill",
        "ChunkedPrefill",
        "PrefillCacheHit",
    ]
