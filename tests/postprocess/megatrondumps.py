"""Megatron-layout runs for compare tests: real Megatron dumps (committed) against vLLM-side dumps.

``build_runs(dump_root, fixture)`` makes two run folders in the standard layout, each with:

* **Training side — real, committed**: the patched Megatron engine (``MegatronEngineWithLMHead``,
  megatron-core 0.16.1, TP=1, bf16) ran on an NVIDIA H200 with ``DUMP_ON=1``; its log_prob phase
  wrote one msprobe statistics dump per micro batch (one request each) and the
  ``update_actor_log.jsonl`` lines that name them. ``FIXTURE`` (``fixtures/megatron-h200/``) is
  verl 0.8.0's, ``FIXTURE_NEXT`` (``fixtures/megatron-h200-next/``) verl 0.9.1's (the ``next`` pin
  set). megatron-core cannot run on CPU (entrypoints/README.md, "NVIDIA GPUs"), so CI reads these files.
* **Inference side — STAND-IN** (:mod:`bench.support.vllm_qwen2`) with vLLM's Qwen2 module names,
  loaded with ``weights.safetensors``: the engine's own weights as verl hands them to vLLM (mbridge's
  Megatron → HF export). Generated here on CPU in bf16, in a child process (msprobe's debugger is a
  per-process singleton), one single-request prefill step per request, logged with the real
  ``DispatchRecord`` writer and vLLM-style ids (``{id}-{8 hex}``).

``ok``: equal weights on both sides. ``diff``: the inference side's
``model.layers.1.mlp.down_proj`` weight is perturbed like :mod:`bench.support.realdumps`.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.support import realdumps

FIXTURE = Path(__file__).with_name("fixtures") / "megatron-h200"
FIXTURE_NEXT = Path(__file__).with_name("fixtures") / "megatron-h200-next"
RUNS = {"ok": "mcoreok-20261130-000000-0031", "diff": "mcorediff-20261130-000000-0032"}
CHANGED_MODULE = realdumps.CHANGED_MODULE


def meta(fixture: Path = FIXTURE) -> dict[str, Any]:
    return json.loads((fixture / "meta.json").read_text())


def _vid(rid: str) -> str:
    return f"{rid}-{rid[:8]}"


def _rollout(run_dir: Path, perturb: bool, fixture: Path) -> None:
    """One rollout worker process: the stand-in with the exported weights, one prefill per request."""
    import os

    import torch
    from msprobe.pytorch import PrecisionDebugger
    from safetensors.torch import load_file

    from bench.support.vllm_qwen2 import Qwen2ForCausalLM, run_step
    from verl_consistency.contracts import layout, records
    from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2, tiny_qwen2_config

    torch.set_num_threads(1)
    info = meta(fixture)
    run = layout.RunLayout(run_dir.parent, run_dir.name)
    dump_dir = layout.process_dump_dir(run.rollout_dir, os.getpid())
    debugger = PrecisionDebugger(config_path=str(run.rollout_config), dump_path=str(dump_dir))
    hf = tiny_qwen2(tiny_qwen2_config(**info["model_config"]))
    missing, unexpected = hf.load_state_dict(load_file(str(fixture / "weights.safetensors")), strict=False)
    if missing or unexpected:
        raise SystemExit(f"exported weights do not fit the model: missing {missing}, unexpected {unexpected}")
    model = Qwen2ForCausalLM.from_hf(hf.to(torch.bfloat16)).eval()
    if perturb:
        with torch.no_grad():
            w = model.model.layers[1].mlp.down_proj.weight
            noise = torch.randn(w.shape, generator=torch.Generator().manual_seed(1)).to(w.dtype)
            p = realdumps.PERTURBATION
            w.mul_(1 + p).add_(p * w.float().std().to(w.dtype) * noise)
    log = records.JsonlWriter(dump_dir / records.DISPATCH_LOG)
    rel = layout.relative_to_run(dump_dir, run.run_dir)
    for rid, tokens in info["prompts"].items():
        PrecisionDebugger.start(model=model, rank_id=0)
        log.write(
            records.DispatchRecord(
                timestamp=records.now(),
                pid=os.getpid(),
                rank=0,
                step=debugger.service.current_iter,
                dump_path=rel,
                phase="prefill",
                attn_state="PrefillNoCache",
                total_num_scheduled_tokens=len(tokens),
                requests=[
                    records.ScheduledRequest(
                        request_id=_vid(rid),
                        type="new",
                        tokens=len(tokens),
                        prompt_tokens=len(tokens),
                        num_computed_tokens=0,
                    )
                ],
            )
        )
        run_step(model, [tokens])
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
    log.close()


def generate(dump_root: Path, fixture: Path = FIXTURE) -> None:
    """Both runs under ``dump_root`` (run in a throwaway process: see the module docstring)."""
    import torch  # noqa: F401  (imported once, before forking)

    from verl_consistency.contracts import layout

    jobs = []
    for kind, run_id in RUNS.items():
        run = layout.RunLayout(dump_root, run_id)
        shutil.copytree(fixture / "actor", run.actor_dir)
        for path, task_cfg in ((run.rollout_config, "statistics"), (run.actor_config, "statistics")):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(realdumps.msprobe_config(task_cfg), indent=2))
        jobs.append((_rollout, (run.run_dir, kind == "diff", fixture)))
    realdumps.run_forked(jobs, "rollout workers")


@dataclass(frozen=True)
class MegatronRuns:
    dump_root: Path
    ok: Path
    diff: Path
    request_ids: tuple[str, ...]
    fixture: Path = FIXTURE


_CACHE: dict[tuple[Path, Path], MegatronRuns] = {}


def build_runs(dump_root: Path, fixture: Path = FIXTURE) -> MegatronRuns:
    """Generate (once per process, ``dump_root`` and ``fixture``) and describe the two runs."""
    dump_root, fixture = dump_root.resolve(), fixture.resolve()
    key = (dump_root, fixture)
    if key not in _CACHE:
        realdumps.generate_once("tests.postprocess.megatrondumps", dump_root, str(fixture))
        _CACHE[key] = MegatronRuns(
            dump_root=dump_root,
            ok=dump_root / RUNS["ok"],
            diff=dump_root / RUNS["diff"],
            request_ids=tuple(meta(fixture)["prompts"]),
            fixture=fixture,
        )
    return _CACHE[key]


if __name__ == "__main__":
    generate(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else FIXTURE)
