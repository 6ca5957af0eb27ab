"""Host time of a one-pass dumped step per module call, on CPU (issue 32: what a dumped step costs
beyond its forward, once the statistics are batched).

Why: on the H200 a dumped FSDP log_prob pass was still ~3x its undumped pass, and what is left is
host Python per module call (msprobe's hooks, our per-tensor queueing, the lanes' files). On a
2-core CPU the forward of ``bench/gpu/fsdp_cost.py --tiny`` (2 layers) is dwarfed by verl's
``gc.collect`` per pass and by the machine's load, so this bench isolates the host work: the
vLLM-layout Qwen2 stand-in (``bench/support/vllm_qwen2.py``, as ``bench_lanes.py``) at Qwen2-0.5B's
depth (24 layers, ~290 module calls a step) with tiny widths and short prompts, so the forward
costs little and the dumped step is nearly all hook and lane work. torch runs one thread.

It prints a ``ratio lane-host`` line (dumped over undumped, wall and CPU) and, per step, the
medians of the wall and of the process CPU time (steadier than the wall on a shared machine),
undumped (after msprobe's hooks are registered: ``off-after``) and dumped through the one-pass lanes
(``lane_collector.LaneStats``, every request a lane), the difference per module call, the time in
Python's garbage collector during the dumped steps, and where the lanes' own time goes
(``_analyze_tensor``, ``LaneStatQueue.add``, ``write_json``).

A dumped step runs with the automatic collector off from its start to the end of msprobe's write,
as the training side's ``BatchDumper`` holds it (``patches/hooks/training/gc_pause.py``, issue 43), and
its one young collection after the step counts with the collections; ``--keep-gc`` leaves the
collector on (the step as before issue 43).

A dumped step's lane files are rendered and written by the lane writer's helper process, as the
training side's ``BatchDumper`` does for FSDP (``patches/hooks/lanes/lane_writer.py``, issue 43): the
helper writes while the next (undumped) step runs, and is drained after that step, outside its
timing; what the drain still waited for is added to the dumped step (``dumped+wait``), and the
helper's own CPU time is printed. ``--inline-write`` writes in the bench's process (before issue 43's
helper).

``--msprobe-hooks`` puts msprobe's own module hooks back in the dumped steps (``lean_hooks.disengage``
after the step's start): the lanes' step before issue 43's lean hook pair, in the same checkout.

Run: ``OMP_NUM_THREADS=1 python -m bench.bench_lane_host [--lanes 8] [--reps 7] [--profile F] [--keep-gc]
[--msprobe-hooks] [--inline-write]``.
To compare two checkouts, run it in each, alternately, in one session.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_lanes import _stand_in
from bench.bench_overhead_gpu import SIZES, msprobe_config
from bench.support.host_clock import HostClock, per_lane_line, split_line

SHAPE = (24, 64, 4, 2, 128, 512)
"""layers, hidden, heads, kv heads, intermediate, vocab: Qwen2-0.5B's depth, tiny widths."""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lanes", type=int, default=8, help="requests in the step, each captured")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--profile", type=Path, help="cProfile the dumped steps into this text file")
    ap.add_argument(
        "--keep-gc",
        action="store_true",
        help="leave the automatic collector on in the dumped steps (the training side pauses it)",
    )
    ap.add_argument(
        "--msprobe-hooks",
        action="store_true",
        help="msprobe's own module hooks in the dumped steps, not the lean pair (lean_hooks.py)",
    )
    ap.add_argument(
        "--inline-write",
        action="store_true",
        help="write the lanes' files in this process, not the lane writer's helper (lane_writer.py)",
    )
    args = ap.parse_args(argv)

    import torch
    from msprobe.pytorch import PrecisionDebugger

    from bench.support.vllm_qwen2 import forward_step
    from verl_consistency.patches.hooks.lanes import lean_hooks, msprobe_lanes
    from verl_consistency.patches.hooks.lanes.lane_writer import LaneWriter
    from verl_consistency.patches.hooks.training import gc_pause

    torch.set_num_threads(1)
    SIZES["deep"] = SHAPE
    shape = argparse.Namespace(device="cpu", size="deep", lanes=args.lanes, min_len=4, max_len=16, seed=0)
    model, ids, positions, tokens = _stand_in(shape, torch.float32)
    order, lens = list(tokens), list(tokens.values())
    lanes = msprobe_lanes.packed_lanes(tokens, order, order, request_rows=True)
    work = Path(tempfile.mkdtemp(prefix="bench-lane-host-"))
    (work / "msprobe.json").write_text(json.dumps(msprobe_config("selective", work / "dump")))
    clock = HostClock()
    walls: dict[str, list[float]] = {"off": [], "off-after": [], "dumped": []}
    cpus: dict[str, list[float]] = {"off": [], "off-after": [], "dumped": []}
    debugger: Any = None
    pause, resume = (_nothing, _nothing) if args.keep_gc else (gc_pause.pause, gc_pause.resume)
    helper = None if args.inline_write else LaneWriter()
    waits: list[float] = []

    def start_training_step() -> None:
        """As the training side's ``BatchDumper`` starts a dumped FSDP micro batch: the lanes, the
        helper that writes their files, then msprobe."""
        front = msprobe_lanes.install(debugger.service, lanes)
        front.writer = helper
        debugger.start(model=model)

    def drain_and_clean() -> None:
        """Outside the timing: what the helper still writes of the last dumped step (its wait
        kept in ``waits``), then the step folders removed."""
        if helper is not None:
            begin = time.perf_counter()
            helper.drain()
            waits.append(time.perf_counter() - begin)
        for folder in (work / "dump").glob("step*"):
            shutil.rmtree(folder)

    def step(label: str, prof: cProfile.Profile | None = None) -> None:
        dump = label == "dumped"
        cpu, wall = time.process_time(), time.perf_counter()
        clock.on = dump
        if prof:
            prof.enable()
        if dump:
            # the collector off, as the training side's BatchDumper.start does (gc_pause.py)
            pause(debugger.service.hook_manager)
            start_training_step()
            if args.msprobe_hooks:
                lean_hooks.disengage(debugger.service)
        with torch.no_grad():
            forward_step(model, ids, positions, lens)
        if dump:
            debugger.stop()
            debugger.step()
            resume()  # and its stop, after msprobe's write
        if prof:
            prof.disable()
        clock.on = False
        walls[label].append(time.perf_counter() - wall)
        cpus[label].append(time.process_time() - cpu)
        if not dump:  # the helper wrote the last dumped step while this one ran
            drain_and_clean()

    for _ in range(3):
        step("off")
    walls["off"].clear()
    cpus["off"].clear()
    for _ in range(args.reps):
        step("off")
    # torch.distributed up, as in every verl and vLLM worker: msprobe names the rank's folder once,
    # not at every hook call (its ``_maybe_update_dump_dir`` tests the path until a rank is known)
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{work}/dist-store", rank=0, world_size=1)
    debugger = PrecisionDebugger(config_path=str(work / "msprobe.json"))
    start_training_step()  # warm-up, and the module calls a step makes
    if args.msprobe_hooks:
        lean_hooks.disengage(debugger.service)
    with torch.no_grad():
        forward_step(model, ids, positions, lens)
    debugger.stop()
    debugger.step()
    if helper is not None:
        helper.drain()
    (first,) = (work / "dump").glob("step*/*/req0/dump.json")
    calls = sum(1 for name in json.loads(first.read_text())["data"] if name.startswith("Module."))
    shutil.rmtree(work / "dump")
    step("dumped")
    drain_and_clean()
    prof = cProfile.Profile() if args.profile else None
    walls["dumped"].clear()
    cpus["dumped"].clear()
    waits.clear()
    clock.reset()
    helper_cpu = _cpu_seconds(helper)
    for _ in range(args.reps):
        step("dumped", prof)
        step("off-after")
    if helper is not None:
        helper_cpu = _cpu_seconds(helper) - helper_cpu
        helper.close()
        walls["dumped+wait"] = [w + d for w, d in zip(walls["dumped"], waits, strict=True)]
        cpus["helper"] = [helper_cpu / args.reps]
    dist.destroy_process_group()
    shutil.rmtree(work, ignore_errors=True)
    _report(args, calls, sum(lens), walls, cpus, clock)
    if prof and args.profile:
        with args.profile.open("w") as out:
            stats = pstats.Stats(prof, stream=out)
            stats.sort_stats("tottime").print_stats(45)
            stats.sort_stats("cumulative").print_stats(80)


