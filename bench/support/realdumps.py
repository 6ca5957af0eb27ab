"""Real mindstudio-probe dumps of a tiny random Qwen2, both sides, in the run-folder layout.

``build_runs(dump_root)`` runs ``python -m bench.support.realdumps DUMP_ROOT`` in a child
process (msprobe's ``PrecisionDebugger`` is a per-process singleton that patches torch, so it
must never load into the pytest process). That process imports torch once and forks one child
per simulated worker, so every worker is a real process with its own pid and its own debugger:

* **Training side — real.** Hugging Face ``Qwen2ForCausalLM`` (2 layers, hidden 64, eager
  attention) wrapped in **FSDP1** (``FullyShardedDataParallel`` with a decoder-layer wrap policy,
  as verl's ``strategy=fsdp`` does) over a real 2-rank gloo group. The ``_fsdp_wrapped_module.``
  names are what msprobe 26.2.0's ``--consistent_check --backend fsdp`` parses; with FSDP2
  (``fully_shard``, no wrapper in the names) it matches nothing. Micro batches are packed
  ``[1, T]`` like verl's remove-padding path, forward-only (the ``log_prob`` phase).
* **Inference side — STAND-IN** (:mod:`bench.support.vllm_qwen2`): vLLM's Qwen2 module
  tree and packed activations with the HF weights, so the name mapping (q/k/v → qkv_proj,
  gate/up → gate_up_proj) and the fused-tensor concatenation run for real. Its two TP "ranks"
  each run the whole model (the stand-in does not shard).
* **Logs — the real writers**: ``records.JsonlWriter`` with ``DispatchRecord`` and
  ``UpdateActorRecord``, one file per pid, ``dump_path`` relative to the run folder.
* **The deliberate difference**: the inference side's ``model.layers.1.mlp.down_proj`` weight is
  scaled and jittered (:data:`PERTURBATION`), so the first divergence must land there.

Two runs are made (one msprobe config each):

``stats`` (statistics mode): rollout TP=2 (2 pids), FSDP world 2 (2 pids). Pairs: R1 and R6
(an n>1 child id). Unpaired: a decode step, a two-request prefill, a prefix-cache hit, a rollout
prefill with no micro batch (R5), a two-request micro batch, a micro batch with no rollout
prefill (R7), and rollout rank 1 (TP sharding mismatch against unsharded FSDP).

``tensor`` (tensor mode, request-scoped): one rollout worker with ``request_id`` = R2 dumps only
R2's rows of a step that packs R2 and R3 (``scheduled_tokens``); one training rank dumps a micro
batch of R2 alone. One scoped pair.

Takes about 10-20 s on 2 cores; :func:`build_runs` caches the result per pytest session.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

CHANGED_MODULE = "model.layers.1.mlp.down_proj"
"""vLLM-side module path whose weight the inference side scales (the planted divergence)."""
PERTURBATION = 0.2
"""The weight becomes ``W·(1+P) + P·std(W)·noise``: both its norm and its direction change, so
statistics mode (norms) and tensor mode (cosine) each see it."""

STATS_RUN = "stats-20260101-000000-0001"
TENSOR_RUN = "tensor-20260101-000000-0002"

VOCAB = 128
SEED = 0


def _rid(n: int) -> str:
    """A verl-style request id (32 hex, like ``uuid4().hex``), stable per test."""
    return f"{n:02d}" + "ab" * 15


def _vid(n: int, child: int | None = None) -> str:
    """What vLLM 0.18 makes of it: ``{id}-{8 hex}``, or ``{i}_{id}-{8 hex}`` for n>1 children."""
    base = f"{_rid(n)}-{n:02d}c0ffee"
    return base if child is None else f"{child}_{base}"


R1, R2, R3, R4, R5, R6, R7 = (_rid(i) for i in range(1, 8))

PROMPT_LEN = {R1: 7, R2: 5, R3: 6, R4: 7, R5: 6, R6: 8, R7: 5}


def prompt(rid: str) -> list[int]:
    """Deterministic prompt tokens of a request, the same on both sides."""
    seed = int(rid[:2])
    return [(seed * 31 + 7 * i) % VOCAB for i in range(PROMPT_LEN[rid])]


@dataclass
class Sched:
    vllm_id: str
    type: str
    tokens: int
    prompt_tokens: int | None = None
    num_computed_tokens: int | None = None


@dataclass
class RolloutStep:
    phase: str
    attn_state: str
    requests: list[Sched]
    scoped_request_id: str | None = None


@dataclass
class ActorStep:
    request_ids: list[str]


@dataclass
class Worker:
    side: str
    run_id: str
    rank: int
    task: str
    rollout_steps: list[RolloutStep] = field(default_factory=list)
    actor_steps: list[ActorStep] = field(default_factory=list)
    world_size: int = 1
    port: int = 0
    request_id: str | None = None
    wrap: Callable[[Any], Any] | None = None
    """Training side: shards the HF model in the worker's process group (default :func:`wrap_fsdp1`)."""


