"""The two engines' stage processes: ``python -m verl_consistency.entrypoints.engines.stages
rollout|train ARGS.json OUT.json``.

The orchestrators (``demo``, ``check``, the vLLM bench) write ARGS.json and start this with
:func:`.stage_runner.run_stage`, one process per engine in the venv of the pin set in force; never
run by hand. Why a process each: vLLM and verl's FSDP engine both set up torch's process-wide
state (threads, the process group, the platform layer), and one engine's crash must leave the
orchestrator alive to report it with the log's tail.

* ``rollout``: :func:`.vllm_stage.rollout`, every prompt at once on real vLLM;
* ``train``: :func:`.fsdp_stage.train`, old log-probs on verl's real FSDP engine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from verl_consistency.entrypoints.engines import fsdp_stage, vllm_stage
from verl_consistency.entrypoints.engines.stage_runner import write_result


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if len(args_list) != 3 or args_list[0] not in ("rollout", "train"):
        usage = (
            "usage: python -m verl_consistency.entrypoints.engines.stages rollout|train ARGS.json OUT.json"
        )
        print(usage, file=sys.stderr)
        return 2
    stage, args_path, out_path = args_list
    args = json.loads(Path(args_path).read_text(encoding="utf-8"))
    write_result(out_path, vllm_stage.rollout(args) if stage == "rollout" else fsdp_stage.train(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
