"""The hook pieces only vLLM's own runner (``patches/vllm``) uses: set-up and the derived state.

The real engine drives both in ``tests/demo/``; here each rule is pinned on its own. The
scheduler output is a plain object with the fields the hook reads (``SchedulerOutputLike``);
``tests/patches/test_dispatch_msprobe.py`` drives the same code with vLLM's real dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from verl_consistency.patches.hooks import dispatch


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


def test_vllm_018_names_the_draft_tokens_field_the_hook_reads(repo):
    """The field name is vLLM 0.18.0's own (read from the pinned wheel, not assumed)."""
    import zipfile

    from verl_consistency.patches import upstream

    with zipfile.ZipFile(upstream.fetch_wheel("vllm")) as zf:
        source = zf.read("vllm/v1/core/sched/output.py").decode()
    assert "scheduled_spec_decode_tokens: dict[str, list[int]]" in source
