"""What the per-tensor weight check costs a weight sync (issue 42): ``verl_gpu.sh synccost``'s table.

``python bench/gpu/sync_cost_report.py A.log B.log WEIGHTS_DIR [--model NAME]``: A and B are the
driver outputs of two otherwise identical runs, A with ``VERL_CONSISTENCY_WEIGHT_CHECK=0`` and B with
the check on; WEIGHTS_DIR holds B's weight records. ``A.log`` may be ``-``: then only B's own figures
(the check's seconds against the sync that contains them), e.g. from a ride-along's ``run.log``.
verl times each step's sync itself
(``timing_s/update_weights``, read with the same parser ``run`` uses for ``run.json``'s steps); the
check's own seconds per sync are in B's records (the slowest trainer rank plus the slowest vLLM
worker, the two run one after the other within the sync): the time the sync's own threads spent
on it. Since stop 52 the prints are read back from the device off the sync's path (a record's
``read_s``, on its process's writer thread), so those seconds are what the sync can pay; before,
they included waiting for the device, and for the sync's own queued copies. Prints the medians, the
ratio B / A and the check's share of B's sync, with the hardware, as every bench here does.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from pathlib import Path

from verl_consistency.contracts.weight_records import WEIGHTS_DIR, WeightSyncRecord
from verl_consistency.entrypoints.run.step_metrics import parse_line
from verl_consistency.postprocess.compare.weight_check import check

KEY = "timing_s/update_weights"


def sync_seconds(log: Path) -> dict[int, float]:
    """verl's ``timing_s/update_weights`` per step of one driver output."""
    out: dict[int, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        parsed = parse_line(line)
        if parsed is not None and KEY in parsed[1]:
            out[parsed[0]] = parsed[1][KEY]
    return out


def check_seconds(folder: Path) -> tuple[dict[int | None, float], int, int]:
    """Per sync version: the slowest export plus the slowest held record's seconds; tensors and bytes
    of one export (the model's size as synced)."""
    export: dict[int | None, float] = {}
    held: dict[int | None, float] = {}
    tensors = size = 0
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            rec = WeightSyncRecord.model_validate_json(line)
            side = export if rec.side == "export" else held
            side[rec.version] = max(side.get(rec.version, 0.0), rec.seconds)
            if rec.side == "export" and not tensors:
                tensors = len(rec.tensors)
                size = sum(_bytes(p.shape, p.dtype) for p in rec.tensors.values())
    return {v: export[v] + held.get(v, 0.0) for v in export}, tensors, size


def _bytes(shape: list[int], dtype: str) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}.get(dtype, 2)


def exactness(folder: Path) -> str:
    """The weight check's own verdict on B's records (``postprocess/compare/weight_check.py``): a
    cost is only worth reporting for a check that still finds every healthy sync exact."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / WEIGHTS_DIR).symlink_to(folder.resolve())
        result = check(Path(tmp))
    compared = sum(v.compared for v in result.versions)
    differing = result.differing
    head = (
        f"weights: {len(result.versions)} syncs, {compared} tensor prints compared, {len(differing)} differ"
    )
    return "\n".join([head, *(f"  {d.version} {d.tensor}: {d.kind} ({d.detail})" for d in differing[:10])])


def gpu_name() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown GPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a_log", type=Path)
    ap.add_argument("b_log", type=Path)
    ap.add_argument("weights", type=Path)
    ap.add_argument("--model", default="?")
    args = ap.parse_args(argv)
    a = {} if str(args.a_log) == "-" else sync_seconds(args.a_log)
    b = sync_seconds(args.b_log)
    seconds, tensors, size = check_seconds(args.weights)
    mib = size / 2**20
    print(f"weight check cost per sync: {gpu_name()}, model {args.model} ({tensors} tensors, {mib:.0f} MiB)")
    print(f"A (check off) timing_s/update_weights per step: {[round(a[s], 3) for s in sorted(a)]}")
    print(f"B (check on)  timing_s/update_weights per step: {[round(b[s], 3) for s in sorted(b)]}")
    print(
        f"B check's own seconds per sync version: {[round(seconds[v], 4) for v in sorted(seconds, key=str)]}"
    )
    print(exactness(args.weights))
    if not b or not seconds:
        print("incomplete: B logged no update_weights timing or wrote no weight records")
        return 1
    # the first step's sync includes warm-up (allocator, kernels' first launch): reported, left out; the
    # check's version 0 is the sync before step 1, which no step timing holds
    med_b = statistics.median([b[s] for s in sorted(b)[1:]] or list(b.values()))
    med_check = statistics.median(
        [seconds[v] for v in seconds if v not in (None, 0)] or list(seconds.values())
    )
    if a:
        med_a = statistics.median([a[s] for s in sorted(a)[1:]] or list(a.values()))
        print(f"median sync (steps 2+): A {med_a:.3f} s, B {med_b:.3f} s, B / A = {med_b / med_a:.3f}x")
    else:
        print(f"median sync (steps 2+): {med_b:.3f} s (no run without the check to compare)")
    print(f"median check seconds per sync {med_check:.4f} s = {100 * med_check / med_b:.2f} % of B's sync")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
