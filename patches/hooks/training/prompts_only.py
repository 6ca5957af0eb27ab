"""PROMPTS_ONLY: make the training forward recompute exactly what vLLM's prompt-only prefill computed.

Called from the patched ``RayPPOTrainer.fit`` (hybrid) and ``FullyAsyncTrainer._fit_generate``
(fully async) on the rollout batch, before old log-probs are computed (verl 0.8.0: :func:`trim`).
verl 0.9's V1 trainer keeps each trajectory in TransferQueue as 1-D tensors and cannot delete a
field there, so its patched ``AgentLoopWorkerTQ._agent_loop_postprocess`` trims each training
sample before it is stored (:func:`trim_sample`), and ``PPOTrainer._compute_old_log_prob``
checks the config (:func:`check_v1_config`).

The public recipe cut the responses to **zero** tokens. Every loss then averages over an empty
mask: the actor update's loss is NaN, and verl's rollout-correction code raises
``ValueError: response_mask must contain at least one valid token``.

Our trim keeps the forward input identical to the recipe's (the left-padded prompt, nothing
after it) but re-splits it: the prompt's **last token becomes a one-token response**. So

* the training forward sees exactly the tokens vLLM prefilled: the dumps stay comparable;
* every loss has one valid token, so log-prob, entropy and PPO losses are finite and verl's
  checks pass: a collection run finishes cleanly in both trainers;
* vLLM's first response token and its log-prob (``rollout_log_probs[:, 0]``, the prediction at
  the last prompt position) are kept in ``non_tensor_batch`` (``next_token.stash_next_token``)
  before the trim drops them, for the output row of the layer view;
* each row is marked with the number of its tokens that vLLM's prefill computed, the whole
  trimmed row (:data:`PREFILL_ROWS`), so that the training dump keeps the row whole: from the
  trimmed ``prompts``/``responses`` alone the last prompt token would read as a response token;
* the reward of that token is set to zero (``rm_scores``), so reward-only advantage estimators
  (GRPO, RLOO, REINFORCE++) give zero advantages and the policy-gradient term is exactly zero.
  The update still runs a real forward and backward (what ``DUMP_PHASE=update_actor`` dumps),
  and the new weights are synced to vLLM as usual, so both sides keep using the same weights.

Bypass mode (``algorithm.rollout_correction.bypass_mode=True``, the fully-async default) uses
vLLM's response log-probs as the old log-probs, and vLLM never computed one for the last
prompt token; it also skips the old-log-prob pass, leaving a ``log_prob`` dump empty. So
PROMPTS_ONLY refuses bypass mode with a message that names the override.

Nothing here imports torch or verl at import time.
"""

from __future__ import annotations

import os
from typing import Any

from verl_consistency.contracts import env
from verl_consistency.contracts.batch_fields import PREFILL_ROWS
from verl_consistency.patches.hooks.training import next_token

BYPASS_OVERRIDE = "algorithm.rollout_correction.bypass_mode=False"

_FULL_SEQUENCE = ("input_ids", "attention_mask")
_DROPPED = ("rollout_log_probs",)
"""vLLM's log-probs of the real response tokens: meaningless for the re-split response."""


class PromptsOnlyError(ValueError):
    """The batch or the config cannot be trimmed safely; the message says why and what to do."""


def enabled(environ: dict[str, str] | os._Environ[str] | None = None) -> bool:
    return env.flag(env.PROMPTS_ONLY, environ)


def check_config(bypass_mode: bool) -> None:
    if bypass_mode:
        raise PromptsOnlyError(
            "PROMPTS_ONLY=1 needs the old log-probs recomputed by the actor, but bypass mode is on "
            "(the fully-async trainer's default). Pass the override "
            f"'{BYPASS_OVERRIDE}' (the verl-consistency run command does)."
        )


