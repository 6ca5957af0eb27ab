"""Find and read a run's logs and dumps without trusting them, and without changing them.

A run folder follows ``verl_consistency.contracts.layout`` (``rollout/<pid>/...``,
``actor/<pid>/...``), but users also point us at dumps they made by hand with the public
recipe, where the actor's ``step{N}`` folders lie directly under the actor dump root and the
pid folders hold only the log. Both are read through :class:`Roots`, which maps every file to a *virtual* path
``rollout/<rel>`` or ``actor/<rel>`` (relative to that side's root). For a standard run folder
the virtual path is the run-relative path, which is also the bundle path, so manifests stay
valid after download.

Everything read here is opened read-only. Anything that resolves outside the roots (a symlink
planted in a dump folder, an absolute ``dump_path`` from someone else's config) is refused and
reported, never followed.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import orjson

from verl_consistency.contracts import layout, records
from verl_consistency.postprocess.pairing.pair_types import Unpaired, UnpairedReason, printable

Side = Literal["rollout", "actor"]
Report = Callable[[Unpaired], None]

STEP_DIR_RE = re.compile(r"^step_?(\d+)$")
"""msprobe writes ``step{N}``; the recipe's text spells it ``step_{N}``. Both are read."""

DUMP_FILES = ("dump.json", "stack.json", "construct.json")
TENSOR_DIR = "dump_tensor_data"


class BadInput(Exception):
    """The inputs cannot be read at all. The message says what to do next."""


class TooDeep(BadInput):
    """A log line or dump.json nested deeper than any writer of ours nests (see :data:`_DEEP_WHY`).

    Not damage a crash leaves (a truncated or torn line is a ``bad_log_line``, an unreadable dump
    ``dump_unreadable``, and the run goes on): no hook and no msprobe writes such a file, so the
    input is not what it claims to be. The run stops with exit 3, naming the file (and line)."""


@dataclass(frozen=True)
class Roots:
    """Where each side's dumps live, resolved once (so a symlinked root is fine, an escape is not)."""

    run_dir: Path
    rollout: Path
    actor: Path

    @classmethod
    def open(
        cls,
        run_dir: str | os.PathLike[str],
        rollout_dir: str | os.PathLike[str] | None = None,
        actor_dir: str | os.PathLike[str] | None = None,
    ) -> Roots:
        run = Path(run_dir)
        if not run.is_dir():
            raise BadInput(f"{run}: not a folder. Pass the run folder (<dump root>/<run id>).")
        run = run.resolve()
        roll = Path(rollout_dir) if rollout_dir is not None else run / layout.ROLLOUT_DIR
        act = Path(actor_dir) if actor_dir is not None else run / layout.ACTOR_DIR
        for side, root, flag in (("rollout", roll, "--rollout-dir"), ("actor", act, "--actor-dir")):
            if not root.is_dir():
                raise BadInput(
                    f"{root}: no {side} dump folder. A run folder holds rollout/ and actor/; for dumps "
                    f"made by hand with the recipe, pass {flag} (msprobe's dump_path of that side)."
                )
        return cls(run, roll.resolve(), act.resolve())

    @property
    def standard(self) -> bool:
        """True when both sides live in the run folder, so virtual paths are run-relative paths."""
        return (
            self.rollout == self.run_dir / layout.ROLLOUT_DIR
            and self.actor == self.run_dir / layout.ACTOR_DIR
        )

    def root(self, side: Side) -> Path:
        return self.rollout if side == "rollout" else self.actor

    def to_virtual(self, side: Side, real: Path) -> str | None:
        """``real`` (already resolved) as ``<side>/<rel>``, or None when it is outside that root."""
        try:
            rel = real.relative_to(self.root(side))
        except ValueError:
            return None
        return side if rel == Path(".") else f"{side}/{rel.as_posix()}"

    def to_real(self, virtual: str) -> Path:
        side, _, rel = virtual.partition("/")
        if side not in ("rollout", "actor"):
            raise ValueError(f"{virtual!r} is not a rollout/ or actor/ path")
        return self.root(side) / rel if rel else self.root(side)  # type: ignore[arg-type]

    def contain(self, side: Side, path: Path) -> Path | None:
        """``path`` resolved, if it stays inside the side's root; None if a link leads outside."""
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        return real if self.to_virtual(side, real) is not None else None

    def resolve_dump_path(self, side: Side, dump_path: str) -> Path | None:
        """A record's ``dump_path`` (relative to the run folder, or absolute) as a path under the
        side's root, or None when it points elsewhere (reported as ``outside_run``)."""
        p = Path(dump_path)
        if not p.is_absolute():
            p = self.run_dir / p
        p = Path(os.path.normpath(p))
        if self.to_virtual(side, p) is not None:
            return p
        # Someone moved the run folder: a stale absolute path is still recognisable by its tail.
        return None


