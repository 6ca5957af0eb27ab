"""Selective, request-scoped vLLM dumps vs the recipe's dump-every-step, over a simulated schedule.

Run: ``python -m bench.bench_selective`` (2-3 minutes on 2 CPU cores; writes only to a temp dir).

Two parts:

1. **Real msprobe dumps, made in this run** (mindstudio-probe 26.2.0 on CPU, each in its own
   process because ``PrecisionDebugger`` is a per-process singleton). The model is the
   vLLM-layout packed Qwen2 stand-in of ``tests/standins/vllm_qwen2.py``:
   - statistics, L0, **24 layers** (hidden 64): statistics size depends on the number of module
     calls, not on width or tokens, so these per-step sizes are used as they are. The recipe's
     prefill and decode steps and a request-scoped step are measured.
   - tensor, L0, request-scoped, **1 layer at Qwen2-0.5B widths** (hidden 896, intermediate
     4864, 14/2 heads, bf16), vocab cut to 4096, at two captured-request lengths. Bytes are
     split by file: per-layer files (``Module.model.layers.N.*``) give a per-layer intercept and
     per-token slope, scaled ×24 to 24 layers; files outside the layers give their own intercept
     and slope; the embedding weight and the logits rows are scaled by 151936/4096 (Qwen2's
     vocab); ``dump.json``/``stack.json``/``construct.json`` are scaled by their share of layer
     entries. Five tensor settings (:data:`TENSOR_SETTINGS`, msprobe ``list`` x ``data_mode``):
     the full L0 module tree (msprobe also saves every leaf module's **parameters** each dumped
     step); ``request_scope.LAYER_TENSOR_LIST`` (decoder layer, attention, MLP; no parameters)
     with ``data_mode`` all, forward and output; and the run's default,
     ``request_scope.BLOCK_TENSOR_LIST`` (attention, MLP) with ``TENSOR_DATA_MODE``
     (forward outputs).

2. **A simulated vLLM v1 schedule** (pure Python, seeded). The scheduler model, as in vLLM
   v1's ``Scheduler.schedule`` (checked against its source) with chunked prefill and prefix
   caching off: every step first schedules one decode token for each running request, then
   admits waiting requests first-come-first-served while fewer than ``max_num_seqs`` (256) run
   and the whole prompt fits the remaining ``max_num_batched_tokens`` (8192; a prompt that does
   not fit stops admission). So a step that admits requests also decodes all running ones.
   KV-cache capacity is not modelled (no preemption). Poisson arrivals; lognormal prompt and
   response lengths. Step time = 15 ms + 40 µs × tokens (only to turn arrivals into steps).
   The same arrivals are also run through the *separate-steps* model (a step is either a
   prefill of newly admitted requests or a decode of all running ones: vLLM v0 /
   prefill-first), as a sensitivity row, because that model favours the recipe.

Recipe: every step dumped (statistics); pairable = steps whose only request is a new one.
Selective: only steps where ``request_scope.should_dump`` picks a captured request (hash rule
``fraction:F``, the real ``CaptureRule``), one request's rows; pairable = those. For each mode the
bench picks the largest fraction of the sweep with >= 10x fewer bytes and prints both ratios
there, then the tensor setting that meets both goals with the most pairs.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.support.hardware import hardware
from verl_consistency.contracts.capture import CaptureRule
from verl_consistency.contracts.records import ScheduledRequest
from verl_consistency.patches.hooks.rollout.request_scope import (
    BLOCK_TENSOR_LIST,
    LAYER_TENSOR_LIST,
    TENSOR_DATA_MODE,
    scoped_msprobe_config,
    should_dump,
    start_step,
)

QWEN05_VOCAB = 151936
SMALL_VOCAB = 4096
LAYERS = 24
TENSOR_LAYERS = 1  # layers of the tensor-mode measurement model; scaled to LAYERS
MAX_NUM_SEQS = 256
MAX_BATCHED_TOKENS = 8192
N_REQUESTS = 4096
ARRIVAL_RATES = (4.0, 16.0, 64.0)  # requests per second; 16 is the headline scenario
HEADLINE_RATE = 16.0
FRACTIONS = (1.0, 0.3, 0.1, 0.03, 0.01, 0.005, 0.004, 0.003, 0.002, 0.001)
HEADLINE_FRACTION = 0.004  # for the sensitivity table
GOAL = 10.0

REPO = Path(__file__).resolve().parents[1]
"""The repository root, where ``python -m bench.bench_selective`` (and so each child) runs."""


@dataclass(frozen=True)
class TensorSetting:
    """One tensor-mode capture setting: msprobe ``list`` and ``data_mode`` (what both sides get)."""

    label: str
    modules: tuple[str, ...]
    data_mode: tuple[str, ...]


TENSOR_SETTINGS: dict[str, TensorSetting] = {
    "full_all": TensorSetting("full L0 tree, data_mode all", (), ("all",)),
    "layers_all": TensorSetting("layer list, data_mode all", tuple(LAYER_TENSOR_LIST), ("all",)),
    "layers_forward": TensorSetting("layer list, data_mode forward", tuple(LAYER_TENSOR_LIST), ("forward",)),
    "layers_output": TensorSetting("layer list, data_mode output", tuple(LAYER_TENSOR_LIST), ("output",)),
    "blocks_output": TensorSetting(
        f"block list, data_mode {'+'.join(TENSOR_DATA_MODE)} (default)",
        tuple(BLOCK_TENSOR_LIST),
        tuple(TENSOR_DATA_MODE),
    ),
}
"""Measured tensor settings. ``blocks_output`` is what ``verl-consistency run`` writes by default."""
DEFAULT_TENSOR = "blocks_output"


# --------------------------------------------------------------------------- measurement (child)


def _child(kind: str, out: Path) -> None:
    """Make real msprobe dumps in this process and write ``out/sizes.json``."""
    import torch
    from msprobe.pytorch import PrecisionDebugger

    from bench.support.vllm_qwen2 import Qwen2ForCausalLM, run_step
    from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2, tiny_qwen2_config

    if kind == "stats":
        cfg = tiny_qwen2_config(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        dtype = torch.float32
        section: dict[str, object] = {"scope": [], "list": [], "data_mode": ["all"]}
        task = "statistics"
    else:
        cfg = tiny_qwen2_config(
            vocab_size=SMALL_VOCAB,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=TENSOR_LAYERS,
            num_attention_heads=14,
            num_key_value_heads=2,
        )
        dtype = torch.bfloat16
        setting = TENSOR_SETTINGS[kind]
        section = {"scope": [], "list": list(setting.modules), "data_mode": list(setting.data_mode)}
        task = "tensor"
    conf = {
        "task": task,
        "dump_path": str(out / "dump"),
        "rank": [],
        "step": [],
        "level": "L0",
        task: section,
    }
    (out / "msprobe.json").write_text(json.dumps(scoped_msprobe_config(conf)))
    model = Qwen2ForCausalLM.from_hf(tiny_qwen2(cfg, seed=0).to(dtype)).eval()
    debugger = PrecisionDebugger(config_path=str(out / "msprobe.json"))
    gen = torch.Generator().manual_seed(1)

    def prompt(n: int) -> list[int]:
        return torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()

    def step(lengths: list[int], capture: bool, recipe: bool) -> None:
        ids = [f"r{i}" for i in range(len(lengths))]
        sched = dict(zip(ids, lengths, strict=True))
        if recipe:
            debugger.start(model=model)
        else:
            start_step(debugger, model, capture_request_id="r0" if capture else None, scheduled_tokens=sched)
        run_step(model, [prompt(n) for n in lengths])
        debugger.stop()
        debugger.step()

    if kind == "stats":
        step([40, 24, 16], capture=False, recipe=True)  # step0: recipe, prefill of 3
        step([1] * 3, capture=False, recipe=True)  # step1: recipe, decode of 3
        step([40, 24, 16], capture=True, recipe=False)  # step2: scoped statistics
    else:
        step([16, 40, 24], capture=True, recipe=False)  # step0: captured request of 16 tokens
        step([48, 40, 24], capture=True, recipe=False)  # step1: of 48 tokens
    sizes: dict[str, dict[str, int]] = {}
    for step_dir in sorted((out / "dump").glob("step*")):
        sizes[step_dir.name] = {
            str(p.relative_to(step_dir).as_posix().split("/", 1)[1]): p.stat().st_size
            for p in step_dir.rglob("*")
            if p.is_file()
        }
    layer_share = {}
    for name, files in sizes.items():
        (dump_json,) = (out / "dump" / name).glob("*/dump.json")
        data = json.loads(dump_json.read_text())["data"]
        total = sum(len(json.dumps(v)) for v in data.values())
        in_layers = sum(len(json.dumps(v)) for k, v in data.items() if ".layers." in k)
        layer_share[name] = in_layers / total
        del files
    (out / "sizes.json").write_text(json.dumps({"sizes": sizes, "layer_share": layer_share}))


def _measure(kind: str, work: Path) -> dict[str, Any]:
    out = work / kind
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_selective", "--child", kind, str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"msprobe measurement {kind!r} failed:\n{proc.stderr[-3000:]}")
    result = json.loads((out / "sizes.json").read_text())
    shutil.rmtree(out / "dump")  # the tensor dumps are large; keep only the sizes
    return result


# --------------------------------------------------------------------------- byte models


JSON_FILES = ("dump.json", "stack.json", "construct.json")


@dataclass
class TensorModel:
    """Bytes of one request-scoped tensor-mode step of the 24-layer, vocab-151936 model."""

    layer_a: float
    layer_b: float
    other_a: float
    other_b: float
    embed_param: float
    logits_in_row: float
    logits_out_row: float
    json_bytes: float

    def bytes(self, tokens: int, reqs_in_step: int) -> float:
        return (
            self.json_bytes
            + LAYERS * (self.layer_a + self.layer_b * tokens)
            + self.other_a
            + self.other_b * tokens
            + self.embed_param
            + reqs_in_step * (self.logits_in_row + self.logits_out_row)
        )


def _groups(files: dict[str, int]) -> dict[str, float]:
    g = {"layer": 0.0, "other": 0.0, "embed_param": 0.0, "logits_in": 0.0, "logits_out": 0.0, "json": 0.0}
    for name, size in files.items():
        base = name.rsplit("/", 1)[-1]
        if base in JSON_FILES:
            g["json"] += size
        elif ".layers." in base:
            g["layer"] += size
        elif "logits_processor" in base:
            g["logits_out" if ".output." in base else "logits_in"] += size
        elif "embed_tokens" in base and ".parameters." in base:
            g["embed_param"] += size
        else:
            g["other"] += size
    return g


def tensor_model(measured: dict[str, Any], lengths: tuple[int, int] = (16, 48), reqs: int = 3) -> TensorModel:
    sizes = measured["sizes"]
    share = measured["layer_share"]
    g0, g1 = _groups(sizes["step0"]), _groups(sizes["step1"])
    dt = lengths[1] - lengths[0]
    layer_b = (g1["layer"] - g0["layer"]) / TENSOR_LAYERS / dt
    layer_a = g0["layer"] / TENSOR_LAYERS - layer_b * lengths[0]
    other_b = (g1["other"] - g0["other"]) / dt
    other_a = g0["other"] - other_b * lengths[0]
    vocab_scale = QWEN05_VOCAB / SMALL_VOCAB
    json_2 = (g0["json"] + g1["json"]) / 2
    s = (share["step0"] + share["step1"]) / 2
    return TensorModel(
        layer_a=layer_a,
        layer_b=layer_b,
        other_a=other_a,
        other_b=other_b,
        embed_param=g0["embed_param"] * vocab_scale,
        logits_in_row=g0["logits_in"] / reqs,
        logits_out_row=g0["logits_out"] / reqs * vocab_scale,
        json_bytes=json_2 * ((1 - s) + s * LAYERS / TENSOR_LAYERS),
    )


# --------------------------------------------------------------------------- schedule simulation


@dataclass
class Req:
    rid: str
    arrival: float
    prompt: int
    response: int
    generated: int = 0


@dataclass
class Step:
    decodes: int
    new: list[Req] = field(default_factory=list)


def make_requests(rate: float, seed: int = 7) -> list[Req]:
    rng = random.Random(seed)
    t = 0.0
    reqs = []
    for _ in range(N_REQUESTS):
        t += rng.expovariate(rate)
        prompt = min(4096, max(16, round(rng.lognormvariate(math.log(300), 0.7))))
        response = min(8192, max(1, round(rng.lognormvariate(math.log(600), 1.0))))
        reqs.append(Req(f"{rng.getrandbits(128):032x}", t, prompt, response))
    return reqs


def simulate(template: list[Req], *, mixed: bool) -> list[Step]:
    reqs = [Req(r.rid, r.arrival, r.prompt, r.response) for r in template]
    pending = deque(reqs)
    waiting: deque[Req] = deque()
    running: list[Req] = []
    steps: list[Step] = []
    t = 0.0
    while pending or waiting or running:
        while pending and pending[0].arrival <= t:
            waiting.append(pending.popleft())
        if not running and not waiting:
            t = pending[0].arrival
            continue
        admit_ok = bool(waiting) and len(running) < MAX_NUM_SEQS and waiting[0].prompt <= MAX_BATCHED_TOKENS
        decode = running if (mixed or not admit_ok) else []
        budget = MAX_BATCHED_TOKENS - len(decode)
        new: list[Req] = []
        if mixed or admit_ok:
            while waiting and len(running) + len(new) < MAX_NUM_SEQS and waiting[0].prompt <= budget:
                req = waiting.popleft()
                budget -= req.prompt
                new.append(req)
        steps.append(Step(len(decode), new))
        tokens = len(decode) + sum(r.prompt for r in new)
        t += 0.015 + 40e-6 * tokens
        for r in decode:
            r.generated += 1
        for r in new:
            r.generated = 1
        running = [r for r in running if r.generated < r.response] + [
            r for r in new if r.generated < r.response
        ]
    return steps


@dataclass
class Outcome:
    steps: int
    dumped_steps: int
    bytes: float
    pairable: int
    captured: int = 0


def recipe(steps: list[Step], step_bytes: float) -> Outcome:
    pairable = sum(1 for s in steps if s.decodes == 0 and len(s.new) == 1)
    return Outcome(len(steps), len(steps), len(steps) * step_bytes, pairable)


def selective(steps: list[Step], fraction: float, cost: TensorModel | float) -> Outcome:
    rule = CaptureRule(fraction=fraction)
    dumped, total, captured = 0, 0.0, 0
    for s in steps:
        if not s.new:
            continue  # decode step: should_dump would say None without looking further
        sched = [
            ScheduledRequest(
                request_id=f"{r.rid}-0123abcd",
                type="new",
                tokens=r.prompt,
                prompt_tokens=r.prompt,
                num_computed_tokens=0,
            )
            for r in s.new
        ]
        captured += sum(1 for r in s.new if rule.captures(r.rid))
        pick = should_dump(sched, "prefill", rule)
        if pick is None:
            continue
        dumped += 1
        tokens = next(r.tokens for r in sched if r.request_id == pick)
        total += cost if isinstance(cost, float) else cost.bytes(tokens, s.decodes + len(s.new))
    return Outcome(len(steps), dumped, total, dumped, captured)


# --------------------------------------------------------------------------- report


def _gb(x: float) -> str:
    return f"{x / 1e9:9.2f} GB"


def _ratio(a: float, b: float) -> str:
    return "inf (baseline 0)" if b == 0 else f"{a / b:.1f}x"


def _best_fraction(by_f: dict[float, Outcome], base: Outcome) -> float | None:
    """The largest capture fraction of the sweep with >= GOAL x fewer bytes than the recipe."""
    ok = [f for f, o in by_f.items() if o.bytes * GOAL <= base.bytes]
    return max(ok) if ok else None


def _meets_both(o: Outcome, base: Outcome) -> bool:
    return o.bytes * GOAL <= base.bytes and o.pairable >= GOAL * max(base.pairable, 1)


def main() -> None:
    from importlib.metadata import version

    import msprobe  # noqa: F401  (fail early, before any work, if mindstudio-probe is missing)

    t0 = time.perf_counter()
    print(f"hardware: {hardware()}; mindstudio-probe {version('mindstudio-probe')}")
    with tempfile.TemporaryDirectory(prefix="bench-selective-") as tmp:
        work = Path(tmp)
        stats = _measure("stats", work)
        tensors = {key: tensor_model(_measure(key, work)) for key in TENSOR_SETTINGS}
    st = stats["sizes"]
    recipe_prefill, recipe_decode, scoped_stats = (sum(st[k].values()) for k in ("step0", "step1", "step2"))
    recipe_step = (recipe_prefill + recipe_decode) / 2
    print(f"measured in {time.perf_counter() - t0:.0f} s (real msprobe dumps, L0):")
    print(
        f"  statistics, 24 layers: recipe prefill step {recipe_prefill / 1e6:.2f} MB, decode step "
        f"{recipe_decode / 1e6:.2f} MB, request-scoped step {scoped_stats / 1e6:.2f} MB"
    )
    per_token = {k: LAYERS * m.layer_b + m.other_b for k, m in tensors.items()}
    for key, m in tensors.items():
        print(
            f"  tensor, {TENSOR_SETTINGS[key].label:40} {per_token[key] / 1e6:.3f} MB per token + "
            f"{(LAYERS * m.layer_a + m.other_a + m.embed_param + m.json_bytes) / 1e6:7.1f} MB per step "
            f"(parameters included) + {(m.logits_in_row + m.logits_out_row) / 1e6:.2f} MB per request in step"
        )
    print(f"  (scaled to {LAYERS} layers and vocab {QWEN05_VOCAB}; see the module docstring)")
    for key in ("layers_forward", "layers_output", "blocks_output"):
        print(
            f"ratio tensor bytes per token, layer list data_mode all / {TENSOR_SETTINGS[key].label}: "
            f"{_ratio(per_token['layers_all'], per_token[key])}"
        )

    t1 = time.perf_counter()
    rows = []
    for rate in ARRIVAL_RATES:
        arrivals = make_requests(rate)
        for mixed in (True, False):
            steps = simulate(arrivals, mixed=mixed)
            base = recipe(steps, recipe_step)
            modes: dict[str, dict[float, Outcome]] = {
                "statistics": {f: selective(steps, f, float(scoped_stats)) for f in FRACTIONS}
            }
            for key, m in tensors.items():
                modes[key] = {f: selective(steps, f, m) for f in FRACTIONS}
            rows.append((rate, mixed, steps, base, modes))
    print(f"simulated {len(rows)} schedules of {N_REQUESTS} requests in {time.perf_counter() - t1:.0f} s")

    def label(mode: str) -> str:
        return "statistics" if mode == "statistics" else f"tensor, {TENSOR_SETTINGS[mode].label}"

    rate, _, steps, base, modes = next(r for r in rows if r[0] == HEADLINE_RATE and r[1])
    prefill_steps = sum(1 for s in steps if s.new)
    multi = sum(1 for s in steps if s.decodes + len(s.new) > 1 and s.new)
    print()
    print(
        f"headline: vLLM v1 scheduler (mixed steps), {rate:g} req/s Poisson, max_num_seqs {MAX_NUM_SEQS}, "
        f"max_num_batched_tokens {MAX_BATCHED_TOKENS}, chunked prefill off, {N_REQUESTS} requests"
    )
    print(
        f"  {len(steps)} steps; {prefill_steps} admit new requests, {multi} of them hold >1 request; "
        f"mean running {statistics.mean(s.decodes for s in steps):.0f}"
    )
    print(f"  {'':82}{'steps dumped':>13}{'bytes':>13}{'pairable':>10}")
    print(
        f"  {'recipe (every step, statistics)':82}{base.dumped_steps / base.steps:>13.2%}{_gb(base.bytes)}"
        f"{base.pairable:>10}"
    )
    chosen: dict[str, float] = {}
    for mode, by_f in modes.items():
        best = _best_fraction(by_f, base)
        chosen[mode] = best if best is not None else min(FRACTIONS)
        o = by_f[chosen[mode]]
        name = f"selective {label(mode)}, fraction:{chosen[mode]:g}"
        print(f"  {name:82}{o.dumped_steps / o.steps:>13.2%}{_gb(o.bytes)}{o.pairable:>10}")
    print(
        "  (each selective row: the largest capture fraction of the sweep with >= 10x fewer bytes,"
        " else the smallest)"
    )
    for mode in modes:
        f = chosen[mode]
        o = modes[mode][f]
        print(
            f"ratio dumped bytes, recipe / selective {label(mode)} fraction:{f:g}: "
            f"{_ratio(base.bytes, o.bytes)} (goal >= 10x)"
        )
        print(
            f"ratio pairable requests, selective {label(mode)} fraction:{f:g} / recipe: "
            f"{_ratio(o.pairable, base.pairable)} (goal >= 10x) -> both goals "
            f"{'MET' if _meets_both(o, base) else 'NOT met'}"
        )
    winners = [m for m in TENSOR_SETTINGS if _meets_both(modes[m][chosen[m]], base)]
    if winners:
        top = max(winners, key=lambda m: (modes[m][chosen[m]].pairable, -modes[m][chosen[m]].bytes))
        print(
            f"tensor setting meeting both goals with the most pairs: {TENSOR_SETTINGS[top].label}, "
            f"fraction:{chosen[top]:g} ({modes[top][chosen[top]].pairable} pairable, "
            f"{_ratio(base.bytes, modes[top][chosen[top]].bytes)} fewer bytes)"
        )
    else:
        print("no tensor setting meets both goals on the headline schedule")
    print()
    for mode, by_f in modes.items():
        print(f"capture-fraction trade-off, selective {label(mode)} (headline schedule):")
        print(
            f"  {'F':>6}{'captured':>10}{'pairable':>10}{'lost':>6}{'bytes':>13}{'bytes ratio':>13}"
            f"{'pairs ratio':>13}  both goals"
        )
        for f, o in by_f.items():
            print(
                f"  {f:>6g}{o.captured:>10}{o.pairable:>10}{o.captured - o.pairable:>6}{_gb(o.bytes)}"
                f"{_ratio(base.bytes, o.bytes):>13}{_ratio(o.pairable, base.pairable):>13}"
                f"  {'MET' if _meets_both(o, base) else '-'}"
            )
    print(
        "  (lost: captured requests that shared a step with an earlier captured one; msprobe scopes one"
        " request per step)"
    )
    print()
    print(
        f"sensitivity (tensor, {TENSOR_SETTINGS[DEFAULT_TENSOR].label}, fraction:{HEADLINE_FRACTION:g}): "
        "arrival rate, scheduler model"
    )
    print(
        f"  {'req/s':>6} {'scheduler':<15}{'steps':>8}{'recipe pairs':>14}{'sel. pairs':>12}"
        f"{'bytes ratio':>13}{'pairs ratio':>13}"
    )
    for rate, mixed, steps, base, modes in rows:
        o = modes[DEFAULT_TENSOR][HEADLINE_FRACTION]
        print(
            f"  {rate:>6g} {'v1 mixed' if mixed else 'separate (v0)':<15}{len(steps):>8}{base.pairable:>14}"
            f"{o.pairable:>12}{_ratio(base.bytes, o.bytes):>13}{_ratio(o.pairable, base.pairable):>13}"
        )
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], Path(sys.argv[3]))
    else:
        main()
