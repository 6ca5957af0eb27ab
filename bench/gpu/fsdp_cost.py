"""What do per-request training dumps cost at the user's micro batch? verl's log_prob phase, mb 1 vs 8.

Issue 21 (acceptance, training cost). Before the lanes (``patches/hooks/lanes/msprobe_lanes.py``) a
collection run forced ``log_prob_micro_batch_size_per_gpu=1`` so that each training dump held one
request; with lanes a micro batch of several rows is dumped one msprobe dump per request. This
bench times verl's real ``FSDPEngineWithLMHead.infer_batch`` (the old-log-prob pass, PROMPTS_ONLY
trimmed by ``prompts_only.trim``, ``use_remove_padding`` THD) over the same N requests:

* with the training dump on (the patched ``forward_backward_batch`` and ``micro_batch_dump.py``:
  ``DUMP_ON=1``, ``VERL_CONSISTENCY_ACTOR_CONFIG``, ``VERL_CONSISTENCY_RUN_DIR``, capture
  ``fraction:1``; msprobe statistics, L0, written by ``entrypoints/msprobe_config``), at micro batch
  1 (today's forced setting: one msprobe step per request) and at 8 (one step per 8 requests, one
  lane each);
* without dumps at the same micro batches (the baseline).

All in ONE process on one engine (the micro batch is a field of the batch), repetitions alternating
the order of the micro batches, so clocks, caches and the GPU's state are shared. The undumped
repetitions run first: msprobe's L0 hooks stay registered once the debugger has started, so a later
undumped pass pays their idle cost (``off-after``). Each dumped pass's step folders are moved away
(untimed) and checked: every request in one dump (a ``req*`` lane, or a whole step at mb 1).

Issue 21's figure is ``ratio dumps mb1/mb8`` (micro batch 1 over 8, both dumping), issue 32's
``ratio mb8 dumps/off`` (dumped over undumped at micro batch 8): medians of the same run. The lanes
go through the one-pass path (``hooks/lanes/lane_collector.py``; ``--lanes-path fanout``: one msprobe
collector per lane, the path before issue 32), and each dumped pass is checked to have used it
(``fsdp_cost_checks``). Written to ``--out`` (JSON) and ``--out`` with ``.txt`` (the table).

Run (from the repository root; ``verl_consistency`` must import this checkout):

* device (H200, the ``next`` set unpacked by ``bench/gpu/verl_gpu.sh``): ``bash bench/gpu/verl_gpu.sh
  cost`` runs ``python3 -m bench.gpu.fsdp_cost --device cuda --out $OUT/fsdp-cost.json``: a random
  Qwen2 of Qwen2-0.5B's shape, bf16 (verl's default mixed precision), sdpa attention, nccl world 1.
* CPU (a check of the script, not a measurement): ``VERL_CONSISTENCY_PIN_SET=next
  .cache/demo-venv-next/bin/python -m bench.gpu.fsdp_cost --device cpu --tiny --requests 16 --reps 1``
  (gloo, fp32, eager attention, verl's pure-torch padding helpers, a tiny Qwen2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu.fsdp_cost_checks import Rep, check_fronts, count_fronts, harvest, parse_args
from bench.gpu.fsdp_cost_report import hardware, summarize, table
from verl_consistency.entrypoints.options import options_from

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen2-0.5B's config.json, random weights
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
}
SHAPES["tiny"] = SHAPES["0.5b"] | {
    **dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
    **dict(vocab_size=512, max_position_embeddings=1024, rope_theta=10000.0),
}


class BenchError(RuntimeError):
    """A stage of the bench failed; the message names the stage and what to check."""


@contextlib.contextmanager
def stage(name: str, hint: str = "") -> Iterator[None]:
    """Turn any failure inside into one BenchError that names the stage (the traceback is printed)."""
    try:
        yield
    except BenchError:
        raise
    except Exception as exc:  # reported with its stage, then re-raised as one error
        traceback.print_exc()
        raise BenchError(f"{name}: {type(exc).__name__}: {exc}" + (f" ({hint})" if hint else "")) from exc


# ----------------------------------------------------------------------------- set-up


def build_model(model_dir: Path, shape: str, device: str) -> None:
    """A random Qwen2 of ``shape`` saved in bf16 with ``save_pretrained`` (no download, no tokenizer)."""
    import torch

    from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2, tiny_qwen2_config

    kwargs = SHAPES[shape] | {
        "head_dim": SHAPES[shape]["hidden_size"] // SHAPES[shape]["num_attention_heads"]
    }
    cfg = tiny_qwen2_config(**kwargs)
    with torch.device(device):  # initialising 0.5B parameters is much faster on the GPU
        model: Any = tiny_qwen2(cfg, seed=0)
    model.to(torch.bfloat16).save_pretrained(model_dir)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # the engine loads its own copy


def make_requests(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[dict[str, Any]]:
    """N prompts of lengths spread evenly over [lo, hi] (shuffled), random tokens, one response token,
    each with a uuid4-style hex id as verl's rollout client makes them."""
    rng = random.Random(seed)
    lengths = [lo + round(i * (hi - lo) / max(n - 1, 1)) for i in range(n)]
    rng.shuffle(lengths)
    return [
        {
            "request_id": uuid.UUID(int=rng.getrandbits(128), version=4).hex,
            "prompt_ids": [rng.randrange(1, vocab) for _ in range(length)],
            "response_ids": [rng.randrange(1, vocab)],
        }
        for length in lengths
    ]


