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

from typing import Any

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
