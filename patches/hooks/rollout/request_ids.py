"""Thread the vLLM request id of a trajectory's prompt-only prefill into verl's batch.

Called from the patched ``LLMServerClient.generate`` (every vLLM call), the patched
``FullyAsyncLLMServerClient.generate`` (partial-rollout resumes) and the patched
``ToolAgentLoop`` (later turns). verl 0.8.0's agent loop copies ``TokenOutput.extra_fields`` into
``DataProto.non_tensor_batch``, so the two keys below reach the training engine's micro batches.
verl 0.9's V1 trainer stores each trajectory in TransferQueue with ``extra_fields`` as ONE
field (a dict per sample), so the patched ``AgentLoopWorkerTQ._agent_loop_postprocess`` lifts the
two keys to fields of their own (:func:`lift_fields`); the engines then see them by name, as in
0.8.0. verl 0.9's synthetic padding samples copy a real sample's fields, so the patched
``upsample_batch_to_divisible_size`` blanks them (:func:`clear_padding`).

* ``request_id``: the id of the trajectory's FIRST vLLM request. That request's first step is the
  prefill of the prompt alone, which is what the PROMPTS_ONLY training forward recomputes.
  The public recipe copied every resume's ``extra_fields`` over the previous ones, so after a
  partial-rollout resume the LAST id won: that request prefills prompt + already generated
  tokens and never pairs with the training forward.
* ``request_ids_all``: every vLLM id the trajectory used, in order (resumes and turns).
  If the first request was aborted before vLLM ever scheduled it, the first id has no prefill
  in the dispatch log; the list lets the postprocess see that and report it.
* the weights of each call and where its tokens begin in the response
  (``contracts.token_records.CALL_VERSIONS``/``CALL_OFFSETS``, issue 41): a partial-rollout resume
  after a weight sync generates the rest of the response with newer weights, and the token view must
  not compare those tokens as if one set of weights made them. They stay inside ``extra_fields``.
"""

from __future__ import annotations

import contextvars
import os
import uuid
from collections.abc import Mapping
from typing import Any

from verl_consistency.contracts import capture
from verl_consistency.contracts import token_records as tr
from verl_consistency.contracts.env import CAPTURE
from verl_consistency.contracts.weight_labels import label

REQUEST_ID = "request_id"
REQUEST_IDS_ALL = "request_ids_all"


def tag_output(extra_fields: dict[str, Any], vllm_request_id: str) -> None:
    """``LLMServerClient.generate``: record the id this one vLLM call was sent under, and its weights.

    The weights are the server's ``global_steps``: a sync aborts the requests in flight first, so one
    call runs one version."""
    extra_fields[REQUEST_ID] = vllm_request_id
    extra_fields[REQUEST_IDS_ALL] = [vllm_request_id]
    extra_fields[tr.CALL_VERSIONS] = [label(extra_fields.get("global_steps"))]
    extra_fields[tr.CALL_OFFSETS] = [0]


def _ids(fields: dict[str, Any]) -> list[str]:
    ids = fields.get(REQUEST_IDS_ALL)
    if ids is None:
        one = fields.get(REQUEST_ID)
        return [] if one is None else [str(one)]
    return [str(i) for i in ids]


def merge_resume(
    final_fields: dict[str, Any], output_fields: dict[str, Any], tokens_before: int | None = None
) -> None:
    """``FullyAsyncLLMServerClient``: fold one resume iteration into the trajectory's output.

    The first id wins; every id is appended to the list. ``tokens_before`` (the response tokens
    generated before this iteration) places this call's weights in the response. Other keys are
    left to upstream.
    """
    before = _ids(final_fields)
    if REQUEST_ID not in final_fields and REQUEST_ID in output_fields:
        final_fields[REQUEST_ID] = output_fields[REQUEST_ID]
    final_fields[REQUEST_IDS_ALL] = [*before, *_ids(output_fields)]
    if tokens_before is None or tr.CALL_VERSIONS not in output_fields:
        return
    versions = list(final_fields.get(tr.CALL_VERSIONS) or [])
    offsets = list(final_fields.get(tr.CALL_OFFSETS) or [])
    for v, off in zip(
        output_fields[tr.CALL_VERSIONS], output_fields.get(tr.CALL_OFFSETS) or [0], strict=False
    ):
        versions.append(v)
        offsets.append(int(tokens_before) + int(off))
    final_fields[tr.CALL_VERSIONS] = versions
    final_fields[tr.CALL_OFFSETS] = offsets


def merge_turn(agent_fields: dict[str, Any], output_fields: dict[str, Any]) -> None:
    """``ToolAgentLoop``, turns after the first: keep the first turn's id, append the new ids.

    Upstream copies ``extra_fields`` on the first turn only (which is the prompt-only turn, so
    ``request_id`` is already right); without this the later turns' ids would be lost.
    """
    merge_resume(agent_fields, output_fields)


def lift_fields(field: dict[str, Any]) -> None:
    """verl 0.9 ``AgentLoopWorkerTQ._agent_loop_postprocess``: one TransferQueue sample's fields.

    Copies ``request_id`` and ``request_ids_all`` out of the sample's ``extra_fields`` dict into
    fields of their own, always both, so every sample of a partition has the same fields
    (TransferQueue refuses a batch where some samples lack a field). A sample whose agent loop
    never went through the patched client gets ``""`` and ``[]``.
    """
    extra = field.get("extra_fields")
    extra = extra if isinstance(extra, Mapping) else {}
    rid = extra.get(REQUEST_ID)
    field[REQUEST_ID] = "" if rid is None else str(rid)
    field[REQUEST_IDS_ALL] = _ids(dict(extra))


def clear_padding(sample: dict[str, Any]) -> None:
    """verl 0.9 ``upsample_batch_to_divisible_size``: a synthetic padding sample is no request.

    verl builds the padding samples from a copy of the batch's first real sample, so without this
    they would carry that sample's vLLM id into the training engine: the dump of an all-EOS
    padding forward would then be paired with a real request's prefill.
    """
    if REQUEST_ID in sample:
        sample[REQUEST_ID] = ""
    if REQUEST_IDS_ALL in sample:
        sample[REQUEST_IDS_ALL] = []
    extra = sample.get("extra_fields")
    if isinstance(extra, dict):
        for key in (REQUEST_ID, REQUEST_IDS_ALL, tr.CALL_VERSIONS, tr.CALL_OFFSETS):
            extra.pop(key, None)

    for key in (tr.NEXT_TOKEN, tr.NEXT_TOKEN_ROLLOUT_LOG_PROB, tr.NEXT_TOKEN_TOPK):
        if key in sample:
            sample[key] = None


# --- capture by prompt (``prompts:FILE``, patches/current/verl/0006-capture-prompts) -------------------
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


def mark_listed(request_id: str) -> str:
    """verl 0.9 with ``rollout.full_determinism``: the caller's id goes to vLLM unchanged.

    That id is the same in every run (deterministic), so it is not overwritten like a fresh
    uuid: a listed prompt's id gets :data:`capture.CAPTURED_PREFIX` in front instead.
    """
    if _PROMPT.get() and not request_id.startswith(capture.CAPTURED_PREFIX):
        return capture.CAPTURED_PREFIX + request_id
    return request_id
