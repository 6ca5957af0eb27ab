"""Trainer side of the weight check: fingerprint every tensor a weight sync exports (issue 42).

verl's ``ActorRolloutRefWorker.update_weights`` (``workers/engine_workers.py``, both pin sets)
takes the engine's ``get_per_tensor_param()`` stream (full HF-named tensors: FSDP shards gathered,
Megatron converted, cast as verl syncs them) and hands it to the colocated rollout
(``ServerAdapter.update_weights``) or to the checkpoint engine of the separate pools. Patch 0007
wraps that stream with :func:`exporting` at the one place both paths share, so what is
fingerprinted is exactly what verl sends, before any transport can lose or change it. Each
tensor's sums are taken as it passes (it may be freed right after); when the stream ends the final
sums are launched, and the record is written once they are read back, by the process's writer
thread, so the sync does not wait for the device (``weights/sync_log.write_later``):
``<run>/weights/export-<pid>.jsonl``, one line per sync (``contracts/weight_records.py``).

**In which dtype.** verl's FSDP engine sends its fp32 master weights and vLLM holds bf16 (its
loader's ``copy_`` rounds). By default each tensor is printed cast to the dtype vLLM holds, verl's
own ``rollout.dtype``, which patch 0007 passes in: both sums, compared directly with what vLLM
holds (``rollout/weight_held.py`` prints nothing else). That is two prints a sync, not four: the
check costs the sync's time, and a print of each arrival (and of its cast) only tells whether a
wrong tensor changed on the way or in vLLM's loading. ``$VERL_CONSISTENCY_WEIGHT_CHECK_ARRIVALS=1``
asks for that; then this side prints each tensor as sent, row sums alone (compared with each
arrival: a transport that changes, truncates or shifts a tensor moves them).

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
from verl_consistency.patches.hooks.weights.sync_log import (
    arrivals_printed,
    process_rank,
    weights_dir,
    write_later,
)

ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
"""verl's short names for a dtype (``PrecisionType``), as its ``rollout.dtype`` may give them."""


def torch_dtype(name: object) -> Any | None:
    """The torch dtype that verl's ``rollout.dtype`` names (``"bfloat16"``, ``"bf16"``, a dtype), or
    None when it names none: then the export is printed as sent, and the postprocess lists each
    tensor vLLM holds in another dtype as not checked, saying so."""
    import torch

    if isinstance(name, torch.dtype):
        return name
    key = str(name or "").strip().removeprefix("torch.").lower()
    found = getattr(torch, ALIASES.get(key, key), None) if key else None
    return found if isinstance(found, torch.dtype) else None


def exporting(
    params: Iterable[tuple[str, Any]], global_steps: object, held_dtype: object = None
) -> Iterator[tuple[str, Any]]:
    """verl's per-tensor stream, unchanged, fingerprinted on its way out under the sync's label:
    in ``held_dtype`` (verl's ``rollout.dtype``), or as sent when vLLM prints its arrivals."""
    folder = weights_dir()
    if folder is None:
        yield from params
        return
    collector = Collector()
    as_sent = arrivals_printed()
    target = None if as_sent else torch_dtype(held_dtype)
    for name, tensor in params:
        # as sent: compared with what arrives (the row sums tell); else with what vLLM holds
        collector.add(name, tensor, target, cols=not as_sent)
        yield name, tensor
    pending = collector.launch()
    version, rank, on_path = label(global_steps), process_rank(), round(collector.seconds, 4)

    def record(tensors: dict[str, Any]) -> WeightSyncRecord:
        return WeightSyncRecord(
            timestamp=now(),
            pid=os.getpid(),
            rank=rank,
            side="export",
            version=version,
            tensors=tensors,
            seconds=on_path,
            read_s=round(pending.seconds, 4),
        )

    write_later(folder, [pending], record)
