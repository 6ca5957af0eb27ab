"""Real msprobe dumps of the same tiny Qwen2 under verl's two FSDP strategies, for compare tests.

``build_runs(dump_root)`` runs ``python -m tests.postprocess.fsdp2dumps DUMP_ROOT`` in a child
process (msprobe's ``PrecisionDebugger`` is a per-process singleton that patches torch; see
:mod:`tests.postprocess.realdumps`, whose workers, configs and scenario this reuses by import).
Four runs, two per msprobe task, identical except for the training side's sharding:

* ``strategy=fsdp`` — :func:`realdumps.wrap_fsdp1`, one FSDP1 unit per decoder layer, as verl's
  default FSDP1 strategy wraps it;
* ``strategy=fsdp2`` — **verl 0.8.0's own** ``verl.utils.fsdp_utils.apply_fsdp2`` (``fully_shard``
  on every decoder layer, ``embed_tokens``, ``lm_head`` and the root), which is what verl runs for
  ``actor_rollout_ref.actor.strategy=fsdp2``. The statistics run shards over a real 2-rank gloo
  group.

The inference side is realdumps' **stand-in** with vLLM's module names and the planted change in
``model.layers.1.mlp.down_proj``. Statistics: one single-request prefill (R1) against a micro
batch of R1. Tensor: the request-scoped step of realdumps (R2 dumped out of a step packing R2 and
R3) against a micro batch of R2.

``verl`` is imported before the workers fork, so every worker has it in ``sys.modules`` as
every process of a real verl job does (the trainer imports it; vLLM workers import verl's
``worker_extension_cls``). msprobe 26.2.0 changes what it hooks when it sees that: see
postprocess/README-compare.md.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.postprocess import realdumps
from tests.postprocess.realdumps import RunSpec, Worker

RUNS = {
    ("fsdp", "statistics"): "fsdp1stats-20260101-000000-0011",
    ("fsdp2", "statistics"): "fsdp2stats-20260101-000000-0012",
    ("fsdp", "tensor"): "fsdp1tensor-20260101-000000-0013",
    ("fsdp2", "tensor"): "fsdp2tensor-20260101-000000-0014",
}
FSDP2_STATS_WORLD = 2
"""The FSDP2 statistics run shards over two ranks, so rank 0 holds half of every parameter."""


def wrap_fsdp2(hf: Any) -> Any:
    """Shard ``hf`` exactly as verl 0.8.0's ``strategy=fsdp2`` does (its own ``apply_fsdp2``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from verl.utils.fsdp_utils import apply_fsdp2

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    apply_fsdp2(hf, {"mesh": mesh, "reshard_after_forward": True}, {})
    return hf


def _workers() -> list[Worker]:
    ws: list[Worker] = []
    for (strategy, task), run_id in RUNS.items():
        wrap = wrap_fsdp2 if strategy == "fsdp2" else realdumps.wrap_fsdp1
        if task == "statistics":
            rollout = [realdumps.STATS_ROLLOUT[0]]  # the single-request prefill of R1
            actor_steps = [realdumps.ActorStep([realdumps.R1])]
            request_id = None
        else:
            rollout = realdumps.TENSOR_ROLLOUT
            actor_steps = realdumps.TENSOR_ACTOR[0]
            request_id = realdumps.TENSOR_ROLLOUT[0].scoped_request_id
        ws.append(Worker("rollout", run_id, 0, task, rollout_steps=rollout, request_id=request_id))
        world = FSDP2_STATS_WORLD if (strategy, task) == ("fsdp2", "statistics") else 1
        port = realdumps._free_port()
        ws += [
            Worker("actor", run_id, r, task, actor_steps=actor_steps, world_size=world, port=port, wrap=wrap)
            for r in range(world)
        ]
    return ws


def _write_configs(dump_root: Path) -> None:
    import json

    from verl_consistency import layout

    for (_, task), run_id in RUNS.items():
        run = layout.RunLayout(dump_root, run_id)
        rid = realdumps.TENSOR_ROLLOUT[0].scoped_request_id if task == "tensor" else None
        for path, cfg in (
            (run.rollout_config, realdumps.msprobe_config(task, rid)),
            (run.actor_config, realdumps.msprobe_config(task)),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cfg, indent=2))


def generate(dump_root: Path) -> None:
    """Make the four runs under ``dump_root`` (in a throwaway process, like realdumps)."""
    import multiprocessing as mp

    import torch  # noqa: F401  (imported once, before forking)
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401
    import verl.utils.fsdp_utils  # noqa: F401  (every worker of a real verl job has verl imported)

    _write_configs(dump_root)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=realdumps._run_worker, args=(w, dump_root)) for w in _workers()]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise SystemExit(f"dump workers failed with exit codes {bad}")


@dataclass(frozen=True)
class StrategyRuns:
    """``runs[(strategy, task)]``: the run of that training strategy and msprobe task."""

    dump_root: Path
    runs: dict[tuple[str, str], RunSpec]


def specs(dump_root: Path) -> StrategyRuns:
    return StrategyRuns(
        dump_root=dump_root,
        runs={
            key: RunSpec(
                run_dir=dump_root / run_id,
                task=key[1],
                paired_requests=(realdumps.R1,) if key[1] == "statistics" else (realdumps.R2,),
            )
            for key, run_id in RUNS.items()
        },
    )


_CACHE: dict[Path, StrategyRuns] = {}


def build_runs(dump_root: Path) -> StrategyRuns:
    """Generate (once per process and ``dump_root``) and describe the four runs."""
    dump_root = dump_root.resolve()
    if dump_root not in _CACHE:
        realdumps.generate_once("tests.postprocess.fsdp2dumps", dump_root)
        _CACHE[dump_root] = specs(dump_root)
    return _CACHE[dump_root]


if __name__ == "__main__":
    generate(Path(sys.argv[1]))
