"""PROMPTS_ONLY: make the training forward recompute exactly what vLLM's prompt-only prefill computed.

Called from the patched ``RayPPOTrainer.fit`` (hybrid) and ``FullyAsyncTrainer._fit_generate``
(fully async) on the rollout batch, before old log-probs are computed.

The public recipe cut the responses to **zero** tokens. Every loss then averages over an empty
mask: the actor update's loss is NaN, and verl's rollout-correction code raises
``ValueError: response_mask must contain at least one valid token``.

Our trim keeps the forward input identical to the recipe's (the left-padded prompt, nothing
after it) but re-splits it: the prompt's **last token becomes a one-token response**. So

* the training forward sees exactly the tokens vLLM prefilled: the dumps stay comparable;
* every loss has one valid token, so log-prob, entropy and PPO losses are finite and verl's
  checks pass: a collection run finishes cleanly in both trainers;
* vLLM's first response token and its log-prob (``rollout_log_probs[:, 0]``, the prediction at
  the last prompt position) are kept in ``non_tensor_batch`` (``token_mismatch.stash_next_token``)
  before the trim drops them, for the output row of the layer view;
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

from verl_consistency.patches.contracts import env

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

    from verl_consistency.patches.hooks import token_mismatch

    token_mismatch.stash_next_token(batch)
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


def apply(batch: Any, *, bypass_mode: bool) -> Any:
    """The trainers' entry point: trim when ``PROMPTS_ONLY=1``, else return the batch untouched."""
    if not enabled():
        return batch
    return trim(batch, bypass_mode=bypass_mode)
