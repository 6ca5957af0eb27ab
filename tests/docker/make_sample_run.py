"""Make a small collection run folder with REAL msprobe dumps, inside the image (CPU, no NPU).

Run once per side (msprobe's debugger is one per process): the same tiny random Qwen2 and the
same prompt go through msprobe on the "rollout" side and on the "actor" side, and each side
writes its log record with the hooks' own models and writer, into the layout the entrypoints
decide. What is a stand-in: no vLLM and no verl run here; the two forwards are plain
transformers forwards. The postprocess then pairs, compares and bundles this folder for real.

    python make_sample_run.py RUN_DIR rollout|actor
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from msprobe.pytorch import PrecisionDebugger

from verl_consistency.contracts import layout, records
from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2, tiny_qwen2_config

REQUEST_ID = "0123456789abcdef0123456789abcdef"
VLLM_SUFFIX = "1a2b3c4d"
PROMPT = [3, 14, 15, 9, 26, 5, 35, 8]


def main(run_dir: Path, side: str) -> None:
    lay = layout.RunLayout.from_run_dir(run_dir)
    side_dir = lay.rollout_dir if side == "rollout" else lay.actor_dir
    dump_path = layout.process_dump_dir(side_dir)
    cfg = run_dir / "config" / f"msprobe_{side}.json"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(
        json.dumps(
            {
                "task": "statistics",
                "dump_path": str(dump_path),
                "rank": [],
                "step": [],
                "level": "L0",
                "async_dump": False,
                "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
            }
        )
    )
    config = tiny_qwen2_config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    model = tiny_qwen2(config, seed=0)
    debugger = PrecisionDebugger(config_path=str(cfg), dump_path=str(dump_path))
    step = debugger.service.current_iter
    debugger.start(model=model)
    with torch.no_grad():
        model(torch.tensor([PROMPT]))
    debugger.stop()
    debugger.step()
    rel = layout.relative_to_run(dump_path, run_dir)
    common = {"timestamp": records.now(), "pid": os.getpid(), "rank": 0, "step": step, "dump_path": rel}
    if side == "rollout":
        rec: records.DispatchRecord | records.UpdateActorRecord = records.DispatchRecord(
            **common,
            phase="prefill",
            attn_state="PrefillNoCache",
            total_num_scheduled_tokens=len(PROMPT),
            requests=[
                records.ScheduledRequest(
                    request_id=f"{REQUEST_ID}-{VLLM_SUFFIX}",
                    type="new",
                    tokens=len(PROMPT),
                    prompt_tokens=len(PROMPT),
                    num_computed_tokens=0,
                )
            ],
        )
        log = dump_path / records.DISPATCH_LOG
    else:
        rec = records.UpdateActorRecord(
            **common, phase="log_prob", backend="fsdp", request_ids=[REQUEST_ID], num_requests=1
        )
        log = dump_path / records.UPDATE_ACTOR_LOG
    writer = records.JsonlWriter(log)
    writer.write(rec)
    writer.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
