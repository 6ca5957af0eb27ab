"""The vLLM side of the weight versions: which sync's weights this worker process computes with.

verl's rollout adds the sync's label to the workers' ``update_weights_from_ipc`` kwargs
(:func:`sync_kwargs`); its worker extension (``vLLMColocateWorkerExtension.update_weights_from_ipc``)
receives it through that one added keyword and calls :func:`weights_loaded`;
``dispatch.DispatchLogger`` stamps every step with :func:`loaded_version`. The label and its
spelling are the contracts' (``contracts/weight_labels.py``); the trainer's side is
``patches/hooks/training/weight_sync.py``.

Before the first sync a worker has no version (None: older logs and the recipe's format carry none
either, and the pairing pairs them as before). State is per process, as verl's is: each vLLM worker
loads its own shard.

Nothing here imports torch, verl or vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_consistency.contracts.process_local import ProcessLocal
from verl_consistency.contracts.weight_labels import KWARG, label


@dataclass
class _State:
    loaded: int | None = None


_STATE = ProcessLocal(_State)
"""This process's state; a forked child starts with none (its parent's syncs are not its own)."""


def _state() -> _State:
    return _STATE.get()


def sync_kwargs(global_steps: object) -> dict[str, int | None]:
    """What the rollout adds to the workers' ``update_weights_from_ipc`` call."""
    return {KWARG: label(global_steps)}


def weights_loaded(global_steps: object) -> None:
    """vLLM worker: the weights being loaded now are sync ``global_steps``'s.

    A sync without a label leaves the worker's version unknown (None) rather than keeping the
    old one: its weights are no longer that label's.
    """
    _state().loaded = label(global_steps)


def loaded_version() -> int | None:
    """vLLM worker: the label of the last sync it loaded (None before any, or after an unlabelled one)."""
    return _state().loaded


def reset_for_tests() -> None:
    _STATE.reset()
