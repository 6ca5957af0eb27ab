"""How both sides spell a weight sync's label: verl's own ``global_steps``, as an int (issue 35).

The trainer notes the label of the weights it sends (``patches/hooks/training/weight_sync.py``), the
rollout hands it to each vLLM worker under :data:`KWARG`, and the worker notes it before loading
(``patches/hooks/rollout/weight_sync.py``); the records of both sides then carry the same number
(``records.py``'s ``weight_version``), and the pairing pairs equal ones only. The two processes keep
their own state; what they must agree on is here.
"""

from __future__ import annotations

KWARG = "verl_consistency_weight_version"
"""The keyword that ``vLLMAsyncRollout.update_weights`` adds to the workers' ``update_weights_from_ipc``."""


def label(global_steps: object) -> int | None:
    """verl's label as an int; None for a sync without one (``update_weights()`` called bare)."""
    if global_steps is None or isinstance(global_steps, bool):
        return None
    try:
        return int(global_steps)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
