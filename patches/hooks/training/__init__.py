"""Hooks that run in verl's training processes: the trainer (driver) and its actor ranks.

``micro_batch_dump`` (one msprobe step per micro batch; its process-wide session in
``dump_session``), ``prompt_rows`` (each request's prompt rows of a ride-along forward),
``prompts_only`` (the PROMPTS_ONLY trim), ``next_token`` (the output row), ``token_mismatch`` and
``token_figures`` (the per-request token records), ``older_weights`` (a stale request's forward at
its rollout's weights) and ``weight_sync`` (the label of the weights each side holds). They never
import the rollout room; the per-request msprobe dumps come from ``patches.hooks.lanes``.
"""