def _nothing(*_args: Any) -> None:
    return None


def _cpu_seconds(helper: Any) -> float:
    """The lane writer helper's CPU seconds so far (Linux ``/proc``; 0 without a helper or ``/proc``)."""
    pid = helper.pid if helper is not None else None
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    import os

    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _report(
    args: argparse.Namespace,
    calls: int,
    n_tokens: int,
    walls: dict[str, list[float]],
    cpus: dict[str, list[float]],
    clock: HostClock,
) -> None:
    import torch

    from bench.support.hardware import hardware

    print(f"hardware: {hardware()}")
    wall = {k: statistics.median(v) for k, v in walls.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    print(
        f"deep stand-in ({SHAPE[0]} layers, hidden {SHAPE[1]}), {args.lanes} lanes, {n_tokens} tokens, "
        f"{calls} module calls a step; torch {torch.__version__}, 1 thread; {args.reps} reps, medians"
        + ("; msprobe's own module hooks" if args.msprobe_hooks else "")
    )
    for label in ("off", "off-after", "dumped"):
        print(f"  {label:<10} wall {wall[label] * 1e3:7.1f} ms   cpu {cpu[label] * 1e3:7.1f} ms")
    writes = "in this process (--inline-write)" if args.inline_write else "by the lane writer's helper"
    dumped = "dumped"
    if "dumped+wait" in wall:
        dumped = "dumped+wait"
        print(
            f"  dumped+wait wall {wall[dumped] * 1e3:6.1f} ms   (the helper's wait after the next step "
            f"added; its own cpu {cpu['helper'] * 1e3:.1f} ms a dumped step, on another core)"
        )
    print(f"lane files written {writes}")
    per_wall = (wall[dumped] - wall["off-after"]) / calls * 1e6
    per_cpu = (cpu["dumped"] - cpu["off-after"]) / calls * 1e6
    print(f"host per module call: wall {per_wall:.0f} us, cpu {per_cpu:.0f} us ({dumped} - off-after)")
    print(
        f"ratio lane-host {dumped}/off-after: {wall[dumped] / wall['off-after']:.2f} wall, "
        f"{cpu['dumped'] / cpu['off-after']:.2f} cpu ({args.lanes} lanes, {calls} module calls; cpu)"
    )
    gc_ms = [round(s / args.reps * 1e3, 1) for s in clock.gc_seconds]
    print(f"gc per dumped step: {gc_ms} ms by generation ({clock.gc_count} collections in {args.reps} steps)")
    split = clock.split()
    parts = ", ".join(f"{k} {v / args.reps * 1e3:.1f} ms" for k, v in split.items() if not k.startswith("gc"))
    print(f"lanes per dumped step (collections taken out): {parts}")
    # the mean, not the median: a full collection comes every few steps and is part of the cost
    extra = (sum(walls["dumped"]) - sum(walls["off-after"])) / args.reps
    print("host split per dumped step: " + split_line({k: v / args.reps for k, v in split.items()}, extra, 0))
    print(per_lane_line(clock.per_lane, args.reps) + " per dumped step")


if __name__ == "__main__":
    main()
