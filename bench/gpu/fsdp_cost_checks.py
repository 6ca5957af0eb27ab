"""What ``bench/gpu/fsdp_cost.py`` checks: its arguments, each dumped pass's dumps, and which lane path ran.

Apart from the bench so that each stays a readable size; ``tests/test_bench_fsdp_cost.py`` tests
these checks against dumps laid out as the training hook lays them out.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Rep:
    """One timed ``infer_batch`` over every request."""

    label: str  # "dumps", "dumps-inline", "off" or "off-after"
    micro_batch: int
    index: int
    wall_s: float | None = None
    peak_gib: float | None = None
    steps: int = 0
    lane_folders: int = 0
    requests_dumped: int = 0
    bytes_dumped: int = 0
    problems: list[str] = field(default_factory=list)
    error: str | None = None
    fronts: dict[str, int] = field(default_factory=dict)
    """Which front ``msprobe_lanes.install`` put in place for this pass's steps, and how often."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny Qwen2 and prompts of 8-64 tokens (CPU check)")
    ap.add_argument("--model", type=Path, help="an HF Qwen2 folder to use instead of building a random one")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--min-len", type=int, help="shortest prompt (default 64; 8 with --tiny)")
    ap.add_argument("--max-len", type=int, help="longest prompt (default 512; 64 with --tiny)")
    ap.add_argument(
        "--micro-batches", default="1,8", help="comma-separated, the first must be 1 (e.g. 1,8,16)"
    )
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per micro batch and pass kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, help="model and dump folders (default: a new temporary folder)")
    ap.add_argument("--keep-dumps", action="store_true", help="keep each pass's dump under WORK/reps/")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=540.0,
        help="seconds from the start: a pass that would end later is skipped",
    )
    ap.add_argument(
        "--out", type=Path, default=Path("fsdp-cost.json"), help="JSON result (and .txt beside it)"
    )
    ap.add_argument(
        "--lanes-path",
        choices=("auto", "fanout"),
        default="auto",
        help="msprobe_lanes.DEFAULT_PATH: auto (one pass for all lanes, issue 32) or fanout (as before)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        help="after the timed passes, profile one more dumped pass per micro batch above 1 (cProfile "
        "tables to this file)",
    )
    ap.add_argument(
        "--inline-write-too",
        action="store_true",
        help="after the dumped passes, as many with the lanes' files written in the training process "
        "(VERL_CONSISTENCY_LANE_WRITE=inline: before issue 43's lane writer), at each micro batch above 1",
    )
    ap.add_argument(
        "--no-split",
        action="store_true",
        help="skip the last dumped pass per micro batch above 1 with the host clocks (where the added "
        "time goes: the lanes' per-tensor step and write, Python's collector, msprobe's hook walk)",
    )
    args = ap.parse_args(argv)
    try:
        args.micro_batches = [int(x) for x in args.micro_batches.split(",")]
    except ValueError:
        ap.error(f"--micro-batches {args.micro_batches!r}: give comma-separated integers, e.g. 1,8")
    if (
        args.micro_batches[0] != 1
        or min(args.micro_batches) < 1
        or len(set(args.micro_batches)) != len(args.micro_batches)
    ):
        ap.error(
            "--micro-batches: distinct positive sizes, the first 1 (the ratios are against micro batch 1)"
        )
    args.min_len = args.min_len or (8 if args.tiny else 64)
    args.max_len = args.max_len or (64 if args.tiny else 512)
    if not 2 <= args.min_len <= args.max_len:
        ap.error("--min-len/--max-len: need 2 <= min <= max (PROMPTS_ONLY needs two prompt tokens)")
    if any(args.requests % mb for mb in args.micro_batches) or args.reps < 1:
        ap.error(
            f"--requests {args.requests} must be a multiple of every micro batch {args.micro_batches} "
            "(verl asserts it: data size must be divisible by ... micro_batch_size_per_gpu); --reps >= 1"
        )
    return args


def harvest(lay: Any, into: Path, log_offset: int, expected: dict[str, int], rep: Rep) -> int:
    """Move this pass's step folders out of the process's dump folder into ``into``, count what they
    hold, and check them (:func:`check_dumps`). ``expected``: request id -> prompt tokens. Returns
    the records log's new offset."""
    from verl_consistency.contracts import layout, records

    dump_dir = layout.process_dump_dir(lay.actor_dir)
    shutil.rmtree(into, ignore_errors=True)  # a kept dump of an earlier bench in the same --work
    into.mkdir(parents=True)
    steps = sorted(p for p in dump_dir.glob("step*") if p.is_dir()) if dump_dir.is_dir() else []
    for step in steps:
        shutil.move(str(step), str(into / step.name))
    rep.steps = len(steps)
    rep.lane_folders = sum(1 for p in into.glob("step*/*/req*") if p.is_dir())
    rep.bytes_dumped = sum(f.stat().st_size for f in into.rglob("*") if f.is_file())
    log = dump_dir / records.UPDATE_ACTOR_LOG
    new = b""
    if log.is_file():
        with log.open("rb") as fh:
            fh.seek(log_offset)
            new = fh.read()
    check_dumps(into, [json.loads(line) for line in new.splitlines()], expected, rep)
    return log_offset + len(new)


def dumped_tokens(dump_json: Path) -> int | None:
    """The token count of the first decoder layer's input in an msprobe dump (THD: ``[1, T, hidden]``)."""
    data = json.loads(dump_json.read_text()).get("data", {})
    for name, item in data.items():
        if ".layers.0.input_layernorm." in name and ".forward" in name:
            shape = item["input_args"][0]["shape"]
            return int(shape[-2])
    return None


def check_dumps(into: Path, recs: list[dict[str, Any]], expected: dict[str, int], rep: Rep) -> None:
    """Every request in exactly one dump, each dump holding that request's rows (its prompt's
    token count), as many lane folders and steps as verl's micro batches imply."""
    dumped: list[str] = []
    for rec in recs:
        ids = rec.get("request_ids", [])
        lane_ids = rec.get("lane_request_ids")
        folders = [(f"req{k}", rid) for k, rid in enumerate(lane_ids)] if lane_ids else [("", ids[0])]
        dumped += [rid for _, rid in folders]
        if lane_ids and len(lane_ids) != len(ids):
            rep.problems.append(f"step {rec.get('step')}: {len(lane_ids)} lanes for {len(ids)} requests")
        for sub, rid in folders:
            path = into / f"step{rec['step']}" / f"rank{rec.get('rank', 0)}" / sub / "dump.json"
            got = dumped_tokens(path) if path.is_file() else None
            if got != expected.get(rid):
                rep.problems.append(
                    f"{path}: {got} tokens dumped for request {rid}, its prompt has {expected.get(rid)}"
                )
    rep.requests_dumped = len(dumped)
    missing = set(expected) - set(dumped)
    if missing or len(dumped) != len(expected):
        rep.problems.append(f"{len(dumped)} dumps for {len(expected)} requests, {len(missing)} missing")
    # verl cuts the batch in order into micro batches of micro_batch rows (the last may be short);
    # a micro batch of one row is dumped whole (a step without lanes), any other one lane per row
    n = len(expected)
    sizes = [min(rep.micro_batch, n - i) for i in range(0, n, rep.micro_batch)]
    want_lanes = sum(s for s in sizes if s > 1)
    if rep.lane_folders != want_lanes:
        rep.problems.append(f"{rep.lane_folders} req* lane folders under {into}, expected {want_lanes}")
    if rep.steps != len(sizes):
        rep.problems.append(f"{rep.steps} step folders under {into}, expected {len(sizes)}")


def count_fronts() -> Counter[str]:
    """Count the fronts ``msprobe_lanes.install`` puts in place from now on in this process, by
    class name (the training hook calls it through the module, so the wrapper sees every step)."""
    from verl_consistency.patches.hooks.lanes import msprobe_lanes

    seen: Counter[str] = Counter()
    install = msprobe_lanes.install

    def counted(service: Any, lanes: Any, path: Any = None) -> Any:
        front = install(service, lanes, path)
        seen[type(front).__name__] += 1
        return front

    msprobe_lanes.install = counted  # type: ignore[assignment]
    return seen


def check_fronts(rep: Rep, lanes_path: str) -> None:
    """A dumped pass whose micro batches hold several rows went through the lane path asked for:
    ``auto`` is the one-pass ``LaneStats`` (statistics), ``fanout`` one msprobe collector per lane."""
    if not rep.label.startswith("dumps") or rep.micro_batch == 1 or rep.wall_s is None:
        return
    want = "LaneStats" if lanes_path == "auto" else "LaneFanout"
    if set(rep.fronts) != {want}:
        got = dict(rep.fronts)
        rep.problems.append(f"lane fronts {got}: expected only {want} (--lanes-path {lanes_path})")
