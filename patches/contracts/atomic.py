"""Atomic file writes: a temp file in the target's folder, renamed onto the target when complete.

A reader (msprobe, a rerun, a user) sees the old file or the whole new one, never half of one,
and a failed or interrupted write leaves no temp file behind (a killed process may leave a
hidden ``.NAME.*.tmp``, never a partial ``NAME``).

``mode`` is applied before the rename; the default 0644 matters for msprobe, whose file checks
refuse a config that others may write to. ``mode=None`` keeps ``mkstemp``'s 0600.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path, mode: int | None = 0o644) -> Iterator[Path]:
    """Yield a temp path next to ``path``; write it in the ``with`` body; it replaces ``path`` on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: Path, data: bytes, mode: int | None = 0o644) -> None:
    with atomic_path(path, mode) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: Path, text: str, mode: int | None = 0o644) -> None:
    with atomic_path(path, mode) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: Path, data: object, mode: int | None = 0o644) -> None:
    """``data`` as JSON, indented by 2, with a final newline."""
    write_text_atomic(path, json.dumps(data, indent=2) + "\n", mode)
