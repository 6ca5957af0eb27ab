"""Token records: the hook's cost per training step, against the same step without it.

    python -m bench.bench_token_hook [--steps N] [--sizes 64x1024,256x4096,...]

1. **Per training step** (the ratio). The real verl 0.8.0 FSDP engine on CPU (patched copy of the
   pinned wheel, tiny random Qwen2, as in bench/support/fsdp_driver.py) runs what
   ``RayPPOTrainer.fit`` runs per step around the hook: old log-probs (``infer_batch``), verl's
   own ``calculate_debug_metrics``, one actor update (``train_batch``). Steps alternate with the
   hook off and on (``token_mismatch.record`` writing to a temp run folder); medians are compared.
   A tiny model makes the step as cheap as it gets, so this ratio is an upper bound.
2. **Scaling.** The hook alone against verl's ``calculate_debug_metrics`` (which verl already runs
   at the same place), on synthetic batches of realistic shapes (responses x response length).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench.support.hardware import hardware
from bench.support.verl_support import patched_verl, run_patched

STEP_SCRIPT = r"""
import json, os, statistics, sys, time
from functools import partial
from pathlib import Path
from bench.support import fsdp_driver as drv
import torch
work = Path(os.environ["VC_TEST_WORK"]); work.mkdir(parents=True, exist_ok=True)
drv._init_dist(); drv._serve_pure_torch_attention_helpers()
model_dir = drv._tiny_qwen2(work)
from verl.trainer.config import CheckpointConfig
from verl.utils import tensordict_utils as tu
from verl.utils.debug.metrics import calculate_debug_metrics
from verl.workers.config import HFModelConfig
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding
from verl_consistency.patches.hooks.training import token_mismatch
actor_cfg = drv._actor_config(model_dir)
mc = HFModelConfig(path=str(model_dir), load_tokenizer=False,
                   override_config={"attn_implementation": "eager"},
                   use_remove_padding=True, enable_gradient_checkpointing=False)
engine = FSDPEngineWithLMHead(model_config=mc, engine_config=actor_cfg.engine,
                              optimizer_config=actor_cfg.optim, checkpoint_config=CheckpointConfig())
engine.initialize()
env_on = {"VERL_CONSISTENCY_TOKEN_LEVEL": "1", "VERL_CONSISTENCY_RUN_DIR": os.environ["VC_RUN_DIR"]}
times = {"off": [], "on": []}
hook_ms = []
for i in range(int(os.environ["VC_STEPS"]) * 2 + 2):
    on = i % 2 == 1
    batch = drv._rollout_batch()
    t0 = time.perf_counter()
    td = left_right_2_no_padding(batch.to_tensordict())
    drv._engine_keys(td, calculate_entropy=True, compute_loss=False)
    with engine.eval_mode():
        out = engine.infer_batch(td)
    batch.batch["old_log_probs"] = no_padding_2_padding(tu.get(out["model_output"], "log_probs"), td).float()
    metrics = calculate_debug_metrics(batch)
    if on:
        h0 = time.perf_counter()
        token_mismatch.record(batch, global_step=i, verl_metrics=metrics, environ=env_on)
        hook_ms.append((time.perf_counter() - h0) * 1e3)
    batch.batch["advantages"] = torch.zeros_like(batch.batch["old_log_probs"])
    td = left_right_2_no_padding(batch.to_tensordict())
    drv._engine_keys(td, calculate_entropy=True, global_batch_size=4)
    with engine.train_mode():
        engine.train_batch(td, loss_function=partial(ppo_loss, actor_cfg))
    if i >= 2:  # two warm-up steps
        times["on" if on else "off"].append((time.perf_counter() - t0) * 1e3)
