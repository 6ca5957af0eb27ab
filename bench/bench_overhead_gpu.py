"""What does a collection run cost the rollout? msprobe's per-step overhead, recipe vs selective.

The recipe dumps every vLLM step; selective mode (issue 7) starts msprobe only on prefill steps
that hold a captured request, and cuts that request's rows. This bench replays a window of the
simulated vLLM v1 schedule from ``bench_selective.py`` through the vLLM-layout packed Qwen2
stand-in (``tests/standins/vllm_qwen2.py``: vLLM's module names and ``[tokens, hidden]``
activations, attention as one masked SDPA call per layer), at a real model size, and times
every step in four separate processes (msprobe's debugger is a per-process singleton):

``off``        no debugger: the baseline.
``recipe``     statistics, L0, start/stop/step on every step (the public recipe).
``selective``  statistics, L0, request-scoped, only captured prefill steps (``should_dump``).
``tensor``     tensor, request-scoped, ``LAYER_TENSOR_LIST``, only captured prefill steps.

Healthy numbers (H200, Qwen2-0.5B, bf16): ``recipe`` is several times slower than ``off`` over
the whole window, because every decode step pays msprobe's per-module host work; ``selective``
stays within a few percent of ``off``. Broken: ``selective`` close to ``recipe`` means steps are
being dumped that cannot be paired.

Run on a GPU (``python -m bench.bench_overhead_gpu``); without CUDA it runs a small model on the
CPU so that the script itself stays tested by ``make bench``, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SIZES = {
    # name: (layers, hidden, heads, kv heads, intermediate, vocab) — Qwen2 family shapes
    "tiny": (4, 256, 4, 2, 688, 32000),
    "0.5b": (24, 896, 14, 2, 4864, 151936),
    "1.5b": (28, 1536, 12, 2, 8960, 151936),
    "7b": (28, 3584, 28, 4, 18944, 152064),
}
MODES = ("off", "recipe", "selective", "tensor")


def model_config(size: str) -> object:
    from types import SimpleNamespace

    layers, hidden, heads, kv, inter, vocab = SIZES[size]
    return SimpleNamespace(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        vocab_size=vocab,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        tie_word_embeddings=False,
    )


def _window(steps: int, rate: float, skip: int) -> list[dict[str, object]]:
    """A window of steady-state steps: decode count plus the new requests' ids and prompt lengths."""
    from bench.bench_selective import make_requests, simulate

    sched = simulate(make_requests(rate), mixed=True)
    window = sched[skip : skip + steps]
    return [{"decodes": s.decodes, "new": [(r.rid, r.prompt) for r in s.new]} for s in window]


def msprobe_config(mode: str, dump: Path) -> dict[str, object]:
    from verl_consistency.patches.hooks.rollout.request_scope import LAYER_TENSOR_LIST, scoped_msprobe_config

    task = "tensor" if mode == "tensor" else "statistics"
    section: dict[str, object] = {"scope": [], "list": [], "data_mode": ["all"]}
    if task == "statistics":
        section["summary_mode"] = "statistics"
    else:
        section["list"] = list(LAYER_TENSOR_LIST)
    cfg: dict[str, object] = {
        "task": task,
        "dump_path": str(dump),
        "rank": [],
        "step": [],
        "level": "L0",
        "async_dump": False,
        task: section,
    }
    return cfg if mode == "recipe" else scoped_msprobe_config(cfg)