def init_process_group(device: str) -> None:
    import torch
    import torch.distributed as dist

    from verl_consistency.entrypoints.engines.stage_runner import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    if device == "cuda":
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1)
    else:
        dist.init_process_group("gloo", rank=0, world_size=1)


def dump_env(run_root: Path) -> Any:
    """The run folder and msprobe configs (statistics, L0) as ``verl-consistency run`` writes them;
    the hooks' environment points at them. Returns the run layout."""
    from verl_consistency.contracts import env, layout
    from verl_consistency.entrypoints.msprobe.config import Task, write_single_node

    lay = layout.RunLayout(run_root, "fsdp-cost")
    shutil.rmtree(lay.run_dir, ignore_errors=True)  # a reused --work: every pass's dump starts empty
    # not request-scoped: DumpOptions' default, which the bench's figures were measured with
    write_single_node(lay, Task.STATISTICS, request_scoped=False)
    os.environ.update(
        {
            env.RUN_DIR: str(lay.run_dir),
            env.ACTOR_CONFIG: str(lay.actor_config),
            env.CAPTURE: "fraction:1",
            env.DUMP_PHASE: env.DumpPhase.LOG_PROB.value,
        }
    )
    os.environ.pop(env.DUMP_ON, None)
    return lay


def build_engine(model_dir: Path, device: str, n: int) -> Any:
    from verl_consistency.entrypoints.engines import fsdp_stage

    if device == "cuda":
        fsdp_stage.serve_pure_torch_attention_helpers(cpu_platform=False)
        extra: tuple[str, ...] = ()  # verl's default mixed precision: bf16 compute
        attn = "sdpa"
    else:
        fsdp_stage.serve_pure_torch_attention_helpers()
        extra, attn = (fsdp_stage.FP32,), "eager"
    actor_cfg = fsdp_stage.actor_config(str(model_dir), n, *extra, micro_batch=1)
    return fsdp_stage.fsdp_engine(str(model_dir), actor_cfg, attn_implementation=attn)


def trimmed_batch(requests: list[dict[str, Any]]) -> Any:
    from verl_consistency.entrypoints.engines import fsdp_stage
    from verl_consistency.patches.hooks.training import prompts_only

    return prompts_only.trim(fsdp_stage.rollout_batch(requests))


def engine_input(batch: Any, micro_batch: int) -> Any:
    """verl's ``infer_batch`` input, built as the demo and ``check`` build it."""
    from verl_consistency.entrypoints.engines import fsdp_stage

    return fsdp_stage.engine_input(batch, micro_batch)


# ----------------------------------------------------------------------------- one pass


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def infer(
    engine: Any, batch: Any, micro_batch: int, device: str, dumps: bool, inline: bool = False
) -> tuple[float, Any, float | None]:
    """One log_prob pass; returns (wall s, padded log-probs on the CPU, peak GiB on the GPU).
    ``inline``: the lanes' files written in the training process (``VERL_CONSISTENCY_LANE_WRITE=inline``,
    the form before issue 43's lane writer), not by the helper process."""
    import torch
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    from verl_consistency.contracts import env

    if dumps:
        os.environ[env.DUMP_ON] = "1"
    else:
        os.environ.pop(env.DUMP_ON, None)
    if inline:
        os.environ[env.LANE_WRITE] = "inline"
    td = engine_input(batch, micro_batch)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        sync(device)
        t0 = time.perf_counter()
        with engine.eval_mode():
            out = engine.infer_batch(td)
        sync(device)
        wall = time.perf_counter() - t0
    finally:
        os.environ.pop(env.DUMP_ON, None)
        os.environ.pop(env.LANE_WRITE, None)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    log_probs = no_padding_2_padding(tu.get(out["model_output"], "log_probs"), td).float().cpu()
    return wall, log_probs, peak


