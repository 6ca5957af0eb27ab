"""Pairable requests per 100 prompts under REAL vLLM 0.18.0 scheduling: recipe, one-per-step, lanes.

Run: ``python -m bench.bench_pairable_vllm`` (``make bench``; needs the demo venv, ``make demo-venv``;
about 2-4 minutes on 2 cores). The simulated figure next to it is ``bench_selective.py``'s.

What runs: the demo's tiny random Qwen2 on the real vLLM 0.18.0 CPU engine (``AsyncLLM``, the
patched runner, chunked prefill and prefix caching on, vLLM's default ``max_num_batched_tokens``
and ``max_num_seqs``), 100 prompts of the embedded prompt set, each sent once with a verl-style
id, 8 tokens each, in two arrival patterns:

* ``all at once``: the whole batch submitted together, as verl's agent loop does for a
  training step (``default batching``);
* ``staggered``: one request every 50 ms.

The demo's rollout first sends one short warm-up request alone (the engine's first sampling
step compiles for 15+ s); it is left out of every count here.

The engine runs twice per pattern. With ``VERL_CONSISTENCY_CAPTURE=fraction:1`` (the default)
its dispatch log records every step, dumped or not, so three ways are read off one schedule:

* recipe (dump every step): a request is pairable when its step is a prefill step holding that
  request alone, computing its whole prompt (no prefix hit, no chunk);
* one per step (msprobe 26.2.0's own ``scheduled_tokens`` cut, the previous release of this
  bundle): one request per prefill step that holds at least one such request;
* lanes (``hooks/lanes/msprobe_lanes.py``, what this run dumped): every such request of every dumped
  step, each in a ``req{k}`` folder of its own; counted from the lane folders on disk, which
  must hold a ``dump.json`` each;
* comparable: requests whose whole prompt was computed in one step (the upper bound).

Then with ``--capture all`` (the recipe, every step dumped whole): its pairs (single-request
comparable prefill steps of that run's own schedule) and its bytes per pair, the ratio lines
against the default. Bytes per pair: the lanes' bytes on disk per lane. Its baseline,
measured in the same run, is a prefill step of one request (the staggered pattern's, whose
steps mostly hold one): what a one-request dump costs, which is what one pair cost before lanes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPTS = 100
PATTERNS = {"all at once": 0.0, "staggered 50 ms": 0.05}


def _inner(out: Path) -> None:
    from verl_consistency.contracts import layout
    from verl_consistency.contracts.env import CAPTURE, RUN_DIR
    from verl_consistency.contracts.records import ScheduledRequest, base_request_id
    from verl_consistency.entrypoints.engines.cpu_runtime import runtime_env
    from verl_consistency.entrypoints.engines.stage_runner import run_stage
    from verl_consistency.entrypoints.engines.tiny_model import build_model, encode, prompt_texts
    from verl_consistency.entrypoints.msprobe.config import Task, write_single_node
    from verl_consistency.patches.hooks.rollout.request_scope import is_comparable_prefill

    root = out.parent
    model = root / "tiny-qwen2"
    texts = prompt_texts(PROMPTS)
    build_model(model, texts)
    prompts = encode(model, texts)

    def rollout(capture: str, gap: float) -> tuple[list[dict], layout.RunLayout, float]:
        """One real rollout of the 100 prompts; its dispatch records (warm-up left out)."""
        lay = layout.RunLayout(root, layout.new_run_id("bench"))
        write_single_node(lay, Task.STATISTICS, request_scoped=capture != "all")
        env = runtime_env({**os.environ, RUN_DIR: str(lay.run_dir), CAPTURE: capture})
        args = {
            "model_dir": str(model),
            "rollout_config": str(lay.rollout_config),
            "prompts": prompts,
            "max_tokens": 8,
            "max_model_len": 1024,
            "stagger_s": gap,
        }
        t0 = time.monotonic()
        ro = run_stage("rollout", args, lay.run_dir / "demo", env, lay.run_dir / "demo" / "stages.log")
        seconds = time.monotonic() - t0
        (log,) = lay.rollout_dir.glob("*/dispatch_log.jsonl")
        recs = []
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            # the demo's warm-up request (sent alone before the others) is not one of the 100
            rec["requests"] = [
                q for q in rec["requests"] if base_request_id(q["request_id"]) != ro["warmup_request_id"]
            ]
            if rec["requests"]:
                recs.append(rec)
        return recs, lay, seconds

    def comparable(r: dict) -> list[ScheduledRequest]:
        return [q for q in map(ScheduledRequest.model_validate, r["requests"]) if is_comparable_prefill(q)]

    def size(paths: list[Path]) -> int:
        return sum(f.stat().st_size for d in paths for f in d.rglob("*") if f.is_file())

    results = {}
    for name, gap in PATTERNS.items():
        recs, lay, seconds = rollout("fraction:1", gap)
        prefill = [r for r in recs if r["phase"] == "prefill"]
        recipe = sum(1 for r in prefill if len(r["requests"]) == 1 and comparable(r))
        scoped = sum(1 for r in prefill if comparable(r))
        lane_dirs = [
            lay.run_dir / r["dump_path"] / f"step{r['step']}"
            for r in recs
            if r.get("dumped") and r.get("lane_request_ids")
        ]
        lanes = [d for step in lane_dirs for d in step.glob("*/req*") if (d / "dump.json").is_file()]
        single = [d for d in lanes if len(list(d.parent.glob("req*"))) == 1]
        # the same prompts with --capture all (the recipe): every step dumped whole; its pairs
        # are its own schedule's single-request comparable prefill steps
        all_recs, all_lay, all_seconds = rollout("all", gap)
        all_pairs = sum(
            1 for r in all_recs if r["phase"] == "prefill" and len(r["requests"]) == 1 and comparable(r)
        )
        results[name] = {
            "lanes": len(lanes),
            "lane_bytes": size(lanes),
            "single_lanes": len(single),
            "single_bytes": size(single),
            "all_pairs": all_pairs,
            "all_bytes": size([d for d in all_lay.rollout_dir.glob("*/step*") if d.is_dir()]),
            "all_seconds": round(all_seconds, 1),
            "steps": len(recs),
            "prefill_steps": len(prefill),
            "dumped_steps": sum(r["dumped"] for r in recs),
            "comparable": sum(len(comparable(r)) for r in prefill),
            "prefix_hits": sum(
                1 for r in recs for q in r["requests"] if q["type"] == "new" and q["num_computed_tokens"]
            ),
            "recipe": recipe,
            "scoped": scoped,
            "seconds": round(seconds, 1),
        }
    out.write_text(json.dumps(results))


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--inner":
        _inner(Path(sys.argv[2]))
        return 0
    from verl_consistency.contracts.env import DEMO_VENV

    venv = Path(os.environ.get(DEMO_VENV) or REPO / ".cache" / "demo-venv")
    py = venv / "bin" / "python"
    if not py.is_file():
        print(f"{py} missing: build the demo venv first (make demo-venv)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="vc-bench-pairable-") as tmp:
        out = Path(tmp) / "result.json"
        t0 = time.perf_counter()
        inner = [str(py), "-m", "bench.bench_pairable_vllm", "--inner", str(out)]
        res = subprocess.run(inner, cwd=REPO, check=False)
        if res.returncode != 0 or not out.is_file():
            print("the real-engine run failed (see above)", file=sys.stderr)
            return 1
        results = json.loads(out.read_text())
    print(
        f"real vLLM 0.18.0 on CPU ({os.cpu_count()} cores), {PROMPTS} prompts x 8 tokens, "
        "chunked prefill and prefix caching on, vLLM's default batching; "
        f"measured in {time.perf_counter() - t0:.0f} s"
    )
    print(
        f"  {'arrivals':18}{'steps':>7}{'prefill':>9}{'comparable':>12}{'recipe':>8}{'1/step':>8}"
        f"{'lanes':>7}{'KB/pair':>9}  (per 100 prompts)"
    )
    for name, r in results.items():
        scale = 100 / PROMPTS
        per_pair = r["lane_bytes"] / r["lanes"] / 1024 if r["lanes"] else float("nan")
        print(
            f"  {name:18}{r['steps']:>7}{r['prefill_steps']:>9}{r['comparable'] * scale:>12.0f}"
            f"{r['recipe'] * scale:>8.0f}{r['scoped'] * scale:>8.0f}"
            f"{r['lanes'] * scale:>7.0f}{per_pair:>9.1f}"
        )
    for name, r in results.items():
        ratio = f"{r['lanes'] / r['scoped']:.1f}x" if r["scoped"] else "inf (one-per-step 0)"
        print(f"ratio pairable requests, lanes / one per step, {name}: {ratio}")
        ratio = f"{r['lanes'] / r['recipe']:.1f}x" if r["recipe"] else "inf (recipe 0)"
        print(f"ratio pairable requests, lanes / recipe, {name}: {ratio}")
    print("  --capture all (the recipe), measured on its own run of the same prompts:")
    for name, r in results.items():
        per_pair = f"{r['all_bytes'] / r['all_pairs'] / 1024:.1f}" if r["all_pairs"] else "inf (no pair)"
        print(
            f"  {name:18} pairs {r['all_pairs'] * 100 / PROMPTS:.0f} per 100, "
            f"{r['all_bytes'] / 1024:.0f} KB dumped, KB/pair {per_pair}"
        )
    for name, r in results.items():
        ratio = f"{r['lanes'] / r['all_pairs']:.1f}x" if r["all_pairs"] else "inf (all paired 0)"
        print(f"ratio pairs, default (fraction:1) / all, {name}: {ratio}")
        if r["lanes"] and r["all_pairs"]:
            bpp = (r["lane_bytes"] / r["lanes"]) / (r["all_bytes"] / r["all_pairs"])
            print(f"ratio bytes per pair, default / all, {name}: {bpp:.3f}x")
    singles = [r for r in results.values() if r["single_lanes"]]
    if singles:
        base = sum(r["single_bytes"] for r in singles) / sum(r["single_lanes"] for r in singles)
        for name, r in results.items():
            if r["lanes"]:
                ratio = r["lane_bytes"] / r["lanes"] / base
                print(f"ratio bytes per pair, lanes / a one-request step's dump, {name}: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