@dataclass(frozen=True)
class LogFile:
    side: Side
    path: Path
    """Resolved path of the log."""
    virtual: str
    """``rollout/<pid>/dispatch_log.jsonl`` etc."""

    @property
    def dir(self) -> Path:
        return self.path.parent


def find_logs(roots: Roots, side: Side, report: Report) -> list[LogFile]:
    """The side's logs: ``<root>/<pid>/<log>`` and, for hand-made single-process dumps, ``<root>/<log>``."""
    name = records.DISPATCH_LOG if side == "rollout" else records.UPDATE_ACTOR_LOG
    root = roots.root(side)
    candidates = [root / name]
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise BadInput(f"{root}: cannot list the {side} dump folder ({exc.strerror})") from exc
    candidates += [Path(e.path) / name for e in entries if _is_dir_noescape(e)]
    found: list[LogFile] = []
    for cand in candidates:
        if not os.path.lexists(cand):
            continue
        virtual = f"{side}/{cand.relative_to(root).as_posix()}"
        if not is_utf8(virtual):
            # Its path could not be written into the manifest (JSON is Unicode), nor mapped back.
            report(
                Unpaired(
                    subject="log_line",
                    ref=printable(virtual),
                    reason=UnpairedReason.LOG_UNREADABLE,
                    detail="the folder name is not valid UTF-8: not read; rename the folder and rerun",
                )
            )
            continue
        real = roots.contain(side, cand)
        if real is None:
            reason = UnpairedReason.OUTSIDE_RUN if cand.exists() else UnpairedReason.LOG_UNREADABLE
            report(
                Unpaired(
                    subject="log_line",
                    ref=virtual,
                    reason=reason,
                    detail="a symlink that leads outside the dump folder, or a dangling one: not read",
                )
            )
            continue
        kind = not_regular(real)
        if kind:
            report(
                Unpaired(
                    subject="log_line",
                    ref=virtual,
                    reason=UnpairedReason.LOG_UNREADABLE,
                    detail=f"not a regular file ({kind})",
                )
            )
            continue
        found.append(LogFile(side, real, virtual))
    return found