med = {k: statistics.median(v) for k, v in times.items()}
res = {"median_ms": med, "hook_ms": statistics.median(hook_ms), "n": len(times["on"])}
print("VC_BENCH " + json.dumps(res))
"""

SCALE_SCRIPT = r"""
import json, os, statistics, sys, time
import numpy as np, torch
from verl import DataProto
from verl.utils.debug.metrics import calculate_debug_metrics
from verl_consistency.patches.hooks.training import token_mismatch
out = []
for size in os.environ["VC_SIZES"].split(","):
    b, length = (int(x) for x in size.split("x"))
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(b, length, generator=g) * 3
    lengths = torch.randint(length // 4, length + 1, (b, 1), generator=g)
    mask = (torch.arange(length)[None, :] < lengths).long()
    data = DataProto.from_dict(
        tensors={"responses": torch.ones(b, length, dtype=torch.long), "response_mask": mask,
                 "old_log_probs": old, "rollout_log_probs": old + torch.randn(b, length, generator=g) * 0.01},
        non_tensors={"request_id": np.array([f"r{i}" for i in range(b)], dtype=object),
                     "index": np.array(list(range(b)), dtype=object)},
    )
    run_dir = os.environ["VC_RUN_DIR"] + "/" + size
    env = {"VERL_CONSISTENCY_TOKEN_LEVEL": "1", "VERL_CONSISTENCY_RUN_DIR": run_dir}
    verl_t, ours_t = [], []
    for _ in range(5):
        t0 = time.perf_counter(); m = calculate_debug_metrics(data); verl_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); token_mismatch.record(data, global_step=0, verl_metrics=m, environ=env)
        ours_t.append(time.perf_counter() - t0)
    out.append({"size": size, "tokens": int(mask.sum()), "verl_ms": statistics.median(verl_t) * 1e3,
                "hook_ms": statistics.median(ours_t) * 1e3})
print("VC_BENCH " + json.dumps(out))
"""


def _run(root: Path, script: str, env: dict[str, str], timeout: int = 1800) -> object:
    """``script`` under the patched verl (``run_patched``); its ``VC_BENCH`` line, parsed."""
    out = run_patched(root, script, env=env, timeout=timeout)
    line = next(x for x in out.splitlines() if x.startswith("VC_BENCH "))
    return json.loads(line.removeprefix("VC_BENCH "))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8, help="measured steps with the hook on (and as many off)")
    ap.add_argument("--sizes", default="64x1024,256x2048,512x4096,1024x8192")
    args = ap.parse_args()
    print(f"hardware: {hardware()}")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root = patched_verl(base)
        step = _run(
            root,
            STEP_SCRIPT,
            {
                "VC_TEST_WORK": str(base / "work"),
                "VC_TEST_PORT": "29611",
                "VC_RUN_DIR": str(base / "run"),
                "VC_STEPS": str(args.steps),
            },
        )
        assert isinstance(step, dict)
        off, on = step["median_ms"]["off"], step["median_ms"]["on"]
        hook = step["hook_ms"]
        print(
            f"training step (real verl FSDP engine, tiny Qwen2, 4 responses, CPU): without hook "
            f"{off:.1f} ms, with hook {on:.1f} ms (medians of {step['n']} alternating steps); "
            f"the hook alone {hook:.2f} ms"
        )
        print(
            f"ratio, step with hook / step without: {(off + hook) / off:.4f}x from the hook's own time "
            f"(A/B of whole steps: {on / off:.3f}x, within step-to-step noise)"
        )
        scale = _run(root, SCALE_SCRIPT, {"VC_SIZES": args.sizes, "VC_RUN_DIR": str(base / "scale")})
        assert isinstance(scale, list)
        print("responses x length | valid tokens | verl calculate_debug_metrics ms | our hook ms | hook/verl")
        for row in scale:
            ratio = row["hook_ms"] / row["verl_ms"]
            print(
                f"{row['size']:>18} | {row['tokens']:>12} | {row['verl_ms']:>31.1f} | "
                f"{row['hook_ms']:>11.1f} | {ratio:.2f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