@dataclass(frozen=True)
class RunSpec:
    """What a test may rely on about one generated run."""

    run_dir: Path
    task: str
    paired_requests: tuple[str, ...]
    changed_module: str = CHANGED_MODULE
    unpaired_reasons: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RealRuns:
    dump_root: Path
    stats: RunSpec
    tensor: RunSpec


def _new(vid: str, rid: str) -> Sched:
    return Sched(vid, "new", PROMPT_LEN[rid], PROMPT_LEN[rid], 0)


STATS_ROLLOUT = [
    RolloutStep("prefill", "PrefillNoCache", [_new(_vid(1), R1)]),
    RolloutStep("decode", "DecodeOnly", [Sched(_vid(1), "cached", 1)]),
    RolloutStep("prefill", "PrefillNoCache", [_new(_vid(2), R2), _new(_vid(3), R3)]),
    RolloutStep("prefill", "PrefillCacheHit", [Sched(_vid(4), "new", 3, PROMPT_LEN[R4], 4)]),
    RolloutStep("prefill", "PrefillNoCache", [_new(_vid(5), R5)]),
    RolloutStep("prefill", "PrefillNoCache", [_new(_vid(6, child=0), R6)]),
]
STATS_ACTOR = {0: [ActorStep([R1]), ActorStep([R2, R3])], 1: [ActorStep([R6]), ActorStep([R7])]}

