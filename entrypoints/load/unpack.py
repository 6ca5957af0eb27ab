"""Unpack a tar, tar.gz or tar.zst archive into a new folder, never writing outside it.

What the archive is comes from its bytes, not its name: a URL that ends in ``.tar.zst`` may well
answer with an HTML login page. A gzip or zstd file that holds no tar is a single compressed file
(a ``.jsonl.gz`` dataset) and is loaded as it is.

Extraction trusts nothing in the archive. Each member's name is checked by the contract the bundle
reader follows too, :func:`~verl_consistency.contracts.safe_tar.safe_member_name` (only files and folders; no
absolute name, no ``..``; links, devices and fifos refused), and each file is created with
``O_EXCL | O_NOFOLLOW`` inside the target, so a member named twice or a folder replaced by a
link cannot redirect a write.
"""

from __future__ import annotations

import gzip
import os
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import IO, cast

import zstandard

from verl_consistency.contracts.safe_tar import UnsafeMember, make_dirs_below, safe_member_name
from verl_consistency.entrypoints.load.fetch import CHUNK, LoadError

_ZSTD = b"\x28\xb5\x2f\xfd"
_GZIP = b"\x1f\x8b"
_TAR_MAGIC_AT = 257
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst")


class Compression(StrEnum):
    NONE = "none"
    GZIP = "gzip"
    ZSTD = "zstd"


def _compression(head: bytes) -> Compression:
    if head.startswith(_ZSTD):
        return Compression.ZSTD
    if head.startswith(_GZIP):
        return Compression.GZIP
    return Compression.NONE


@contextmanager
def _plain(path: Path, compression: Compression) -> Iterator[IO[bytes]]:
    """The file's bytes as a stream, decompressed."""
    with path.open("rb") as raw:
        if compression is Compression.ZSTD:
            with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as zr:
                yield cast(IO[bytes], zr)
        elif compression is Compression.GZIP:
            with gzip.GzipFile(fileobj=raw) as gz:
                yield cast(IO[bytes], gz)
        else:
            yield raw


def _is_tar(head: bytes) -> bool:
    return head[_TAR_MAGIC_AT : _TAR_MAGIC_AT + 5] == b"ustar"


def archive_compression(path: Path, name: str) -> Compression | None:
    """How the tar archive at ``path`` is compressed, or None when it is not a tar archive.

    ``name`` (the source's) only sharpens the error: a name that promises an archive whose bytes
    hold none is refused rather than loaded as a single file.
    """
    with path.open("rb") as fh:
        head = fh.read(4)
    compression = _compression(head)
    try:
        with _plain(path, compression) as stream:
            block = stream.read(512)
    except (OSError, EOFError, zstandard.ZstdError) as exc:
        raise LoadError(f"{name}: a {compression} file that cannot be read ({exc})") from None
    if _is_tar(block):
        return compression
    if name.lower().endswith(ARCHIVE_SUFFIXES):
        raise LoadError(
            f"{name}: the name says tar archive but the bytes are not one (they start with "
            f"{block[:40]!r}); is the URL a web page (a login or an error page) instead of the file?"
        )
    return None


def unpack(path: Path, compression: Compression, into: Path, name: str) -> tuple[int, int]:
    """Extract the archive into the new folder ``into``; return (files, bytes)."""
    into.mkdir()
    root = into.resolve()
    files = size = 0
    try:
        with _plain(path, compression) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                member_name = safe_member_name(member)
                target = root.joinpath(*PurePosixPath(member_name).parts)
                if member.isdir():
                    make_dirs_below(root, target)
                    continue
                make_dirs_below(root, target.parent)
                src = tar.extractfile(member)
                assert src is not None
                size += _write_new(target, src, member_name, name)
                files += 1
    except UnsafeMember as exc:
        raise LoadError(f"{name}: refused, {exc}") from None
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise LoadError(f"{name}: not a readable tar archive ({exc})") from None
    return files, size


def _write_new(target: Path, src: IO[bytes], member_name: str, name: str) -> int:
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        raise LoadError(f"{name}: member {member_name!r} appears twice") from None
    n = 0
    with os.fdopen(fd, "wb") as out:
        while chunk := src.read(CHUNK):
            out.write(chunk)
            n += len(chunk)
    return n


def single_top_folder(folder: Path) -> Path:
    """The one folder the archive put everything under (``Qwen2.5-0.5B-Instruct/...``), else ``folder``."""
    entries = list(folder.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return folder
