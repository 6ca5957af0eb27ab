"""One load: fetch the source, unpack it if it is an archive, and move the result onto DEST at once.

Why so careful: the models volume is read by every Ray pod of every run, and a loader Job is
retried by Kubernetes after a failure. So:

* **Atomic.** Everything is built in a scratch folder beside DEST (``.<name>.partial-<hex>``, on
  the same volume) and renamed onto DEST in one step: a reader sees no DEST or the whole one,
  never half a model. A killed load leaves only the scratch folder, which the next load removes.
* **Idempotent.** A record beside DEST (``.<name>.load.json``) says where DEST came from. A rerun
  with the same source (and checksum) finds it and does nothing; a DEST that exists from another
  source, or that this loader did not write, is refused, never overwritten.
* **Confined.** With ``root`` (the Job passes ``/models``) DEST must lie inside it; nothing is
  written but DEST, its record and the scratch folder beside it.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from verl_consistency.contracts.atomic import write_text_atomic
from verl_consistency.entrypoints.load import fetch, unpack
from verl_consistency.entrypoints.load.fetch import LoadError, Progress, Source


class LoadRecord(BaseModel):
    """What the record beside DEST holds: enough to recognise the same load on a rerun."""

    source: str
    sha256: str | None = None
    """Of the downloaded or copied file (the archive, for an archive); None for a folder."""
    kind: str
    files: int
    bytes: int


@dataclass(frozen=True)
class Outcome:
    dest: Path
    record: LoadRecord
    already: bool


def record_path(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.load.json"


def check_dest(dest: Path, root: Path | None) -> Path:
    """DEST as an absolute path, inside ``root`` when one is given."""
    if str(dest) in ("", "."):
        raise LoadError("DEST is empty: give the path to create, e.g. /models/Qwen2.5-0.5B-Instruct")
    if not dest.is_absolute():
        raise LoadError(f"DEST {dest}: give an absolute path (e.g. /models/Qwen2.5-0.5B-Instruct)")
    if root is None:
        return dest
    real_root = root.resolve()
    parent = dest.parent.resolve()  # a link among DEST's folders must not lead out of the volume
    resolved = parent / dest.name
    if resolved == real_root or not resolved.is_relative_to(real_root) or dest.name in ("", ".", ".."):
        raise LoadError(f"DEST {dest}: must be a path inside {root} (e.g. {root}/Qwen2.5-0.5B-Instruct)")
    return resolved


def existing(dest: Path, source: Source) -> LoadRecord | None:
    """The record of DEST when it is the same load already done; None when DEST does not exist."""
    if not os.path.lexists(dest):
        return None
    path = record_path(dest)
    try:
        record = LoadRecord.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        raise LoadError(
            f"DEST {dest} exists and was not put there by this loader (no readable {path.name} beside "
            "it); pick another DEST, or delete it first"
        ) from None
    if record.source != source.text or (source.sha256 and record.sha256 != source.sha256):
        raise LoadError(
            f"DEST {dest} exists, loaded from {record.source} (sha256 {record.sha256}), not from "
            f"{source.text}; pick another DEST (a new name per version), or delete it first"
        )
    return record


def load(source_text: str, dest: Path, root: Path | None, say: Progress) -> Outcome:
    """Load ``source_text`` onto ``dest``; raise :class:`LoadError` or :class:`FetchError`."""
    source = fetch.parse_source(source_text)
    dest = check_dest(dest, root)
    done = existing(dest, source)
    if done is not None:
        return Outcome(dest=dest, record=done, already=True)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        for stale in dest.parent.glob(f".{dest.name}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
        scratch = dest.parent / f".{dest.name}.partial-{secrets.token_hex(4)}"
        scratch.mkdir()
    except PermissionError as exc:
        raise LoadError(_not_writable(Path(exc.filename or dest.parent))) from None
    try:
        result, record = _build(source, scratch, say)
        write_text_atomic(record_path(dest), record.model_dump_json(indent=2) + "\n")
        os.rename(result, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Outcome(dest=dest, record=record, already=False)


def _build(source: Source, scratch: Path, say: Progress) -> tuple[Path, LoadRecord]:
    """The finished file or folder inside ``scratch``, and its record."""
    if source.is_url:
        file = scratch / "download"
        sha = fetch.download(source, file, say)
    else:
        path = fetch.local_path(source)
        if path.is_dir():
            if source.sha256:
                raise LoadError(f"SOURCE {source.text}: a folder has no sha256; drop the #sha256= suffix")
            out = scratch / "folder"
            fetch.copy_folder(path, out)
            files, size = _count(out)
            say(f"copied {files} files from {path}")
            return out, LoadRecord(source=source.text, kind="folder", files=files, bytes=size)
        file, sha = path, fetch.file_sha256(path)
    if source.sha256 and sha != source.sha256:
        raise LoadError(
            f"SOURCE {source.text}: sha256 {sha} is not the {source.sha256} its #sha256= suffix asks for"
        )
    compression = unpack.archive_compression(file, source.name)
    if compression is None:
        if not source.is_url:
            copied = scratch / "file"
            fetch.copy_file(file, copied)
            file = copied
        size = file.stat().st_size
        return file, LoadRecord(source=source.text, sha256=sha, kind="file", files=1, bytes=size)
    files, size = unpack.unpack(file, compression, scratch / "archive", source.name)
    top = unpack.single_top_folder(scratch / "archive")
    say(f"unpacked {files} files" + (f" (from its folder {top.name}/)" if top.name != "archive" else ""))
    return top, LoadRecord(
        source=source.text, sha256=sha, kind=f"tar ({compression})", files=files, bytes=size
    )


def _count(folder: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(dirpath, name)).st_size
    return files, size


def _not_writable(path: Path) -> str:
    try:
        st = path.stat()
        owner = f"owned by uid {st.st_uid} gid {st.st_gid}, mode {st.st_mode & 0o7777:o}"
    except OSError:
        owner = "not readable"
    return (
        f"cannot write in {path} ({owner}; this loader runs as uid {os.getuid()} gid {os.getgid()}). "
        "The loader Job's prepare-models step makes the volume's top folder writable for gid 1000; a "
        "folder made below it by another pod is not: pick a DEST outside it, or fix its owner"
    )
