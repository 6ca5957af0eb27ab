"""An engine process that stays up between requests: both ends of its line protocol.

``stage_runner`` runs a stage once (args in, result out, process gone). A weight sync needs more:
vLLM must keep running while the trainer steps and pushes new weights into it, and the trainer
must keep its optimizer state between its log-prob passes, so each engine lives in one process
for the whole flow and answers requests. The orchestrator (:class:`Session`) writes one JSON
object per line to the process's stdin (``{"op": ..., **args}``) and reads one line back; the
process (:func:`serve`) keeps a private duplicate of its stdout for the answers and points its
own stdout at its log (stderr), so vLLM's and verl's output never mixes into the protocol.

A process that dies, or answers ``{"error": traceback}``, is a :class:`.stage_runner.StageError`
carrying the log's tail, as with ``run_stage``.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from verl_consistency.entrypoints.engines.stage_runner import LOG_TAIL_LINES, StageError

Handler = Callable[[dict[str, Any]], dict[str, Any]]
CLOSE = "close"


class Session:
    """One engine process (``python -m module role``), driven a request at a time."""

    def __init__(self, module: str, role: str, env: dict[str, str], log: Path) -> None:
        self.role, self.log = role, log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, role],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=fh,
                env=env,
                text=True,
            )

    def tell(self, op: str, **args: Any) -> None:
        """Send a request without waiting (two processes may then work at once: a weight sync)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        """The answer to the last request; :class:`StageError` if the process died or failed."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=60)
            raise self._error(f"exited {self.proc.returncode} without an answer")
        msg: dict[str, Any] = json.loads(line)
        if "error" in msg:
            raise self._error("failed:\n" + str(msg["error"]))
        return msg

    def ask(self, op: str, **args: Any) -> dict[str, Any]:
        self.tell(op, **args)
        return self.answer()

    def close(self, timeout: float = 120) -> None:
        """Ask the process to end (it shuts its engine down), killing it if it does not."""
        if self.proc.poll() is None:
            try:
                self.tell(CLOSE)
                self.proc.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """End the process at once (it may be blocked on a peer that is gone)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _error(self, what: str) -> StageError:
        tail = self.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        return StageError(f"the {self.role} session {what}\nlog {self.log}:\n" + "\n".join(tail))


def answers(*sessions: Session) -> list[dict[str, Any]]:
    """The answers of sessions that work at once (``tell`` to each first), in their order.

    Why not ``a.answer()`` then ``b.answer()``: in a weight sync the trainer's sender blocks until
    vLLM has loaded each bucket, so when vLLM fails, the trainer never answers and waiting on it
    first would hang the flow (met on verl 0.9.1 on CPU). Whichever answers first is read first;
    the first failure ends the sessions still working and raises its :class:`StageError`."""
    selector = selectors.DefaultSelector()
    for session in sessions:
        assert session.proc.stdout is not None
        selector.register(session.proc.stdout, selectors.EVENT_READ, session)
    got: dict[int, dict[str, Any]] = {}
    try:
        while len(got) < len(sessions):
            for key, _ in selector.select():
                session = key.data
                selector.unregister(key.fileobj)
                try:
                    got[id(session)] = session.answer()
                except StageError:
                    for other in sessions:
                        if other is not session and id(other) not in got:
                            other.kill()
                    raise
    finally:
        selector.close()
    return [got[id(session)] for session in sessions]


def _protocol_out() -> IO[str]:
    """A private copy of stdout for the answers; stdout itself then goes to the log (stderr).

    ``os.dup`` makes the copy non-inheritable, so vLLM's engine-core process never holds it."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(2, 1)
    return out


def serve(handlers: dict[str, Handler], on_close: Callable[[], None] | None = None) -> int:
    """Answer requests from stdin until ``close`` (exit 0) or a failure (its traceback, exit 1)."""
    out = _protocol_out()
    try:
        for line in sys.stdin:
            msg = json.loads(line)
            op = msg.pop("op")
            if op == CLOSE:
                return 0
            try:
                result = handlers[op](msg)
            except Exception:
                traceback.print_exc()
                out.write(json.dumps({"error": traceback.format_exc()}) + "\n")
                out.flush()
                return 1
            out.write(json.dumps(result) + "\n")
            out.flush()
        return 0
    finally:
        if on_close is not None:
            on_close()
