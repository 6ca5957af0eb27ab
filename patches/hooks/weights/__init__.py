"""The weight check's parts that both processes of a sync use (issue 42).

``fingerprint`` (an exact, cheap per-tensor fingerprint, summed on the device) and ``sync_log``
(where a process writes its record of a sync, and whether the check is on). The trainer side is
``training/weight_export``, the vLLM side ``rollout/weight_held``; they never import each other,
and they agree on the records through ``verl_consistency.contracts.weight_records``.
Nothing here imports torch at import time.
"""
