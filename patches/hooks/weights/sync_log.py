"""Where each process of a weight sync writes its record, and whether the check is on (issue 42).

One line per sync in ``<run>/weights/{export,held}-<pid>.jsonl`` (``contracts/weight_records.py``):
on when ``$VERL_CONSISTENCY_RUN_DIR`` names a run folder (every ``verl-consistency run``) and
``$VERL_CONSISTENCY_WEIGHT_CHECK`` is not ``0``. A sync is rare, so each record opens, appends and
closes its file: a killed process loses nothing it wrote before.

A record is written once its prints are read back from the device, and that read waits for the
device: on a weight sync's path it would hold the sync for the device's share of the check (on
an H100, 2.6-3.4 ms of a side's 13-20 ms: ``bench/results/gpu-2026-12-07d/``, ``read_s``). So the sync only
launches the sums and hands the read and the write to one writer thread per process
(:func:`write_later`), in order; the sync goes on while the device finishes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_consistency.contracts import env
from verl_consistency.contracts.process_local import ProcessLocal, dist_rank
from verl_consistency.contracts.records import JsonlWriter
from verl_consistency.contracts.weight_records import WEIGHTS_DIR, WeightSyncRecord, log_name

if TYPE_CHECKING:
    from verl_consistency.patches.hooks.weights.fingerprint import Pending

_WRITER = ProcessLocal(
    lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="verl-consistency-weights")
)
"""This process's one writer thread (a forked child gets its own: a parent's threads do not fork)."""


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


def write_later(folder: Path, reads: Sequence[Pending], build: Callable[..., WeightSyncRecord]) -> None:
    """Write ``build(*prints)`` once each of ``reads`` is read: on this process's writer thread, so
    that the sync does not wait for the device; here and now where a device has no event to wait
    on. A record that cannot be written is said on stderr; the sync itself goes on."""

    def job() -> None:
        try:
            write(folder, build(*[p.read() for p in reads]))
        except Exception as err:  # a diagnostic must not stop the training it watches
            print(
                f"verl-consistency weight check: a record for {folder} was not written ({err!r}); "
                "the postprocess names the sync it lacks",
                file=sys.stderr,
            )

    if all(p.readable_elsewhere for p in reads):
        _WRITER.get().submit(job)
    else:
        job()


def drain() -> Any:
    """Wait until every record handed to the writer thread is written (tests; a process that ends)."""
    return _WRITER.get().submit(lambda: None).result()
