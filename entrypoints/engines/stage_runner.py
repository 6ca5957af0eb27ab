"""How an orchestrator runs one engine's stage in a process of its own, and how the stage answers.

Both ends of one small protocol: the orchestrator (``demo``, ``check``, the vLLM bench) writes
``<stage>-args.json``, starts ``python -m <module> <stage> ARGS OUT`` in this venv and reads OUT
once the process has ended (:func:`run_stage`); the stage writes OUT atomically
(:func:`write_result`), so a crashed stage leaves no half-written answer. Any failure is a
:class:`StageError` carrying the log's tail, which every orchestrator reports as it is.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from verl_consistency.contracts.atomic import write_json_atomic

STAGES = "verl_consistency.entrypoints.engines.stages"
"""The module each engine's process runs (``python -m``) unless told another (``check``'s vLLM stage)."""

LOG_TAIL_LINES = 25


class StageError(RuntimeError):
    """A single-node run could not run, or its result is not what a healthy pipeline gives.

    Raised by the stage runner, the vLLM CPU environment, the tiny model and the verified bundle
    alike, so that ``demo`` and ``check`` catch one error and exit 1 with its message.
    """


def free_port() -> int:
    """A free local TCP port: the training stage's process group (world size 1) rendezvous there."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_stage(
    stage: str, args: dict[str, Any], work: Path, env: dict[str, str], log: Path, module: str = STAGES
) -> dict[str, Any]:
    """Run one engine's stage as ``python -m module stage ARGS OUT`` in this venv; its output, or
    :class:`StageError` with the log's tail."""
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
        tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        raise StageError(f"the {stage} stage failed (exit {res.returncode}); log {log}:\n" + "\n".join(tail))
    out: dict[str, Any] = json.loads(out_path.read_text())
    return out


def write_result(out_path: str, result: dict[str, Any]) -> None:
    """A stage's output JSON, atomically (the orchestrator reads it only once the process ended)."""
    tmp = Path(out_path).with_suffix(".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, out_path)