def _is_dir_noescape(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


_BLOCK = 8 << 20

MAX_LINE = 4 << 20
"""Longest log line read (4 MiB). A dispatch line holds about 100 bytes per scheduled request, so
even a step of 10,000 requests stays far below it; anything longer is damage (a torn write that
lost its newline, a binary file), reported as one bad line and skipped without being held."""

TOO_LONG: bytes | None = None
"""Stands for an over-long line in what :func:`_blocks` yields."""


def _blocks(fh: IO[bytes]) -> Iterator[list[bytes | None]]:
    """Lines in batches read 8 MiB at a time (much cheaper than iterating the file by line).

    A line longer than :data:`MAX_LINE` comes out as :data:`TOO_LONG`, once: its bytes are
    dropped as they are read, so memory stays bounded by the block and the cap, whatever the
    line's length, and no partial line is ever rebuilt more than once.
    """
    cap, block_size = MAX_LINE, _BLOCK
    tail = b""
    skipping = False  # inside an over-long line: drop bytes up to its newline
    while block := fh.read(block_size):
        start = 0
        out: list[bytes | None] = []
        if skipping or tail:
            nl = block.find(b"\n")
            if nl < 0:
                if not skipping and len(tail) + len(block) <= cap:
                    tail += block
                else:
                    skipping, tail = True, b""
                continue
            if skipping:
                out.append(TOO_LONG)
            else:
                out.append(tail + block[:nl] if len(tail) + nl <= cap else TOO_LONG)
            skipping, tail, start = False, b"", nl + 1
        lines: list[bytes | None] = block[start:].split(b"\n")  # type: ignore[assignment]
        last = lines.pop()
        assert last is not None
        if len(last) > cap:
            skipping = True
        else:
            tail = last
        if len(block) - start > cap and max(map(len, lines), default=0) > cap:  # type: ignore[arg-type]
            lines = [TOO_LONG if len(ln) > cap else ln for ln in lines]  # type: ignore[arg-type]
        yield out + lines if out else lines
    if skipping:
        yield [TOO_LONG]
    elif tail:
        yield [tail]


def iter_jsonl(log: LogFile, report: Report) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every parsable line. A bad line is reported as ``file:line``
    and skipped, so one torn write (a worker killed mid-line) never hides the rest of the log.
    Each line is parsed once (orjson); only a line that holds a bare ``NaN``/``Infinity``, which
    orjson refuses, is given to Python's json as well."""
    try:
        fh = open_regular(log.path)
    except (OSError, NotRegular) as exc:
        report(
            Unpaired(
                subject="log_line",
                ref=log.virtual,
                reason=UnpairedReason.LOG_UNREADABLE,
                detail=f"{_os_why(exc)}: check the file's permissions"
                if isinstance(exc, OSError)
                else f"not a regular file ({exc})",
            )
        )
        return
    loads = orjson.loads
    lineno = 0
    with fh:
        try:
            for lines in _blocks(fh):
                for line in lines:
                    lineno += 1
                    if line is None:
                        bad_line(
                            report,
                            log,
                            lineno,
                            f"longer than {MAX_LINE:,} bytes: not a log record (skipped unread)",
                        )
                        continue
                    try:
                        obj = loads(line)
                    except orjson.JSONDecodeError as exc:
                        if not line.strip():
                            continue
                        obj = _lenient(line) if b"NaN" in line or b"Infinity" in line else None
                        if obj is _DEEP_MARK or (obj is None and _ORJSON_DEPTH in str(exc)):
                            raise TooDeep(
                                f"{log.virtual}:{lineno}: {_DEEP_WHY}; this is not a log our hooks wrote: "
                                "remove the line (or the file) and run postprocess again"
                            ) from None
                        if obj is None:
                            bad_line(report, log, lineno, f"not JSON: {exc}")
                            continue
                    if type(obj) is not dict:
                        bad_line(report, log, lineno, "not a JSON object")
                        continue
                    yield lineno, obj
        except OSError as exc:
            report(
                Unpaired(
                    subject="log_line",
                    ref=log.virtual,
                    reason=UnpairedReason.LOG_UNREADABLE,
                    detail=f"read failed part-way: {_os_why(exc)}; earlier lines were used",
                )
            )


def bad_line(report: Report, log: LogFile, lineno: int, detail: str) -> None:
    """Report line ``lineno`` of ``log`` as a ``bad_log_line`` (``file:line``); its reader skips it."""
    report(
        Unpaired(
            subject="log_line",
            ref=f"{log.virtual}:{lineno}",
            reason=UnpairedReason.BAD_LOG_LINE,
            detail=detail,
        )
    )


def _os_why(exc: OSError) -> str:
    return str(exc.strerror or exc)


_DEEP_MARK = object()
"""What :func:`_lenient` returns for text nested deeper than Python's json can recurse."""

_DEEP_WHY = "nested too deep to read (no log record nor msprobe dump nests more than a few levels)"

_ORJSON_DEPTH = "depth limit exceeded"
"""orjson's message for nesting past its own limit (1,024 levels)."""


def _lenient(line: bytes) -> Any:
    """Python's json reads bare NaN/Infinity, which orjson refuses; anything else stays bad.
    Its scanner recurses once per nesting level, so text nested past the interpreter's
    recursion limit raises ``RecursionError``: that is :data:`_DEEP_MARK`, never a traceback."""
    try:
        return json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    except RecursionError:
        return _DEEP_MARK


class DumpError(Exception):
    pass


class NotRegular(Exception):
    """A path that should be a file is a fifo, socket, device or folder. The message says which."""


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a fifo"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a plain file")


