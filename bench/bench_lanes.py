"""What does a dumped step with per-request lanes cost, on both sides? Issue 32's figures, CPU and CUDA.

Two parts, each printing one ``ratio`` line against the undumped pass measured in the same run
(medians; beside them the ratio of the fastest repetitions, the steadier figure on a shared machine):

``vllm``      a vLLM prefill step of N captured requests (default 32), each in a lane of its own:
              the vLLM-layout Qwen2 stand-in (``tests/fixtures/vllm_qwen2.py``, the model shapes of
              ``bench_overhead_gpu.SIZES``) started the way the dispatch hook starts it
              (``msprobe_lanes.packed_lanes(..., request_rows=True)``, ``request_scope.start_lanes``),
              msprobe statistics L0 (``bench_overhead_gpu.msprobe_config``). Timed in one process:
              the undumped step first (msprobe not yet started: its hooks stay registered once it
              has), then the dumped step through the one-pass path (``lane_collector.LaneStats``)
              alternating with the fan-out (``msprobe_lanes.DEFAULT_PATH = "fanout"``, one msprobe
              collector per lane: the path before issue 32) and with msprobe's own cut of ONE of
              the requests (``request_scope.start_step``, ``one-request``: the path before lanes,
              and the floor of any path that keeps msprobe's per-module walk), then the undumped
              step again with msprobe's hooks idle (``off-after``). Every dumped step must write
              one ``req{k}`` folder per lane (``one-request``: one ``dump.json``).
``training``  verl's FSDP log_prob pass (``bench/gpu/fsdp_cost.py``) at micro batch 8, with and
              without dumps, in the demo venv (patched verl; ``$VERL_CONSISTENCY_DEMO_VENV``, which
              ``make bench`` sets, else ``.cache/demo-venv``); its ``ratio mb8 dumps/off`` line,
              printed again with the hardware.

Run: ``python -m bench.bench_lanes`` (``make bench``; CPU: the ``tiny`` shape, 32 prompts of 16-64
tokens, about 1-2 minutes on 2 cores). On a GPU, ``python -m bench.bench_lanes --part vllm --device
cuda`` (Qwen2-0.5B's shape in bf16, prompts of 64-512 tokens, one SDPA kernel per layer);
``bash bench/gpu/verl_gpu.sh lanes`` runs that on the device, and ``... cost`` the training part.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_overhead_gpu import SIZES, model_config, msprobe_config

REPO = Path(__file__).resolve().parent.parent


def _prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> dict[str, list[int]]:
    """N prompts, lengths spread evenly over [lo, hi], ids as the engine rewrites them (8 hex)."""
    rng = random.Random(seed)
    lengths = [lo + round(i * (hi - lo) / max(n - 1, 1)) for i in range(n)]
    rng.shuffle(lengths)
    ids = [f"req-{i:03d}-0123abcd" for i in range(n)]
    return {rid: [rng.randrange(1, vocab) for _ in range(m)] for rid, m in zip(ids, lengths, strict=True)}


def _stand_in(args: argparse.Namespace, dtype: Any) -> tuple[Any, Any, Any, dict[str, int]]:
    """The vLLM-layout model on ``args.device`` and one packed prefill step of ``args.lanes``
    prompts: (model, token ids, positions, tokens per request in packing order)."""
    import torch

    from bench.support.vllm_qwen2 import Qwen2ForCausalLM, pack

    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    with torch.device(args.device):  # one SDPA kernel per layer on a GPU (a per-request loop times Python)
        model = Qwen2ForCausalLM(model_config(args.size), one_kernel=args.device == "cuda").eval()
    prompts = _prompts(args.lanes, args.min_len, args.max_len, SIZES[args.size][5], args.seed)
    ids, positions, lens = pack(list(prompts.values()))
    return model, ids.to(args.device), positions.to(args.device), dict(zip(prompts, lens, strict=True))


def vllm_part(args: argparse.Namespace) -> dict[str, Any]:
    """Time the undumped, one-pass and fan-out prefill steps in this process; returns their walls."""
    import torch
    from msprobe.pytorch import PrecisionDebugger

    from bench.support.vllm_qwen2 import forward_step
    from verl_consistency.patches.hooks.lanes import msprobe_lanes
    from verl_consistency.patches.hooks.rollout.request_scope import start_lanes, start_step

    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model, ids, positions, tokens = _stand_in(args, dtype)
    order, lens = list(tokens), list(tokens.values())
    lanes = msprobe_lanes.packed_lanes(tokens, order, order, request_rows=True)
    work = Path(tempfile.mkdtemp(prefix="bench-lanes-"))
    (work / "msprobe.json").write_text(json.dumps(msprobe_config("selective", work / "dump")))

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def step(path: str | None) -> float:
        sync()
        t0 = time.perf_counter()
        if path == "one-request":  # msprobe's own cut of one request (request_scope.start_step)
            start_step(
                debugger, model, capture_request_id=order[0], scheduled_tokens=tokens, packing_order=order
            )
        elif path is not None:
            msprobe_lanes.DEFAULT_PATH = path  # type: ignore[assignment]
            start_lanes(debugger, model, lanes)
        forward_step(model, ids, positions, lens)
        if path is not None:
            debugger.stop()
            debugger.step()
        sync()
        wall = time.perf_counter() - t0
        if path is not None:  # outside the timing: one lane folder per request, then away with it
            want = 0 if path == "one-request" else len(lanes)
            folders = list((work / "dump").glob("step*/*/req*")) + list(
                (work / "dump").glob("step*/*/dump.json")
            )
            if len(folders) != max(want, 1):
                raise SystemExit(f"{path}: {len(folders)} lane folders or dumps for {len(lanes)} lanes")
            for step_dir in (work / "dump").glob("step*"):
                shutil.rmtree(step_dir)
        return wall

    walls: dict[str, list[float]] = {
        "off": [],
        "one-pass": [],
        "fan-out": [],
        "one-request": [],
        "off-after": [],
    }
    step(None)  # warm-up (twice: the first steps of a fresh process run slower)
    step(None)
    walls["off"] = [step(None) for _ in range(args.reps)]
    debugger = PrecisionDebugger(config_path=str(work / "msprobe.json"))
    paths = (
        {"one-pass": "auto"} | ({"fan-out": "fanout"} if args.fanout else {}) | {"one-request": "one-request"}
    )
    for path in paths.values():
        step(path)  # warm-up: msprobe's set-up, the hooks' first registration
    for _ in range(args.reps):
        for label, path in paths.items():
            walls[label].append(step(path))
    walls["off-after"] = [step(None) for _ in range(args.reps)]
    shutil.rmtree(work, ignore_errors=True)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return {
        "walls": walls,
        "tokens": sum(lens),
        "device": name,
        "dtype": str(dtype),
        "torch": torch.__version__,
    }


def print_vllm(args: argparse.Namespace, result: dict[str, Any]) -> None:
    med = {k: statistics.median(v) for k, v in result["walls"].items() if v}
    print(
        f"vllm: prefill step of {args.lanes} requests ({result['tokens']} tokens), one lane each; model "
        f"{args.size} ({result['dtype']}) on {result['device']}, torch {result['torch']}; msprobe "
        f"statistics L0; {args.reps} repetitions, medians"
    )
    for label, walls in result["walls"].items():
        if walls:
            each = " ".join(f"{w:.3f}" for w in walls)
            times = med[label] / med["off"]
            print(f"  {label:<12} median {med[label]:8.3f} s   ({each})   {times:6.2f}x off")
    fanout = ""
    if "fan-out" in med:
        fanout = f"; fan-out {med['fan-out']:.3f} s = {med['fan-out'] / med['off']:.2f}x"
    low = {k: min(v) for k, v in result["walls"].items() if v}
    print(
        f"ratio vllm lanes{args.lanes} dumps/off: {med['one-pass'] / med['off']:.2f} (one pass "
        f"{med['one-pass']:.3f} s, undumped {med['off']:.3f} s{fanout}; fastest of each: "
        f"{low['one-pass'] / low['off']:.2f}; {result['device']})"
    )


def training_part(args: argparse.Namespace) -> None:
    """``bench/gpu/fsdp_cost.py`` on the CPU in the demo venv (patched verl); its mb 8 ratio line."""
    from bench.support.hardware import hardware
    from verl_consistency.contracts.env import DEMO_VENV

    py = Path(os.environ.get(DEMO_VENV) or REPO / ".cache" / "demo-venv") / "bin" / "python"
    if not py.is_file():
        print(f"training: SKIPPED (no demo venv at {py}: make demo-venv, or set {DEMO_VENV})")
        return
    with tempfile.TemporaryDirectory(prefix="bench-lanes-fsdp-") as tmp:
        out = Path(tmp) / "fsdp-cost.json"
        cmd = [str(py), "-m", "bench.gpu.fsdp_cost", "--device", "cpu", "--tiny", "--requests", "16"]
        cmd += ["--micro-batches", "1,8", "--reps", str(args.reps), "--work", tmp, "--out", str(out)]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, timeout=1200)
        table = out.with_suffix(".txt")
        text = table.read_text() if table.is_file() else ""
        result = json.loads(out.read_text()) if out.is_file() else {}
    if proc.returncode != 0 or "ratio mb8 dumps/off" not in text:
        raise SystemExit(f"training: fsdp_cost failed (rc {proc.returncode}):\n{text}\n{proc.stderr[-3000:]}")
    rows = [line for line in text.splitlines() if line.startswith(("off ", "dumps ", "pass "))]
    print("training: verl FSDP log_prob (bench/gpu/fsdp_cost.py --device cpu --tiny, 16 requests)")
    print("\n".join(f"  {line}" for line in rows))
    (ratio,) = [line for line in text.splitlines() if line.startswith("ratio mb8 dumps/off")]
    low = {
        (r["label"], r["micro_batch"]): min(r["walls_s"]) for r in result["summary"]["rows"] if r["walls_s"]
    }
    fastest = low[("dumps", 8)] / low[("off", 8)]
    print(
        f"{ratio.split('  (')[0]} (verl FSDP log_prob, micro batch 8, medians; fastest of each: "
        f"{fastest:.3f}; {hardware()})"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "vllm", "training"), default="all")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--size", choices=SIZES, help="model shape (default: tiny on CPU, 0.5b on CUDA)")
    ap.add_argument("--lanes", type=int, default=32, help="requests in the step, each captured")
    ap.add_argument("--min-len", type=int, help="shortest prompt (default 16 CPU / 64 CUDA)")
    ap.add_argument("--max-len", type=int, help="longest prompt (default 64 CPU / 512 CUDA)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-fanout", dest="fanout", action="store_false", help="skip the fan-out (before) path")
    args = ap.parse_args(argv)
    gpu = args.device == "cuda"
    args.size = args.size or ("0.5b" if gpu else "tiny")
    args.min_len = args.min_len or (64 if gpu else 16)
    args.max_len = args.max_len or (512 if gpu else 64)
    from importlib.metadata import version

    from bench.support.hardware import hardware

    print(f"hardware: {hardware()}; mindstudio-probe {version('mindstudio-probe')}")
    if args.part in ("all", "vllm"):
        # msprobe prints INFO lines at every start and stop; the bench's own lines are what matter
        print_vllm(args, _quiet(vllm_part, args))
    if args.part in ("all", "training"):
        training_part(args)


def _quiet(fn: Any, *args: Any) -> Any:
    """Run ``fn`` with this process's stdout sent to a log file (msprobe logs through print)."""
    log = Path(tempfile.gettempdir()) / "bench-lanes-msprobe.log"
    sys.stdout.flush()
    saved = os.dup(1)
    with log.open("w") as fh:
        os.dup2(fh.fileno(), 1)
        try:
            return fn(*args)
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


if __name__ == "__main__":
    main()
