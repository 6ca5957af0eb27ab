"""The fields the hooks add to verl's batch on one side of the trainer and read on the other.

A field written by one hook and read by another is a contract between them, so it is named here,
once: the hooks that write it and those that read it import this module, not each other (before,
``next_token`` and ``prompts_only`` imported each other at run time over this one name).
"""

from __future__ import annotations

PREFILL_ROWS = "vc_prefill_rows"
"""Per-row column the PROMPTS_ONLY trim adds (``non_tensor_batch``; a field of each V1 sample): how
many of the row's tokens vLLM's prefill computed, the original prompt, which after the trim is the
whole row (the trimmed ``prompts`` plus the one-token response). ``prompt_rows.PackedLayout`` cuts
the lanes to it; without it (ride-along) the prompt rows come from ``prompts``, as verl reads them;
``next_token`` reads no rollout token from a row that has it."""
