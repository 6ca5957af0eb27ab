"""The training side's process-wide msprobe session: the debugger, the per-pid folder, the log writer.

Kept apart from :mod:`.micro_batch_dump` (what each dumped micro batch does) because it is set up once per
trainer process and read by every ``forward_backward_batch``: msprobe's ``PrecisionDebugger`` is
one instance per process, and it may already belong to another component (then it is borrowed,
see :mod:`.micro_batch_dump`'s docstring).
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

import orjson

from verl_consistency.contracts import capture, env, layout, records
from verl_consistency.patches.hooks.lanes.msprobe_lanes import LaneWriter


class TrainingDumpError(RuntimeError):
    """The training-side dump is misconfigured; the message says what to set."""


def _config_dump_path(config_path: Path) -> str:
    try:
        data = orjson.loads(config_path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise TrainingDumpError(
            f"{env.ACTOR_CONFIG}={config_path}: cannot read it as msprobe JSON config ({exc})"
        ) from None
    dump_path = data.get("dump_path") if isinstance(data, dict) else None
    if not dump_path:
        raise TrainingDumpError(
            f"{config_path}: has no 'dump_path'; set it, or set {env.RUN_DIR} to the run folder"
        )
    return str(dump_path)


class Session:
    """Process-wide state: the debugger, the per-pid folder and the log writer."""

    def __init__(self, environ: dict[str, str] | os._Environ[str]) -> None:
        raw = environ.get(env.ACTOR_CONFIG, "").strip()
        if not raw:
            raise TrainingDumpError(
                f"{env.DUMP_ON}=1 but {env.ACTOR_CONFIG} is not set: point it at the training-side "
                "msprobe config (the run's config/msprobe_actor.json)"
            )
        self.config_path = Path(raw)
        if not self.config_path.is_file():
            raise TrainingDumpError(f"{env.ACTOR_CONFIG}={raw}: no such file")
        run_dir = environ.get(env.RUN_DIR, "").strip() or None
        self.run_dir = Path(run_dir) if run_dir else None
        if self.run_dir is not None:
            side = layout.RunLayout.from_run_dir(self.run_dir).actor_dir
        else:
            side = Path(_config_dump_path(self.config_path))
        self.dump_dir = layout.process_dump_dir(side)
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        self.rel_dump_path = layout.relative_to_run(self.dump_dir, self.run_dir)
        self.capture = capture.from_env(dict(environ))
        self.writer = records.JsonlWriter(self.dump_dir / records.UPDATE_ACTOR_LOG)

        from msprobe.pytorch import PrecisionDebugger

        existing = PrecisionDebugger._instance
        self.borrowed = bool(existing is not None and getattr(existing, "initialized", False))
        if self.borrowed:
            self.debugger = existing
            self._own_config = self._build_config(existing)
        else:
            self.debugger = PrecisionDebugger(config_path=str(self.config_path), dump_path=str(self.dump_dir))
            self._own_config = None
        self._saved_config: Any = None
        _write_mode(environ)  # a wrong value stops here, before any step
        self._lane_writer: LaneWriter | None = None
        self._unlogged: list[records.UpdateActorRecord] = []

    def lane_writer(self) -> LaneWriter | None:
        """The helper process that writes dumped steps' lane files (``lane_writer``), made once;
        None under ``VERL_CONSISTENCY_LANE_WRITE=inline``."""
        if _write_mode(os.environ) == "inline":  # read at each step: a bench switches it per pass
            return None
        if self._lane_writer is None:
            self._lane_writer = LaneWriter()
            atexit.register(self.close_writer)
        return self._lane_writer

    def log(self, record: records.UpdateActorRecord) -> None:
        """Append a dumped step's record, once its files are on disk: with steps still being written
        by the helper, after them (:meth:`finish_writes`), in order."""
        if self._unlogged or (self._lane_writer is not None and self._lane_writer.busy):
            self._unlogged.append(record)
        else:
            self.writer.write(record)

    def finish_writes(self) -> None:
        """Wait for the helper's steps, then append the records that waited for them, in order.
        A step the helper could not write raises ``LaneWriteError`` naming it; the records waiting
        then are not appended (their steps' files may be incomplete)."""
        unlogged, self._unlogged = self._unlogged, []
        if self._lane_writer is not None:
            self._lane_writer.drain()
        for record in unlogged:
            self.writer.write(record)

    def close_writer(self) -> None:
        """At exit: the helper's steps written and their records appended, then the helper ended."""
        writer = self._lane_writer
        if writer is None:
            return
        try:
            self.finish_writes()
        finally:
            self._lane_writer = None
            writer.close()

    def _build_config(self, debugger: Any) -> Any:
        """Our DebuggerConfig, built the way msprobe builds its own, for a borrowed instance."""
        from msprobe.pytorch.dump.debugger.debugger_config import DebuggerConfig

        common, task = debugger._parse_config_path(str(self.config_path), None)
        return DebuggerConfig(common, task, None, str(self.dump_dir), None)

    @property
    def service(self) -> Any:
        return self.debugger.service

    def enter(self) -> None:
        if self.borrowed:
            self._saved_config = self.service.config
            self.service.apply_runtime_config(self._own_config)

    def leave(self) -> None:
        if self.borrowed and self._saved_config is not None:
            self.service.apply_runtime_config(self._saved_config)
            self._saved_config = None


def _write_mode(environ: dict[str, str] | os._Environ[str]) -> str:
    raw = environ.get(env.LANE_WRITE, "").strip() or "helper"
    if raw not in ("helper", "inline"):
        raise TrainingDumpError(f"{env.LANE_WRITE}={raw!r}: expected 'helper' (the default) or 'inline'")
    return raw


_SESSION: Session | None = None
_SESSION_PID: int | None = None


def existing() -> Session | None:
    """This process's session if one was made (nothing is set up here)."""
    return _SESSION if _SESSION is not None and os.getpid() == _SESSION_PID else None


def session() -> Session:
    global _SESSION, _SESSION_PID
    if _SESSION is None or os.getpid() != _SESSION_PID:
        _SESSION = Session(os.environ)
        _SESSION_PID = os.getpid()
    return _SESSION


def reset_for_tests() -> None:
    """Forget the process-wide session (tests run several configurations in one process)."""
    global _SESSION, _SESSION_PID
    if _SESSION is not None:
        _SESSION.close_writer()
        _SESSION.writer.close()
    _SESSION = None
    _SESSION_PID = None