def trim(batch: Any, *, bypass_mode: bool = False) -> Any:
    """Trim a rollout ``DataProto`` in place (and return it). See the module docstring."""
    import torch

    check_config(bypass_mode)
    td = batch.batch
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids"):
        if key not in td:
            raise PromptsOnlyError(f"PROMPTS_ONLY: the rollout batch has no {key!r}; cannot trim it")
    prompt_len = int(td["prompts"].shape[1])
    resp_len = int(td["responses"].shape[1])
    total = int(td["input_ids"].shape[1])
    if prompt_len < 2 or total != prompt_len + resp_len:
        raise PromptsOnlyError(
            f"PROMPTS_ONLY: expected input_ids of prompt+response length ({prompt_len}+{resp_len}), "
            f"got {total}"
        )
    last_prompt_valid = td["attention_mask"][:, prompt_len - 1]
    if not bool(torch.all(last_prompt_valid != 0)):
        raise PromptsOnlyError("PROMPTS_ONLY: a sample has an empty prompt; nothing to compare")

    handled = {"prompts", "responses", "response_mask", "position_ids", "rm_scores", "routed_experts"}
    handled.update(_FULL_SEQUENCE, _DROPPED)
    unknown = [
        k
        for k in list(td.keys())
        if k not in handled
        and isinstance(td[k], torch.Tensor)
        and td[k].dim() >= 2
        and int(td[k].shape[1]) in (resp_len, total)
    ]
    if unknown:
        raise PromptsOnlyError(
            f"PROMPTS_ONLY: does not know how to trim the response-shaped batch keys {sorted(unknown)} "
            "(distillation and other extensions are not supported in a collection run)"
        )

    next_token.stash_next_token(batch)
    import numpy as np

    prefill = np.empty(td["attention_mask"].shape[0], dtype=object)
    prefill[:] = [int(n) for n in td["attention_mask"][:, :prompt_len].sum(dim=-1).tolist()]
    batch.non_tensor_batch[PREFILL_ROWS] = prefill
    prompts = td["prompts"]
    for key in _FULL_SEQUENCE:
        td[key] = td[key][:, :prompt_len]
    td["position_ids"] = td["position_ids"][..., :prompt_len]
    if "routed_experts" in td:
        td["routed_experts"] = td["routed_experts"][:, :prompt_len]
    td["responses"] = prompts[:, -1:]
    td["prompts"] = prompts[:, :-1]
    td["response_mask"] = td["attention_mask"][:, -1:].clone()
    if "rm_scores" in td:
        td["rm_scores"] = torch.zeros_like(td["rm_scores"][:, :1])
    for key in _DROPPED:
        if key in td:
            del td[key]
    if "global_token_num" in batch.meta_info:
        batch.meta_info["global_token_num"] = td["attention_mask"].sum(dim=-1).tolist()
    return batch


def check_v1_config(rollout_corr_config: Any, reward_config: Any = None) -> None:
    """verl 0.9 V1 ``PPOTrainer._compute_old_log_prob``: refuse what the V1 trim cannot serve.

    TransferQueue cannot drop ``rollout_log_probs``, so :func:`trim_sample` fills it with NaN
    (vLLM never computed a log-prob for the last prompt token). Besides bypass mode, rollout
    correction's IS weights and rejection sampling (``rollout_is``, ``rollout_rs``) would then
    turn NaN into the loss: they are refused too (``algorithm.rollout_correction=null``, which
    the verl-consistency run command passes, turns all three off).

    A reward model colocated with the trainer (``reward.reward_model.enable=true`` without
    ``enable_resource_pool``) scores the batch in the trainer, after the agent loop's trim
    (``PPOTrainer._compute_reward_colocate``), so it would overwrite the zeroed reward of the
    trimmed response and make the policy gradient non-zero: refused as well.
    """
    if not enabled():
        return
    model = (reward_config or {}).get("reward_model", None) or {}
    if model.get("enable", False) and not model.get("enable_resource_pool", False):
        raise PromptsOnlyError(
            "PROMPTS_ONLY=1 on verl 0.9's V1 trainer zeroes the reward of the trimmed response in the "
            "agent loop, but a reward model colocated with the trainer scores the batch afterwards. "
            "Use a rule-based reward or give the reward model its own pool "
            "('reward.reward_model.enable_resource_pool=true')."
        )
    if rollout_corr_config is None:
        return
    check_config(bool(rollout_corr_config.get("bypass_mode", False)))
    used = [k for k in ("rollout_is", "rollout_rs") if rollout_corr_config.get(k, None) is not None]
    if used:
        raise PromptsOnlyError(
            f"PROMPTS_ONLY=1 on verl 0.9's V1 trainer leaves no vLLM log-prob for the trimmed response, "
            f"so rollout correction ({', '.join('algorithm.rollout_correction.' + k for k in used)}) "
            "would train on NaN weights. Pass the override 'algorithm.rollout_correction=null' "
            "(the verl-consistency run command does)."
        )