# ----------------------------------------------------------------------------- the schedule

INLINE = "dumps-inline"
"""A dumped pass whose lanes' files are written in the training process (``--inline-write-too``)."""


@dataclass
class Bench:
    """What every pass shares: one engine, one batch, one run folder."""

    args: argparse.Namespace
    device: str
    engine: Any
    batch: Any
    warm_batch: Any
    ids: dict[str, int]
    """request id -> prompt tokens"""
    warm_ids: dict[str, int]
    lay: Any
    work: Path
    t0: float
    reps: list[Rep] = field(default_factory=list)
    warmups: list[Rep] = field(default_factory=list)
    log_probs: dict[str, Any] = field(default_factory=dict)
    log_off: int = 0
    fronts: Counter[str] = field(default_factory=Counter)
    """Lane fronts installed so far (``fsdp_cost_checks.count_fronts``)."""

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


def one_pass(b: Bench, label: str, mb: int, index: int, warm: bool = False) -> Rep:
    """One pass, its failure recorded (not raised): the other passes still run and are reported."""
    rep = Rep(label, mb, index)
    dumps = label.startswith("dumps")
    batch, ids = (b.warm_batch, b.warm_ids) if warm and dumps else (b.batch, b.ids)
    before = Counter(b.fronts)
    try:
        wall, log_probs, peak = infer(b.engine, batch, mb, b.device, dumps, inline=label == INLINE)
        rep.wall_s, rep.peak_gib = round(wall, 4), None if peak is None else round(peak, 2)
        if not bool(log_probs.isfinite().all()) or log_probs.shape[0] != len(ids):
            rep.problems.append(
                f"log-probs of shape {tuple(log_probs.shape)} not finite or not one row per request"
            )
        if not warm:
            b.log_probs.setdefault(f"{label}-mb{mb}", log_probs)
    except Exception as exc:  # one failed pass is reported, the rest still run
        traceback.print_exc()
        rep.error = f"{type(exc).__name__}: {exc}"
        if b.device == "cuda":
            import torch

            torch.cuda.empty_cache()
    rep.fronts = dict(b.fronts - before)
    check_fronts(rep, b.args.lanes_path)
    if dumps:
        into = b.work / "reps" / f"{'warm-' if warm else ''}{label}-mb{mb}-{index}"
        try:
            b.log_off = harvest(b.lay, into, b.log_off, ids, rep)
        except Exception as exc:  # a broken dump is a problem of this pass, not of the bench
            traceback.print_exc()
            rep.problems.append(f"could not read the dump of this pass: {type(exc).__name__}: {exc}")
        if not b.args.keep_dumps:
            shutil.rmtree(into, ignore_errors=True)
    what = "warm-up " if warm else ""
    detail = f"{rep.wall_s:.3f} s" if rep.wall_s is not None else f"FAILED {rep.error}"
    if dumps:
        detail += f", {rep.steps} steps, {rep.lane_folders} lanes, {rep.bytes_dumped / 1e6:.1f} MB"
    print(f"[{b.elapsed():6.1f}s] {what}{label} mb{mb} #{index}: {detail}", flush=True)
    for p in rep.problems:
        print(f"    PROBLEM: {p}", flush=True)
    (b.warmups if warm else b.reps).append(rep)
    return rep


def estimate(b: Bench, label: str, mb: int) -> float:
    """Seconds the next (label, mb) pass should take: its last pass, else its warm-up scaled up."""
    done = [r.wall_s for r in b.reps if r.label == label and r.micro_batch == mb and r.wall_s]
    if done:
        return done[-1]
    warm = [r.wall_s for r in b.warmups if r.label == label and r.micro_batch == mb and r.wall_s]
    if not warm:
        return 0.0
    scale = len(b.ids) / len(b.warm_ids) if label.startswith("dumps") else 1.0
    return warm[-1] * scale