def not_regular(path: Path) -> str:
    """'' for a regular file (links followed); else what it is. Never opens it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a dangling symlink" if os.path.islink(path) else "missing"
    except OSError as exc:
        return _os_why(exc)
    return "" if stat.S_ISREG(mode) else _kind(mode)


def open_regular(path: Path) -> IO[bytes]:
    """Open a file for reading only if it is a regular file. A fifo would block ``open`` forever
    and a device can read forever, so the type is checked before opening (without following
    anything but links), the open never blocks, and the type is checked again on the open file
    in case it was swapped in between. Raises :class:`NotRegular` or ``OSError``."""
    kind = not_regular(path)
    if kind:
        if kind == "missing":
            raise FileNotFoundError(2, "No such file or directory", str(path))
        raise NotRegular(kind)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegular(_kind(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def is_utf8(text: str) -> bool:
    """False for a name that came from the file system as undecodable bytes (surrogate escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_dump_json(path: Path) -> dict[str, Any]:
    """A whole dump.json, checked to be msprobe's shape. NaN/Infinity (bare, as msprobe writes
    them for overflowing tensors) are accepted; truncation and garbage raise :class:`DumpError`,
    and so does anything that is not a regular file (it is never opened)."""
    try:
        with open_regular(path) as fh:
            raw = fh.read()
    except NotRegular as exc:
        raise DumpError(f"not a regular file ({exc})") from exc
    except OSError as exc:
        raise DumpError(f"cannot read: {_os_why(exc)}") from exc
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DumpError(f"not valid JSON (truncated or corrupt?): {exc}") from exc
        except RecursionError:  # Python's json recurses once per level: see _lenient
            raise TooDeep(
                f"{path}: {_DEEP_WHY}; this is not a dump msprobe wrote: remove its step folder "
                "and run postprocess again"
            ) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("data"), dict):
        raise DumpError("not an msprobe dump.json: no 'data' object")
    return obj


def step_dir(base: Path, step: int) -> Path | None:
    """``step{N}`` (msprobe) or ``step_{N}`` (the recipe's spelling) under ``base``."""
    for name in (f"step{step}", f"step_{step}"):
        cand = base / name
        if cand.is_dir():
            return cand
    return None


def rank_dir(step_path: Path, rank: int, pid: int, inner: str = "") -> Path | None:
    """The folder holding dump.json: ``rank{R}``, ``rank_{R}``, ``proc{pid}`` (no
    torch.distributed), 8.3's bare ``rank``; or the only dumped folder when the step folder
    belongs to one process (the per-pid layout), whatever msprobe called it. With ``inner``
    (a lane, ``req{k}``), the rank folder whose ``inner/dump.json`` exists."""
    for name in (f"rank{rank}", f"rank_{rank}", f"proc{pid}", "rank"):
        cand = step_path / name
        if os.path.lexists(cand / inner / "dump.json"):
            return cand
    try:
        dumped = [
            e
            for e in os.scandir(step_path)
            if e.is_dir(follow_symlinks=False)
            and is_utf8(e.name)
            and os.path.lexists(os.path.join(e.path, inner, "dump.json"))
        ]
    except OSError:
        return None
    # A lone rank{X} of another rank is that rank's dump (shared recipe-style root), not ours.
    if len(dumped) == 1 and not _OTHER_RANK_RE.match(dumped[0].name):
        return Path(dumped[0].path)
    return None


_OTHER_RANK_RE = re.compile(r"^rank_?\d+$")
