"""The selective-mode decision: which request (if any) a vLLM step dumps."""

from __future__ import annotations

import pytest

from verl_consistency.contracts.capture import CaptureRule
from verl_consistency.contracts.records import ScheduledRequest
from verl_consistency.patches.hooks.rollout.request_scope import is_comparable_prefill, should_dump

ALL = CaptureRule(fraction=1.0)


def new(rid: str, tokens: int, *, prompt: int | None = None, computed: int | None = 0) -> ScheduledRequest:
    return ScheduledRequest(
        request_id=rid,
        type="new",
        tokens=tokens,
        prompt_tokens=tokens if prompt is None else prompt,
        num_computed_tokens=computed,
    )


def cached(rid: str) -> ScheduledRequest:
    return ScheduledRequest(request_id=rid, type="cached", tokens=1)


def _ids_split_by(rule: CaptureRule, n: int) -> tuple[list[str], list[str]]:
    ids = [f"{i:032x}" for i in range(n)]
    return [i for i in ids if rule.captures(i)], [i for i in ids if not rule.captures(i)]


def test_decode_steps_are_never_dumped() -> None:
    assert should_dump([cached("a-0123abcd"), cached("b-0123abcd")], "decode", ALL) is None
    # even a (malformed) decode record that lists a new request
    assert should_dump([new("a-0123abcd", 1)], "decode", ALL) is None


def test_uncaptured_prefill_is_skipped_and_captured_one_is_picked() -> None:
    rule = CaptureRule(fraction=0.3)
    yes, no = _ids_split_by(rule, 64)
    assert yes
    assert no
    assert should_dump([new(f"{no[0]}-deadbeef", 9)], "prefill", rule) is None
    step = [cached(f"{no[1]}-00000000"), new(f"{no[2]}-11111111", 5), new(f"{yes[0]}-22222222", 7)]
    assert should_dump(step, "prefill", rule) == f"{yes[0]}-22222222"


def test_first_captured_in_packing_order_wins() -> None:
    step = [new("r1-aaaaaaaa", 4), new("r2-bbbbbbbb", 6), new("r3-cccccccc", 2)]
    assert should_dump(step, "prefill", ALL) == "r1-aaaaaaaa"
    assert should_dump(list(reversed(step)), "prefill", ALL) == "r3-cccccccc"


def test_capture_is_decided_on_the_id_verl_sent() -> None:
    rule = CaptureRule(fraction=0.5)
    yes, _ = _ids_split_by(rule, 16)
    # vLLM's random suffix and the n>1 child prefix must not change the decision
    assert should_dump([new(f"3_{yes[0]}-0f0f0f0f", 5)], "prefill", rule) == f"3_{yes[0]}-0f0f0f0f"


@pytest.mark.parametrize(
    ("req", "ok"),
    [
        (new("a", 8), True),
        (new("a", 8, computed=None, prompt=None), True),
        (new("a", 8, computed=16, prompt=24), False),  # prefix-cache hit: only the suffix is computed
        (new("a", 8, prompt=20), False),  # a chunk of a longer prompt
        (cached("a"), False),
    ],
)
def test_only_whole_uncached_prompt_prefills_are_comparable(req: ScheduledRequest, ok: bool) -> None:
    assert is_comparable_prefill(req) is ok
    assert (should_dump([req], "prefill", ALL) is not None) is ok