def run_schedule(b: Bench) -> None:
    """Warm-ups (untimed), then the undumped passes, then the dumped ones, each set alternating the
    order of the micro batches; a pass that would overrun ``--budget-s`` is skipped (and said)."""
    mbs, reps = b.args.micro_batches, b.args.reps
    for mb in mbs:
        one_pass(b, "off", mb, 0, warm=True)

    def timed(label: str, which: list[int] = mbs) -> None:
        for r in range(reps):
            for mb in which if r % 2 == 0 else which[::-1]:
                need = estimate(b, label, mb) * 1.15 + 5
                if b.elapsed() + need > b.args.budget_s:
                    rep = Rep(label, mb, r, error=f"skipped: ~{need:.0f} s needed, {b.elapsed():.0f} s used")
                    print(
                        f"SKIP {label} mb{mb} #{r}: {rep.error} of --budget-s {b.args.budget_s}", flush=True
                    )
                    b.reps.append(rep)
                    continue
                one_pass(b, label, mb, r)

    timed("off")
    for mb in mbs:  # msprobe's set-up and first hooks, on a few requests
        one_pass(b, "dumps", mb, 0, warm=True)
    timed("dumps")
    if b.args.inline_write_too and mbs[1:]:  # issue 43's lane writer against the in-line write
        timed(INLINE, mbs[1:])
    for mb in mbs:  # the undumped pass again, with msprobe's hooks registered (for information)
        if b.elapsed() + estimate(b, "off", mb) + 5 < b.args.budget_s:
            one_pass(b, "off-after", mb, 0)


def extra_pass_dump(b: Bench, label: str, mb: int) -> Rep:
    """An extra dumped pass's records read (its steps counted in the answer) and its dump removed:
    it is not one of the timed passes."""
    rep = Rep(label, mb, 0)
    into = b.work / "reps" / f"{label}-mb{mb}"
    b.log_off = harvest(b.lay, into, b.log_off, b.ids, rep)
    shutil.rmtree(into, ignore_errors=True)
    return rep


def profile_passes(b: Bench, out: Path) -> None:
    """``--profile``: after the timed passes, one more dumped pass at each micro batch above 1 under
    cProfile; the tables (by own time and by cumulative time) go to ``out``. Where a dumped step's
    host time goes: the profiler slows Python, so read shares, not seconds."""
    import cProfile
    import io
    import pstats

    text = io.StringIO()
    for mb in b.args.micro_batches[1:]:
        prof = cProfile.Profile()
        prof.enable()
        wall, _, _ = infer(b.engine, b.batch, mb, b.device, True)
        prof.disable()
        rep = extra_pass_dump(b, "profiled", mb)
        print(f"[{b.elapsed():6.1f}s] profiled dumps mb{mb}: {wall:.3f} s under cProfile", flush=True)
        text.write(f"# dumped pass at micro batch {mb} under cProfile: {wall:.3f} s, {rep.steps} steps\n")
        for order, rows in (("tottime", 45), ("cumulative", 70)):
            pstats.Stats(prof, stream=text).sort_stats(order).print_stats(rows)
    out.write_text(text.getvalue())


def split_passes(b: Bench) -> dict[str, dict[str, Any]]:
    """After the timed passes (and any profile), one more dumped pass at each micro batch above 1 with
    ``bench.support.host_clock``'s clocks on: the seconds in the lanes' per-tensor step and write and
    in Python's collector; the rest of what the pass adds over the undumped median is msprobe's hook
    walk. The clocks charge ~1 us a timed call, which is why these passes are not the timed ones."""
    from bench.support.host_clock import HostClock

    clock = HostClock()
    found: dict[str, dict[str, Any]] = {}
    for mb in b.args.micro_batches[1:]:
        need = estimate(b, "dumps", mb) * 1.15 + 5
        if b.elapsed() + need > b.args.budget_s:
            print(f"SKIP host split mb{mb}: ~{need:.0f} s needed, {b.elapsed():.0f} s used", flush=True)
            continue
        clock.reset()
        clock.on = True
        try:
            wall, _, _ = infer(b.engine, b.batch, mb, b.device, True)
        finally:
            clock.on = False
        rep = extra_pass_dump(b, "split", mb)
        found[f"mb{mb}"] = {
            "wall_s": round(wall, 4),
            "steps": rep.steps,
            **clock.split(),
            "per_lane": dict(clock.per_lane),
            "calls": dict(clock.calls),  # tensors queued, per-lane, writes: the JSON only
        }
        print(f"[{b.elapsed():6.1f}s] dumps mb{mb} with the host clocks: {wall:.3f} s", flush=True)
    return found


# ----------------------------------------------------------------------------- main


