"""A dumped step's lane files, rendered and written by a helper process while training goes on (issue 43).

Why: once the lanes' statistics are on the host, each lane's ``dump.json`` is a few hundred KB of
text that msprobe's format asks for float by float (``lane_json.StepTemplate``). On an H100 that
write was 16 % of what a dumped FSDP log_prob pass at micro batch 8 adds and 33 % at 16
(``bench/results/gpu-2026-12-07c/cost/fsdp-cost.txt``): host time on the training thread, which is
what a dumped pass is short of. A thread would not help: the render is Python, and the forward's
host work holds the same interpreter lock. A process has its own.

What: :class:`LaneWriter` starts one helper process (``python -c``, running this module's
:func:`serve`) the first time a step is handed to it, and sends each step's :class:`LaneFiles`
(the template once, then per step the lanes' shapes and values and the stack and construct
records: ~10 bytes a value) down a pipe from a sender thread, so the training thread never waits
on the pipe. The helper writes each step with :func:`write_files`, the very function the training
process runs when it writes in line, and answers each step with ``None`` or the error it met, in
order.

What a caller must do (the training side's ``micro_batch_dump.BatchDumper``): :meth:`LaneWriter.drain`
before anything reads the files or says they exist. A step's files are complete once drain returns;
a helper's error, or its end, is raised there (or at the next submit) as :class:`LaneWriteError`,
naming the step's folder: nothing is dropped in silence. At most :data:`MAX_PENDING` steps are in
flight (the training thread waits for the oldest beyond that). ``VERL_CONSISTENCY_LANE_WRITE=inline``
writes in the training process, as before.

The helper imports this module and ``lane_json`` only (json, pickle, fcntl): no torch, no msprobe.
It reads frames from its stdin until it closes, so it ends with the process that started it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from typing import IO, Any

from verl_consistency.contracts.env import LANE_WRITER_PATH as _PATH_ENV
from verl_consistency.patches.hooks.lanes.lane_json import StepTemplate, save_text, stack_text

MAX_PENDING = 8
"""Hand-overs not yet written, at most (two a step: its initial files, then its end); the training
thread waits beyond this."""

_HEADER = struct.Struct("<Q")


class LaneWriteError(RuntimeError):
    """A dumped step's lane files were not written (the helper's error, or the helper ended)."""


@dataclass
class LaneFiles:
    """One dumped step's lane files, as ``LaneStats.write_json`` has them once the values are on the
    host (or, with ``texts`` only, the step's initial files).

    ``template`` renders lane ``k``'s ``dump.json`` from ``shapes``, ``values`` and ``shared``
    (``StepTemplate.render_lanes``) into ``dump_paths[k]``; ``stack`` (msprobe's ``cache_stack``)
    and ``construct`` (its ``cache_construct``) are the same for every lane. ``where`` names the
    step in an error. Handed over whole when submitted (pickled then), so the dicts may be msprobe's
    own."""

    template: StepTemplate | None
    shapes: list[Any]
    values: list[Any]
    shared: list[bool]
    dump_paths: list[str]
    stack_paths: list[str]
    construct_paths: list[str]
    stack: dict[Any, Any] | None
    construct: dict[Any, Any] | None
    where: str
    texts: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    """Files written first, as they are: a step's initial files (``LaneStats.initialize_json_file``)."""

    @classmethod
    def plain(cls, texts: list[tuple[str, str]], where: str) -> LaneFiles:
        """Only these files, as they are."""
        return cls(None, [], [], [], [], [], [], None, None, where, texts)


def write_files(files: LaneFiles) -> None:
    """Write the step's lane files as msprobe's ``DataWriter.write_json`` would for each lane."""
    for path, text in files.texts:
        save_text(path, text)
    stack = stack_text(files.stack) if files.stack else None
    construct = json.dumps(files.construct, indent=1) if files.construct else None
    texts = None
    if files.template is not None:
        lanes = range(len(files.dump_paths))
        texts = files.template.render_lanes(files.shapes, files.values, lanes, files.shared)
    for k, path in enumerate(files.dump_paths):
        if texts is not None:
            save_text(path, next(texts))
        if stack is not None:
            save_text(files.stack_paths[k], stack)
        if construct is not None:
            save_text(files.construct_paths[k], construct)


class LaneWriter:
    """The training process's side of the helper: hands steps over, and drains them."""

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self.max_pending = max(1, max_pending)
        self._proc: subprocess.Popen[bytes] | None = None
        self._outbox: queue.Queue[bytes | None] = queue.Queue()
        self._sender: threading.Thread | None = None
        self._broken: str | None = None  # what the sender met (the pipe closed)
        self._pending: deque[tuple[int, str]] = deque()
        self._failed: list[str] = []
        self._seq = 0
        self._template: StepTemplate | None = None  # the last one sent (the helper keeps it)
        self._template_id = 0
        self._pid = os.getpid()

    @property
    def pid(self) -> int | None:
        """The helper's process id while one runs (a bench reads its CPU time)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def busy(self) -> bool:
        """Whether a step handed over is not yet answered."""
        return bool(self._pending)

    def submit(self, files: LaneFiles) -> None:
        """Hand the step over; returns once it is queued for the helper (beyond :attr:`max_pending`
        steps in flight, once the oldest is written). Raises what an earlier step met."""
        self._raise_failed()
        while len(self._pending) >= self.max_pending:
            self._receive()
        self._raise_failed()
        self._start()
        template = files.template
        sent = None
        if template is not None and template is not self._template:
            self._template_id += 1
            self._template = sent = template
        self._seq += 1
        named = self._template_id if template is not None else 0  # 0: a step with no records
        frame = pickle.dumps(
            (self._seq, named, sent, dataclasses.replace(files, template=None)),
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        self._pending.append((self._seq, files.where))
        self._outbox.put(frame)

    def drain(self) -> None:
        """Wait until every step handed over is written; raise the errors they met."""
        while self._pending:
            self._receive()
        self._raise_failed()

    def close(self) -> None:
        """End the helper once it has written what it holds (its stdin closed); errors are not raised.
        The owner calls it (the training side at exit, after :meth:`drain`); a helper whose owner
        ends without it sees its stdin close and ends too, with what was still queued lost."""
        proc, self._proc = self._proc, None
        if proc is None or os.getpid() != self._pid:
            return
        self._outbox.put(None)
        if self._sender is not None:
            self._sender.join(timeout=60)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # -- the helper ---------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._proc is not None:
            return
        self._template = None  # a new helper (the first, or after one ended) holds no template yet
        env = dict(os.environ)
        env[_PATH_ENV] = json.dumps([p for p in sys.path if isinstance(p, str)])
        code = (
            f"import json, os, sys; sys.path[:0] = json.loads(os.environ.pop({_PATH_ENV!r})); "
            "from verl_consistency.patches.hooks.lanes.lane_writer import serve; serve()"
        )
        pipe = subprocess.PIPE
        try:
            self._proc = subprocess.Popen([sys.executable, "-c", code], stdin=pipe, stdout=pipe, env=env)
        except OSError as exc:
            raise LaneWriteError(
                f"could not start the lane writer process ({sys.executable!r}: {exc}); set "
                "VERL_CONSISTENCY_LANE_WRITE=inline to write the lanes' files in the training process"
            ) from exc
        self._outbox = queue.Queue()
        self._sender = threading.Thread(
            target=self._send_all, args=(self._proc.stdin, self._outbox), name="lane-writer-send", daemon=True
        )
        self._sender.start()

    def _send_all(self, pipe: IO[bytes] | None, outbox: queue.Queue[bytes | None]) -> None:
        """The sender thread: frames to the helper's stdin in order (a full pipe blocks here, not in
        training); the stdin closed after the last."""
        assert pipe is not None
        try:
            while (frame := outbox.get()) is not None:
                pipe.write(_HEADER.pack(len(frame)))
                pipe.write(frame)
                pipe.flush()
        except OSError as exc:  # the helper ended: _receive says so
            self._broken = f"{type(exc).__name__}: {exc}"
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    def _receive(self) -> None:
        """Read the helper's answer for the oldest step in flight."""
        proc = self._proc
        seq, where = self._pending[0]
        if proc is None or proc.stdout is None:
            lost = [w for _, w in self._pending]
            self._pending.clear()
            raise LaneWriteError(f"the lane writer was closed with step(s) unwritten: {', '.join(lost)}")
        frame = _read_frame(proc.stdout)
        if frame is None:
            code = proc.wait()
            lost = [w for _, w in self._pending]
            self._pending.clear()
            self._proc = None
            raise LaneWriteError(
                f"the lane writer process (pid {proc.pid}) ended with exit code {code} before writing "
                f"{len(lost)} dumped step(s): {', '.join(lost)}"
                + (f" ({self._broken})" if self._broken else "")
                + "; its error, if any, is above in this process's stderr. Those steps' lane files are "
                "incomplete: rerun the collection, or set VERL_CONSISTENCY_LANE_WRITE=inline to write "
                "them in the training process"
            )
        answered, error = pickle.loads(frame)
        if answered != seq:
            raise LaneWriteError(f"the lane writer answered step {answered} where {seq} ({where}) was due")
        self._pending.popleft()
        if error is not None:
            self._failed.append(f"{where}: {error}")

    def _raise_failed(self) -> None:
        if self._failed:
            failed, self._failed = self._failed, []
            raise LaneWriteError(
                "the lane files of " + "; ".join(failed) + " were not written (the other steps were); "
                "fix the cause and rerun the collection"
            )


def _read_frame(pipe: IO[bytes]) -> bytes | None:
    """One length-prefixed frame, or None at the end of the stream."""
    head = pipe.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    body = pipe.read(size)
    return body if len(body) == size else None


def serve(reader: IO[bytes] | None = None, writer: IO[bytes] | None = None) -> None:
    """The helper: write each step handed over, answer ``(seq, None)`` or ``(seq, error)``, until
    stdin closes. A step names its template by number (0: none, a step with no records); the
    helper keeps the latest one."""
    reader = reader or sys.stdin.buffer
    writer = writer or sys.stdout.buffer
    templates: dict[int, StepTemplate] = {}
    while (frame := _read_frame(reader)) is not None:
        seq, template_id, template, files = pickle.loads(frame)
        if template is not None:
            templates = {template_id: template}
        try:
            if template_id:
                files.template = templates[template_id]
            write_files(files)
            error = None
        except Exception as exc:  # answered, and raised in the training process
            error = f"{type(exc).__name__}: {exc}"
        answer = pickle.dumps((seq, error), protocol=pickle.HIGHEST_PROTOCOL)
        writer.write(_HEADER.pack(len(answer)) + answer)
        writer.flush()
