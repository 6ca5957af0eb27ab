"""Thread the vLLM request id of a trajectory's prompt-only prefill into verl's batch.

Called from the patched ``LLMServerClient.generate`` (every vLLM call), the patched
``FullyAsyncLLMServerClient.generate`` (partial-rollout resumes) and the patched
``ToolAgentLoop`` (later turns). verl's agent loop copies ``TokenOutput.extra_fields`` into
``DataProto.non_tensor_batch``, so the two keys below reach the training engine's micro batches.

* ``request_id``: the id of the trajectory's FIRST vLLM request. That request's first step is the
  prefill of the prompt alone, which is what the PROMPTS_ONLY training forward recomputes.
  The public recipe copied every resume's ``extra_fields`` over the previous ones, so after a
  partial-rollout resume the LAST id won: that request prefills prompt + already generated
  tokens and never pairs with the training forward.
* ``request_ids_all``: every vLLM id the trajectory used, in order (resumes and turns).
  If the first request was aborted before vLLM ever scheduled it, the first id has no prefill
  in the dispatch log; the list lets the postprocess see that and report it.
"""

from __future__ import annotations

import contextvars
import os
import uuid
from collections.abc import Mapping
from typing import Any

from verl_consistency.patches.contracts import capture
from verl_consistency.patches.contracts.env import CAPTURE

REQUEST_ID = "request_id"
REQUEST_IDS_ALL = "request_ids_all"


def tag_output(extra_fields: dict[str, Any], vllm_request_id: str) -> None:
    """``LLMServerClient.generate``: record the id this one vLLM call was sent under."""
    extra_fields[REQUEST_ID] = vllm_request_id
    extra_fields[REQUEST_IDS_ALL] = [vllm_request_id]


def _ids(fields: dict[str, Any]) -> list[str]:
    ids = fields.get(REQUEST_IDS_ALL)
    if ids is None:
        one = fields.get(REQUEST_ID)
        return [] if one is None else [str(one)]
    return [str(i) for i in ids]


def merge_resume(final_fields: dict[str, Any], output_fields: dict[str, Any]) -> None:
    """``FullyAsyncLLMServerClient``: fold one resume iteration into the trajectory's output.

    The first id wins; every id is appended to the list. Other keys are left to upstream.
    """
    before = _ids(final_fields)
    if REQUEST_ID not in final_fields and REQUEST_ID in output_fields:
        final_fields[REQUEST_ID] = output_fields[REQUEST_ID]
    final_fields[REQUEST_IDS_ALL] = [*before, *_ids(output_fields)]


def merge_turn(agent_fields: dict[str, Any], output_fields: dict[str, Any]) -> None:
    """``ToolAgentLoop``, turns after the first: keep the first turn's id, append the new ids.

    Upstream copies ``extra_fields`` on the first turn only (which is the prompt-only turn, so
    ``request_id`` is already right); without this the later turns' ids would be lost.
    """
    merge_resume(agent_fields, output_fields)


# --- capture by prompt (``prompts:FILE``, patches/verl/0006-capture-prompts) -------------------
# Only verl's agent loop knows a request's prompt; it marks the id it sends to vLLM, so both
# sides decide on the id alone (the rule itself is ``contracts.capture``).

_PROMPT: contextvars.ContextVar[bool] = contextvars.ContextVar("vc_prompt_listed", default=False)
_RULE: tuple[str, capture.CaptureRule] | None = None


def _cached_rule() -> capture.CaptureRule:
    global _RULE
    spec = os.environ.get(CAPTURE, "all")
    if _RULE is None or _RULE[0] != spec:
        _RULE = (spec, capture.parse(spec))
    return _RULE[1]


def enter_prompt(sample: Mapping[str, Any]) -> None:
    """verl's ``_run_agent_loop`` (one asyncio task per sample): note whether this prompt is listed.

    A context variable is task-local, so concurrent samples never see each other's answer.
    """
    rule = _cached_rule()
    _PROMPT.set(rule.prompts is not None and rule.lists(sample))


def new_request_id() -> str:
    """The id ``LLMServerClient.generate`` sends to vLLM: verl's ``uuid4().hex``, marked when listed."""
    rid = uuid.uuid4().hex
    if _PROMPT.get():
        return capture.CAPTURED_PREFIX + rid[len(capture.CAPTURED_PREFIX) :]
    return rid