def set_up(args: argparse.Namespace, t_start: float) -> tuple[Bench, dict[str, Any]]:
    import torch

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError(
            "--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False); "
            "on a machine without a GPU use --device cpu --tiny"
        )
    work = (args.work or Path(tempfile.mkdtemp(prefix="fsdp-cost-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    shape = "tiny" if args.tiny else "0.5b"
    model_dir = args.model.resolve() if args.model else work / f"qwen2-{shape}-random"
    with stage("model", "a random Qwen2 built with transformers and saved with save_pretrained"):
        if not (model_dir / "config.json").is_file():
            if args.model:
                raise BenchError(f"--model {args.model}: no config.json there; give an HF model folder")
            t = time.monotonic()
            build_model(model_dir, shape, device)
            print(f"built {model_dir} ({shape}, bf16) in {time.monotonic() - t:.1f}s", flush=True)
        vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    with stage("requests"):
        requests = make_requests(args.requests, args.min_len, args.max_len, vocab, args.seed)
        # msprobe's set-up on a few requests: two micro batches of the largest size, a size verl takes
        unit = math.lcm(*args.micro_batches)
        warm = requests[: min(len(requests), unit * -(-2 * max(args.micro_batches) // unit))]
        batch, warm_batch = trimmed_batch(requests), trimmed_batch(warm)
    with stage("dump configs", "entrypoints/msprobe_config.build/write into WORK/runs"):
        lay = dump_env(work / "runs")
    with stage("process group", "MASTER_ADDR/MASTER_PORT, world size 1"):
        init_process_group(device)
    with stage(
        "verl FSDP engine", "is verl 0.9.1 patched (verl-consistency patches apply --set next -c verl)?"
    ):
        t = time.monotonic()
        engine = build_engine(model_dir, device, len(requests))
        print(f"engine ready in {time.monotonic() - t:.1f}s", flush=True)
        from verl_consistency.patches.hooks.lanes import msprobe_lanes
        from verl_consistency.patches.hooks.training import micro_batch_dump  # the patched verl imports it

        del micro_batch_dump
        msprobe_lanes.DEFAULT_PATH = args.lanes_path
    tokens = sum(len(r["prompt_ids"]) for r in requests)
    config = {
        "requests": len(requests),
        "min_len": args.min_len,
        "max_len": args.max_len,
        "tokens": tokens,
        "shape": shape if not args.model else str(model_dir),
        "model": SHAPES[shape] if not args.model else str(model_dir),
        "dtype": "bf16 (verl mixed precision)" if device == "cuda" else "fp32",
        "attn": "sdpa" if device == "cuda" else "eager",
        "micro_batches": args.micro_batches,
        "reps": args.reps,
        "seed": args.seed,
        "lanes_path": args.lanes_path,
        "work": str(work),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    ids = {r["request_id"]: len(r["prompt_ids"]) for r in requests}
    warm_ids = {r["request_id"]: len(r["prompt_ids"]) for r in warm}
    return options_from(Bench, locals(), t0=t_start, fronts=count_fronts()), config


def write_outputs(out: Path, result: dict[str, Any]) -> str:
    from verl_consistency.contracts.atomic import write_json_atomic, write_text_atomic

    text = table(result)
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, result)
    write_text_atomic(out.with_suffix(".txt"), text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    result: dict[str, Any] = {
        "ok": False,
        "problems": [],
        "skipped": [],
        "config": {"command": " ".join(sys.argv)},
    }
    try:
        result["hardware"] = hardware(args.device) if args.device == "cpu" or _cuda() else {"device": "none"}
        b, result["config"] = set_up(args, t_start)
        with stage("passes"):
            run_schedule(b)
        if b.args.profile:
            with stage("profile", "cProfile of one more dumped pass per micro batch"):
                profile_passes(b, b.args.profile)
        split = {}
        if not b.args.no_split:
            with stage("host split", "one more dumped pass per micro batch with the host clocks"):
                split = split_passes(b)
        result["summary"] = summarize(b, result["config"]["tokens"])
        result["summary"]["host_split"] = split
        result["reps"] = [asdict(r) for r in b.reps]
        result["warmups"] = [asdict(r) for r in b.warmups]
        for r in b.reps + b.warmups:
            where = f"{'warm-up ' if r in b.warmups else ''}{r.label} mb{r.micro_batch} #{r.index}"
            result["problems"] += [f"{where}: {p}" for p in r.problems]
            if r.error:
                result["skipped" if r.error.startswith("skipped") else "problems"].append(
                    f"{where}: {r.error}"
                )
        result["ok"] = not result["problems"] and all(
            result["summary"]["ratios"].get(f"dumps mb1/mb{mb}") for mb in args.micro_batches[1:]
        )
    except BenchError as exc:
        result["problems"].append(f"FAILED at {exc}")
        print(f"FSDP COST BENCH FAILED at {exc}", file=sys.stderr, flush=True)
    finally:
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
    result["elapsed_s"] = round(time.monotonic() - t_start, 1)
    result.setdefault("hardware", {})
    print(write_outputs(args.out, result), flush=True)
    print(f"written: {args.out.resolve()} and {args.out.resolve().with_suffix('.txt')}", flush=True)
    return 0 if result["ok"] else 1


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


if __name__ == "__main__":
    raise SystemExit(main())
