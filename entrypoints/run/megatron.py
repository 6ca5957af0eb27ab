"""What a collection run on verl's Megatron actor refuses before anything starts.

Per-request lanes cut verl's FSDP micro batches (``hooks/training/micro_batch_dump.py``,
``hooks/training/prompt_rows.py``).
Megatron's engine is not cut: its ``forward_step`` is dumped whole, its activations are
sequence-first and its THD packing pads each sequence to the tensor-parallel size. So a Megatron
collection keeps one sample per micro batch, and its forward must cover the prompt only, which
only the recipe's trim (``--prompts-only``) gives. The training hook refuses the same at the
first dumped micro batch; refusing here saves the cluster start-up and says it before a RayJob is
written.
"""

from __future__ import annotations

from verl_consistency.entrypoints.run.overrides import RunKind, UserOverride

STRATEGY_KEY = "actor_rollout_ref.actor.strategy"

MICRO_BATCH_KEYS = (
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
)
"""The micro batch sizes a collection run takes from the user (FSDP: one lane per request)."""


def refusals(parsed: list[UserOverride], kind: RunKind) -> list[str]:
    """One line per problem of a Megatron collection run; none for FSDP or a token-level run."""
    strategy = next((ov for ov in parsed if ov.key == STRATEGY_KEY), None)
    if strategy is None or str(strategy.value) != "megatron" or kind is RunKind.TOKEN_LEVEL:
        return []
    problems = [
        f"refused `{ov.text}`: with {STRATEGY_KEY}=megatron the run needs {ov.key}=1 (Megatron's "
        "forward_step is dumped whole, so several samples would share one dump; per-request lanes "
        "cut FSDP micro batches only)"
        for ov in parsed
        if ov.key in MICRO_BATCH_KEYS and str(ov.value) != "1"
    ]
    if kind is RunKind.RIDE_ALONG:
        problems.append(
            f"refused `{strategy.text}` in a ride-along run (the default): Megatron's training dump "
            "covers each micro batch whole, and a ride-along forward covers prompt + response, so "
            "its rows would not be what vLLM's prefill computed. Pass --prompts-only (the recipe: "
            "the forward covers the prompt only), or use the FSDP actor for a ride-along run"
        )
    return problems
