"""Trainer side of the weight check: fingerprint every tensor a weight sync exports (issue 42).

verl's ``ActorRolloutRefWorker.update_weights`` (``workers/engine_workers.py``, both pin sets)
takes the engine's ``get_per_tensor_param()`` stream (full HF-named tensors: FSDP shards gathered,
Megatron converted, cast as verl syncs them) and hands it to the colocated rollout
(``ServerAdapter.update_weights``) or to the checkpoint engine of the separate pools. Patch 0007
wraps that stream with :func:`exporting` at the one place both paths share, so what is
fingerprinted is exactly what verl sends, before any transport can lose or change it (row sums
alone: this print is compared with each arrival, and a transport that changes, truncates or
shifts a tensor moves them; the layout checks are vLLM's, against what it should hold). Each
tensor's sums are taken as it passes (it may be freed right after), and the record is written
when the stream ends: ``<run>/weights/export-<pid>.jsonl``, one line per sync
(``contracts/weight_records.py``).

On when ``$VERL_CONSISTENCY_RUN_DIR`` names a run folder (every ``verl-consistency run``) and
``$VERL_CONSISTENCY_WEIGHT_CHECK`` is not ``0`` (``weights/sync_log.py``); otherwise the stream
passes untouched.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from verl_consistency.contracts.records import now
from verl_consistency.contracts.weight_labels import label
from verl_consistency.contracts.weight_records import WeightSyncRecord
from verl_consistency.patches.hooks.weights.fingerprint import Collector
from verl_consistency.patches.hooks.weights.sync_log import process_rank, weights_dir, write


def exporting(params: Iterable[tuple[str, Any]], global_steps: object) -> Iterator[tuple[str, Any]]:
    """verl's per-tensor stream, unchanged, fingerprinted on its way out under the sync's label."""
    folder = weights_dir()
    if folder is None:
        yield from params
        return
    collector = Collector()
    for name, tensor in params:
        collector.add(name, tensor, cols=False)  # compared with what arrives: the row sums tell
        yield name, tensor
    tensors = collector.finish()
    write(
        folder,
        WeightSyncRecord(
            timestamp=now(),
            pid=os.getpid(),
            rank=process_rank(),
            side="export",
            version=label(global_steps),
            tensors=tensors,
            seconds=round(collector.seconds, 4),
        ),
    )