TENSOR_ROLLOUT = [
    RolloutStep("prefill", "PrefillNoCache", [_new(_vid(2), R2), _new(_vid(3), R3)], _vid(2)),
]
TENSOR_ACTOR = {0: [ActorStep([R2])]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _workers() -> list[Worker]:
    port = _free_port()
    ws: list[Worker] = [
        Worker("rollout", STATS_RUN, rank, "statistics", rollout_steps=STATS_ROLLOUT) for rank in (0, 1)
    ]
    ws += [
        Worker("actor", STATS_RUN, rank, "statistics", actor_steps=steps, world_size=2, port=port)
        for rank, steps in STATS_ACTOR.items()
    ]
    ws.append(Worker("rollout", TENSOR_RUN, 0, "tensor", rollout_steps=TENSOR_ROLLOUT, request_id=_vid(2)))
    ws.append(Worker("actor", TENSOR_RUN, 0, "tensor", actor_steps=TENSOR_ACTOR[0], port=_free_port()))
    return ws


def msprobe_config(task: str, request_id: str | None = None) -> dict[str, Any]:
    section: dict[str, Any] = {"scope": [], "list": [], "data_mode": ["forward"]}
    if task == "statistics":
        section["summary_mode"] = "statistics"
    if request_id is not None:
        section["request_id"] = request_id
    return {"task": task, "dump_path": "./unused", "rank": [], "step": [], "level": "L0", task: section}


def _tiny_hf() -> Any:
    from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2, tiny_qwen2_config

    cfg = tiny_qwen2_config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    return tiny_qwen2(cfg, seed=SEED)


def _run_worker(w: Worker, dump_root: Path) -> None:
    """One simulated worker process: its own msprobe debugger, dump folder and JSONL log."""
    import torch
    from msprobe.pytorch import PrecisionDebugger

    from verl_consistency.contracts import layout, records

    torch.set_num_threads(1)
    run = layout.RunLayout(dump_root, w.run_id)
    pid = os.getpid()
    side_dir = run.rollout_dir if w.side == "rollout" else run.actor_dir
    dump_dir = layout.process_dump_dir(side_dir, pid)
    config = run.rollout_config if w.side == "rollout" else run.actor_config
    debugger = PrecisionDebugger(config_path=str(config), dump_path=str(dump_dir))
    rel_dump = layout.relative_to_run(dump_dir, run.run_dir)
    hf = _tiny_hf()

    if w.side == "rollout":
        from bench.support.vllm_qwen2 import Qwen2ForCausalLM, forward_step

        model = Qwen2ForCausalLM.from_hf(hf).eval()
        with torch.no_grad():
            w_ = model.model.layers[1].mlp.down_proj.weight
            noise = torch.randn(w_.shape, generator=torch.Generator().manual_seed(1))
            w_.mul_(1 + PERTURBATION).add_(PERTURBATION * w_.std() * noise)
        log = records.JsonlWriter(dump_dir / records.DISPATCH_LOG)
        for st in w.rollout_steps:
            ids: list[int] = []
            pos: list[int] = []
            lens: list[int] = []
            for r in st.requests:
                toks = prompt(records.base_request_id(r.vllm_id))
                start = (r.num_computed_tokens or 0) if r.type == "new" else len(toks)
                chunk = toks[start : start + r.tokens] if r.type == "new" else [toks[-1]]
                ids += chunk
                pos += list(range(start, start + len(chunk)))
                lens.append(len(chunk))
            scheduled = {r.vllm_id: n for r, n in zip(st.requests, lens, strict=True)}
            PrecisionDebugger.start(model=model, rank_id=w.rank, scheduled_tokens=scheduled)
            step = debugger.service.current_iter  # msprobe sets it in start()
            log.write(
                records.DispatchRecord(
                    timestamp=records.now(),
                    pid=pid,
                    rank=w.rank,
                    step=step,
                    dump_path=rel_dump,
                    phase=st.phase,  # type: ignore[arg-type]
                    attn_state=st.attn_state,
                    total_num_scheduled_tokens=sum(lens),
                    requests=[
                        records.ScheduledRequest(
                            request_id=r.vllm_id,
                            type=r.type,  # type: ignore[arg-type]
                            tokens=r.tokens,
                            prompt_tokens=r.prompt_tokens,
                            num_computed_tokens=r.num_computed_tokens,
                        )
                        for r in st.requests
                    ],
                    scoped_request_id=st.scoped_request_id,
                )
            )
            forward_step(model, torch.tensor(ids), torch.tensor(pos), lens)
            PrecisionDebugger.stop()
            PrecisionDebugger.step()
        log.close()
        return

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{w.port}", rank=w.rank, world_size=w.world_size
    )
    fsdp = (w.wrap or wrap_fsdp1)(hf)
    log = records.JsonlWriter(dump_dir / records.UPDATE_ACTOR_LOG)
    for st in w.actor_steps:
        ids = [t for rid in st.request_ids for t in prompt(rid)]
        PrecisionDebugger.start(model=fsdp)
        step = debugger.service.current_iter
        log.write(
            records.UpdateActorRecord(
                timestamp=records.now(),
                pid=pid,
                rank=w.rank,
                step=step,
                dump_path=rel_dump,
                phase="log_prob",
                backend="fsdp",
                request_ids=st.request_ids,
                num_requests=len(st.request_ids),
            )
        )
        with torch.no_grad():
            fsdp(input_ids=torch.tensor([ids]))
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
    log.close()
    dist.destroy_process_group()


