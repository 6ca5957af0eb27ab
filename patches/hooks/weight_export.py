"""Trainer side of the weight check: fingerprint every tensor a weight sync exports (issue 42).

verl's ``ActorRolloutRefWorker.update_weights`` (``workers/engine_workers.py``, both pin sets)
takes the engine's ``get_per_tensor_param()`` stream (full HF-named tensors: FSDP shards gathered,
Megatron converted, cast as verl syncs them) and hands it to the colocated rollout
(``ServerAdapter.update_weights``) or to the checkpoint engine of the separate pools. Patch 0007
wraps that stream with :func:`exporting` at the one place both paths share, so what is
fingerprinted is exactly what verl sends, before any transport can lose or change it. Each
tensor's sums are taken as it passes (it may be freed right after), and the record is written
when the stream ends: ``<run>/weights/export-<pid>.jsonl``, one line per sync
(``contracts/weight_records.py``).

On when ``$VERL_CONSISTENCY_RUN_DIR`` names a run folder (every ``verl-consistency run``) and
``$VERL_CONSISTENCY_WEIGHT_CHECK`` is not ``0``; otherwise the stream passes untouched.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from verl_consistency.contracts import env
from verl_consistency.contracts.records import JsonlWriter, now
from verl_consistency.contracts.weight_records import WEIGHTS_DIR, WeightSyncRecord, log_name
from verl_consistency.patches.hooks import weight_sync
from verl_consistency.patches.hooks.weight_fingerprint import Collector


def weights_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """``<run>/weights`` when the check is on in this process, else None."""
    e = os.environ if environ is None else environ
    run_dir = e.get(env.RUN_DIR, "").strip()
    if not run_dir or e.get(env.WEIGHT_CHECK, "1").strip() == "0":
        return None
    return Path(run_dir) / WEIGHTS_DIR


def process_rank() -> int:
    """This process's rank in torch.distributed, else ``$RANK``, else 0."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:
        pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def write(folder: Path, record: WeightSyncRecord) -> None:
    """One line in this process's log (opened, appended, closed: a sync is rare)."""
    writer = JsonlWriter(folder / log_name(record.side, record.pid))
    try:
        writer.write(record)
    finally:
        writer.close()


def exporting(params: Iterable[tuple[str, Any]], global_steps: object) -> Iterator[tuple[str, Any]]:
    """verl's per-tensor stream, unchanged, fingerprinted on its way out under the sync's label."""
    folder = weights_dir()
    if folder is None:
        yield from params
        return
    collector = Collector()
    for name, tensor in params:
        collector.add(name, tensor)
        yield name, tensor
    tensors = collector.finish()
    write(
        folder,
        WeightSyncRecord(
            timestamp=now(),
            pid=os.getpid(),
            rank=process_rank(),
            side="export",
            version=weight_sync.label(global_steps),
            tensors=tensors,
            seconds=round(collector.seconds, 4),
        ),
    )
