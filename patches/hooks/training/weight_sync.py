"""Which weights each side computed with: the label of the last weight sync (issue 35).

Under RL the weights move. A prefill and a training forward compare only when they ran the same
weights, so every record says which (``weight_version`` in ``contracts/records.py``) and the
pairing pairs equal versions only (``postprocess/pairing/weight_versions.py``).

**The label is verl's own.** verl 0.8.0 and 0.9.1 hand every weight sync a ``global_steps``
(``ActorRolloutRefWorker.update_weights(global_steps)``, ``workers/engine_workers.py``, which
passes it on to ``vLLMAsyncRollout.update_weights``; the separate pools' checkpoint engine
passes the same number to ``CheckpointEngineWorker.update_weights``), and the vLLM server keeps
it as the ``global_steps`` of each output (``vllm_async_server.py`` ``set_global_steps``). V1's
trainer calls ``global_steps`` "the model weight version" (``trainer_base.py`` L1967): its sync
trainer syncs with label 0 at start-up (``on_init_end``) and with label ``s`` after step ``s``'s
update (``on_step_end``), so step ``s`` generates and recomputes log-probs with version ``s - 1``
on both sides. 0.8.0's fully-async trainer labels its syncs with ``current_param_version``.

* **vLLM side** (the worker process that runs the model): ``patches/hooks/rollout/weight_sync.py``
  (its own process, its own room); the label's spelling is ``contracts/weight_labels.py``'s.
* **Trainer side** (the actor worker's process): ``update_weights`` calls :func:`weights_sent`
  before it sends; ``micro_batch_dump.batch_dumper`` stamps every dumped forward with
  :func:`trainer_version` and counts each ``forward_backward_batch`` that trains
  (:func:`note_update`: an optimizer step follows it).

**An optimizer step after the last sync.** Its weights are no sync's: verl's update_actor with
several mini-batches, or a fully-async trainer that syncs every ``trigger_parameter_sync_step``
steps, runs forwards on weights vLLM never receives. Such a forward carries the last label and
``unsynced_updates`` > 0, and never pairs (``weights_differ``). Counting with "label + k" instead
would collide with the next sync's label whenever that sync comes after more than one update.

Before the first sync a process has no version (None: older logs and the recipe's format carry
none either, and the pairing pairs them as before). State is per process, as verl's is: each
trainer rank holds its own engine.

Nothing here imports torch, verl or vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_consistency.contracts.process_local import ProcessLocal
from verl_consistency.contracts.weight_labels import label


@dataclass
class _State:
    sent: int | None = None
    unsynced: int = 0


_STATE = ProcessLocal(_State)
"""This process's state; a forked child starts with none (its parent's syncs are not its own)."""


def _state() -> _State:
    return _STATE.get()


def weights_sent(global_steps: object) -> None:
    """Trainer: the weights the engine holds now go to vLLM under ``global_steps``."""
    st = _state()
    st.sent = label(global_steps)
    st.unsynced = 0


def note_update() -> None:
    """Trainer: a training ``forward_backward_batch`` ran, and verl's optimizer step follows it."""
    _state().unsynced += 1


def trainer_version() -> tuple[int | None, int]:
    """Trainer: (the label of the last sync sent, optimizer steps taken since)."""
    st = _state()
    return st.sent, st.unsynced


def reset_for_tests() -> None:
    _STATE.reset()