def wrap_fsdp1(hf: Any) -> Any:
    """FSDP1 with one unit per decoder layer, as verl's ``strategy=fsdp`` wraps it."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    return FSDP(
        hf,
        auto_wrap_policy=ModuleWrapPolicy({Qwen2DecoderLayer}),
        device_id=torch.device("cpu"),
        use_orig_params=True,
    )


def _write_configs(dump_root: Path) -> None:
    from verl_consistency.contracts import layout

    for run_id, task, rid in ((STATS_RUN, "statistics", None), (TENSOR_RUN, "tensor", _vid(2))):
        run = layout.RunLayout(dump_root, run_id)
        for path, cfg in (
            (run.rollout_config, msprobe_config(task, rid)),
            (run.actor_config, msprobe_config(task)),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cfg, indent=2))


def generate(dump_root: Path) -> None:
    """Make both runs under ``dump_root`` (run in a throwaway process: see the module docstring)."""
    import torch  # noqa: F401  (imported once, before forking)
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401

    _write_configs(dump_root)
    run_workers(_workers(), dump_root)


def run_workers(workers: list[Worker], dump_root: Path) -> None:
    """One forked process per worker (msprobe's debugger is per process); fail if any fails."""
    run_forked([(_run_worker, (w, dump_root)) for w in workers], "dump workers")


def run_forked(jobs: list[tuple[Callable[..., object], tuple[Any, ...]]], what: str) -> None:
    """Run each ``(target, args)`` in a forked process at once; fail naming ``what`` if any fails."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=target, args=args, daemon=False) for target, args in jobs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise SystemExit(f"{what} failed with exit codes {bad}")


def specs(dump_root: Path) -> RealRuns:
    return RealRuns(
        dump_root=dump_root,
        stats=RunSpec(
            run_dir=dump_root / STATS_RUN,
            task="statistics",
            paired_requests=(R1, R6),
            unpaired_reasons=frozenset(
                {
                    "decode_only",
                    "multi_request_step",
                    "no_training_micro_batch",
                    "multi_request_micro_batch",
                    "no_rollout_prefill",
                }
            ),
        ),
        tensor=RunSpec(run_dir=dump_root / TENSOR_RUN, task="tensor", paired_requests=(R2,)),
    )


_CACHE: dict[Path, RealRuns] = {}


def generate_once(module: str, dump_root: Path, *args: str) -> None:
    """Run ``python -m <module> <dump_root> [args...]`` unless an earlier run completed it.

    A fresh process per generator: msprobe's debugger is a per-process singleton, and torch's
    process group must not outlive the dumps.
    """
    if (dump_root / ".complete").exists():
        return
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", module, str(dump_root), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{module} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    (dump_root / ".complete").write_text(f"{time.monotonic() - t0:.1f}s\n")


def build_runs(dump_root: Path) -> RealRuns:
    """Generate (once per process and ``dump_root``) and describe the two runs."""
    dump_root = dump_root.resolve()
    if dump_root not in _CACHE:
        generate_once("bench.support.realdumps", dump_root)
        _CACHE[dump_root] = specs(dump_root)
    return _CACHE[dump_root]


if __name__ == "__main__":
    generate(Path(sys.argv[1]))


def known_pairs(spec: RunSpec) -> list[Any]:
    """The pairs a correct pairing must find, read from the run's real logs by the known answer.

    This is not a pairing implementation: it looks up, for each request the scenario *made*
    pairable, the rank-0 rollout step that logged it and the micro batch that holds it alone, so
    compare and report tests run without depending on the pairing stage.
    """
    from verl_consistency.contracts import records
    from verl_consistency.postprocess.pairing.pair_types import DumpRef, Pair

    def rank_dir(side: str, rec: dict[str, Any]) -> DumpRef:
        d = spec.run_dir / rec["dump_path"] / f"step{rec['step']}" / f"rank{rec['rank']}"
        return DumpRef(
            side=side,  # type: ignore[arg-type]
            pid=rec["pid"],
            rank=rec["rank"],
            step=rec["step"],
            dir=d.relative_to(spec.run_dir).as_posix(),
        )

    def lines(pattern: str) -> list[dict[str, Any]]:
        return [json.loads(x) for f in sorted(spec.run_dir.glob(pattern)) for x in f.read_text().splitlines()]

    roll = [
        r for r in lines(f"rollout/*/{records.DISPATCH_LOG}") if r["rank"] == 0 and r["phase"] == "prefill"
    ]
    act = lines(f"actor/*/{records.UPDATE_ACTOR_LOG}")
    out = []
    for rid in spec.paired_requests:
        r = next(
            r
            for r in roll
            if any(records.base_request_id(q["request_id"]) == rid for q in r["requests"])
            and (len(r["requests"]) == 1 or r.get("scoped_request_id"))
        )
        a = next(a for a in act if a["request_ids"] == [rid])
        vid = next(q["request_id"] for q in r["requests"] if records.base_request_id(q["request_id"]) == rid)
        out.append(
            Pair(
                pair_id=f"{rid}.r{r['rank']}.a{a['rank']}",
                request_id=rid,
                vllm_request_id=vid,
                rollout=rank_dir("rollout", r),
                actor=rank_dir("actor", a),
                backend="fsdp",
                prompt_tokens=PROMPT_LEN[rid],
                scoped=len(r["requests"]) > 1,
                task="tensor" if spec.task == "tensor" else "statistics",
            )
        )
    return out