def child(mode: str, size: str, window_file: Path, fraction: float, out: Path) -> None:
    import torch

    from bench.support.vllm_qwen2 import Qwen2ForCausalLM, forward_step
    from verl_consistency.contracts.capture import CaptureRule
    from verl_consistency.contracts.records import ScheduledRequest
    from verl_consistency.patches.hooks.rollout.request_scope import (
        install_compact_tensor_save,
        should_dump,
        start_step,
    )

    window = json.loads(window_file.read_text())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    with torch.device(device):  # build in place: a 7B model initialised on the host takes minutes
        # one masked SDPA per layer: a per-request loop over ~250 decodes would time Python, not the step
        model = Qwen2ForCausalLM(model_config(size), one_kernel=True).eval()
    print(f"[{mode}] model {size} on {device}, {len(window)} steps", file=sys.stderr, flush=True)
    rule = CaptureRule(fraction=fraction)

    debugger = None
    work = Path(tempfile.mkdtemp(prefix=f"vc-overhead-{mode}-"))
    if mode != "off":
        from msprobe.pytorch import PrecisionDebugger

        cfg_path = work / "config.json"
        cfg_path.write_text(json.dumps(msprobe_config(mode, work / "dump")))
        debugger = PrecisionDebugger(config_path=str(cfg_path))
        if mode == "tensor":
            install_compact_tensor_save()

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    times: list[float] = []
    dumped: list[bool] = []
    for i, step in enumerate([*window[:3], *window]):  # 3 warm-up steps, not counted
        new = [(rid, int(n)) for rid, n in step["new"]]  # type: ignore[union-attr]
        decodes = int(step["decodes"])  # type: ignore[arg-type]
        lens = [1] * decodes + [n for _, n in new]
        order = [f"d{j}" for j in range(decodes)] + [f"{rid}-0123abcd" for rid, _ in new]
        tokens = sum(lens)
        ids = torch.randint(0, 1000, (tokens,), device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lens])
        sync()
        t0 = time.perf_counter()
        started = False
        if debugger is not None:
            if mode == "recipe":
                debugger.start(model=model)
                started = True
            elif new:
                sched = [
                    ScheduledRequest(
                        request_id=f"{rid}-0123abcd",
                        type="new",
                        tokens=n,
                        prompt_tokens=n,
                        num_computed_tokens=0,
                    )
                    for rid, n in new
                ]
                pick = should_dump(sched, "prefill", rule)
                started = start_step(
                    debugger,
                    model,
                    capture_request_id=pick,
                    scheduled_tokens=dict(zip(order, lens, strict=True)),
                    packing_order=order,
                )
        forward_step(model, ids, positions, lens)
        if started:  # as the patched runner: a step that never started calls no stop/step either
            debugger.stop()
            debugger.step()
        sync()
        if i >= 3:
            times.append(time.perf_counter() - t0)
            dumped.append(started)
    print(f"[{mode}] done in {sum(times):.1f} s", file=sys.stderr, flush=True)
    size_bytes = sum(f.stat().st_size for f in work.rglob("*") if f.is_file())
    out.write_text(
        json.dumps(
            {
                "mode": mode,
                "times": times,
                "dumped": dumped,
                "bytes": size_bytes,
                "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
                "torch": torch.__version__,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--size", choices=SIZES, default=None, help="model shape (default 0.5b on GPU, tiny on CPU)"
    )
    ap.add_argument("--steps", type=int, default=None, help="steps in the window (default 300 GPU / 40 CPU)")
    ap.add_argument("--rate", type=float, default=16.0, help="request arrivals per second in the simulation")
    ap.add_argument("--skip", type=int, default=2000, help="steps skipped to reach steady state")
    ap.add_argument("--fraction", type=float, default=0.3, help="capture fraction of the selective modes")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--window", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.size, args.window, args.fraction, args.out)
        return

    import torch

    gpu = torch.cuda.is_available()
    size = args.size or ("0.5b" if gpu else "tiny")
    steps = args.steps or (300 if gpu else 40)
    with tempfile.TemporaryDirectory(prefix="vc-overhead-") as tmp:
        window_file = Path(tmp) / "window.json"
        window = _window(steps, args.rate, args.skip)
        window_file.write_text(json.dumps(window))
        prefill_steps = sum(1 for s in window if s["new"])
        print(
            f"window: {len(window)} steps of a simulated vLLM v1 schedule ({args.rate:g} req/s), "
            f"{prefill_steps} of them admit new requests; model {size}; capture fraction {args.fraction:g}"
        )
        results = {}
        # msprobe prints an INFO line at every start/stop of the children's dumped steps (242 of
        # them on CPU); they go to a file, named once, so that the bench prints its own lines only
        msprobe_log = Path(tempfile.gettempdir()) / "bench-overhead-msprobe.log"
        print(f"msprobe's log: {msprobe_log}")
        with msprobe_log.open("w") as log_fh:
            for mode in MODES:
                out = Path(tmp) / f"{mode}.json"
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "bench.bench_overhead_gpu",
                        "--child",
                        mode,
                        "--size",
                        size,
                        "--window",
                        str(window_file),
                        "--fraction",
                        str(args.fraction),
                        "--out",
                        str(out),
                    ],
                    check=True,
                    cwd=REPO,
                    stdout=log_fh,
                )
                results[mode] = json.loads(out.read_text())
    hw = results["off"]["device"]
    print(
        f"hardware: {hw}, torch {results['off']['torch']}, {os.cpu_count()} CPU cores, {platform.machine()}"
    )
    base = sum(results["off"]["times"])
    print(
        f"{'mode':<10} {'total s':>9} {'ms/step':>9} {'dumped steps':>13} "
        f"{'ms/dumped':>10} {'MB':>9} {'x off':>7}"
    )
    for mode in MODES:
        r = results[mode]
        total = sum(r["times"])
        dumped_t = [t for t, d in zip(r["times"], r["dumped"], strict=True) if d]
        per_dumped = 1000 * sum(dumped_t) / len(dumped_t) if dumped_t else float("nan")
        print(
            f"{mode:<10} {total:9.2f} {1000 * total / len(r['times']):9.1f} {len(dumped_t):13d} "
            f"{per_dumped:10.1f} {r['bytes'] / 1e6:9.1f} {total / base:7.2f}"
        )
    rec, sel = sum(results["recipe"]["times"]), sum(results["selective"]["times"])
    print(
        f"ratio: recipe overhead {rec / base:.2f}x the undumped run; selective {sel / base:.2f}x; "
        f"selective is {rec / sel:.1f}x faster than the recipe"
    )


if __name__ == "__main__":
    main()