_SAMPLE_HANDLED = frozenset(
    {
        "prompts",
        "responses",
        "response_mask",
        "loss_mask",
        "input_ids",
        "attention_mask",
        "position_ids",
        "rm_scores",
        "rollout_log_probs",
        "routed_experts",
    }
)


def trim_sample(field: dict[str, Any], *, validate: bool = False) -> dict[str, Any]:
    """verl 0.9 V1: trim one trajectory before it goes into TransferQueue (see the module docstring).

    ``field`` is what ``AgentLoopWorkerTQ._agent_loop_postprocess`` stores for one sample: 1-D
    tensors without padding (``prompts`` P, ``responses``/``response_mask``/``loss_mask``/
    ``rm_scores``/``rollout_log_probs`` R, ``input_ids`` P+R, ``position_ids`` ``[..., P+R]``,
    ``routed_experts`` ``[P+R, ...]``). Afterwards the forward input is the prompt and nothing
    else, the last prompt token is a one-token response with mask 1 and reward 0,
    :data:`PREFILL_ROWS` is the prompt's length, and ``rollout_log_probs`` is ``[NaN]``
    (TransferQueue cannot delete a field; see :func:`check_v1_config`). Validation samples, and
    everything when ``PROMPTS_ONLY`` is off, are left alone. Returns ``field``.
    """
    if validate or not enabled():
        return field
    import torch

    for key in ("prompts", "responses", "input_ids", "position_ids"):
        if not isinstance(field.get(key), torch.Tensor):
            raise PromptsOnlyError(f"PROMPTS_ONLY: the trajectory has no tensor {key!r}; cannot trim it")
    prompts = field["prompts"]
    prompt_len, resp_len = int(prompts.shape[0]), int(field["responses"].shape[0])
    total = int(field["input_ids"].shape[0])
    if prompt_len < 2 or total != prompt_len + resp_len:
        raise PromptsOnlyError(
            f"PROMPTS_ONLY: expected input_ids of prompt+response length ({prompt_len}+{resp_len}), "
            f"got {total}"
        )
    unknown = sorted(
        k
        for k, v in field.items()
        if k not in _SAMPLE_HANDLED
        and isinstance(v, torch.Tensor)
        and v.dim() >= 1
        and int(v.shape[0]) in (resp_len, total)
    )
    if unknown:
        raise PromptsOnlyError(
            f"PROMPTS_ONLY: does not know how to trim the response-shaped fields {unknown} "
            "(distillation and other extensions are not supported in a collection run)"
        )

    next_token.stash_next_token_sample(field)
    field[PREFILL_ROWS] = prompt_len
    one = torch.ones(1, dtype=field["response_mask"].dtype if "response_mask" in field else torch.int64)
    field["input_ids"] = field["input_ids"][:prompt_len]
    field["position_ids"] = field["position_ids"][..., :prompt_len]
    if isinstance(field.get("attention_mask"), torch.Tensor):
        field["attention_mask"] = field["attention_mask"][:prompt_len]
    if isinstance(field.get("routed_experts"), torch.Tensor):
        field["routed_experts"] = field["routed_experts"][:prompt_len]
    field["responses"] = prompts[-1:].clone()
    field["prompts"] = prompts[:-1].clone()
    field["response_mask"] = one
    if "loss_mask" in field:
        field["loss_mask"] = one
    if isinstance(field.get("rm_scores"), torch.Tensor):
        field["rm_scores"] = torch.zeros(1, dtype=field["rm_scores"].dtype)
    if isinstance(field.get("rollout_log_probs"), torch.Tensor):
        field["rollout_log_probs"] = torch.full((1,), float("nan"), dtype=field["rollout_log_probs"].dtype)
    return field


def apply(batch: Any, *, bypass_mode: bool) -> Any:
    """The trainers' entry point: trim when ``PROMPTS_ONLY=1``, else return the batch untouched."""
    if not enabled():
        return batch
    return trim(batch, bypass_mode=bypass_mode)
