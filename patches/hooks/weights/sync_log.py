"""Where each process of a weight sync writes its record, and whether the check is on (issue 42).

One line per sync in ``<run>/weights/{export,held}-<pid>.jsonl`` (``contracts/weight_records.py``):
on when ``$VERL_CONSISTENCY_RUN_DIR`` names a run folder (every ``verl-consistency run``) and
``$VERL_CONSISTENCY_WEIGHT_CHECK`` is not ``0``. A sync is rare, so each record opens, appends and
closes its file: a killed process loses nothing it wrote before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from verl_consistency.contracts import env
from verl_consistency.contracts.process_local import dist_rank
from verl_consistency.contracts.records import JsonlWriter
from verl_consistency.contracts.weight_records import WEIGHTS_DIR, WeightSyncRecord, log_name


def weights_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """``<run>/weights`` when the check is on in this process, else None."""
    e = os.environ if environ is None else environ
    run_dir = e.get(env.RUN_DIR, "").strip()
    if not run_dir or e.get(env.WEIGHT_CHECK, "1").strip() == "0":
        return None
    return Path(run_dir) / WEIGHTS_DIR


def arrivals_printed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether vLLM also fingerprints each tensor as it arrives (``$VERL_CONSISTENCY_WEIGHT_CHECK_ARRIVALS``
    is ``1``), and the trainer prints what it sends in the dtype it sends. Read by both sides, so
    that their prints are of the same bytes."""
    e = os.environ if environ is None else environ
    return e.get(env.WEIGHT_CHECK_ARRIVALS, "").strip() == "1"


def process_rank() -> int:
    """This process's rank in torch.distributed, else ``$RANK``, else 0."""
    rank = dist_rank()
    if rank is not None:
        return rank
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
