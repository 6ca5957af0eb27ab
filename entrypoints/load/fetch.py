"""Where a load comes from: an HTTP(S) URL, downloaded, or a path (a mounted PVC, a local folder).

A source is read once and never changed. A URL is streamed into a file inside the load's scratch
folder (on the target volume, so a model larger than the pod's memory or disk fits), hashed as it
arrives; a ``#sha256=<hex>`` suffix, as pip writes it, makes the load refuse any other bytes.

Two kinds of failure, because the loader Job treats them differently: :class:`LoadError` is bad
input (a URL that answers 404, a path that does not exist, a checksum that differs), which a
retry cannot fix; :class:`FetchError` is the network failing, which a retry may.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

CHUNK = 1 << 20
TIMEOUT_S = 60
"""Seconds without a byte before a download counts as failed (a retry then starts over)."""
_SHA256 = re.compile(r"#sha256=([0-9a-fA-F]{64})$")
_SCHEMES = ("http", "https")


class LoadError(ValueError):
    """Bad input: the message names the source or target and what to do next (exit code 2)."""


class FetchError(RuntimeError):
    """The network or the server failed; the same load may work when retried (exit code 1)."""


@dataclass(frozen=True)
class Source:
    """A load's source as given: ``text`` without its checksum suffix, and the checksum."""

    text: str
    sha256: str | None

    @property
    def is_url(self) -> bool:
        return "://" in self.text

    @property
    def name(self) -> str:
        """The last part of the URL's path or of the path (``model.tar.zst``)."""
        path = urlsplit(self.text).path if self.is_url else self.text
        return path.rstrip("/").rsplit("/", 1)[-1]


def parse_source(text: str) -> Source:
    """Split off a ``#sha256=`` suffix; refuse an empty source and a scheme other than http(s)."""
    text = text.strip()
    if not text:
        raise LoadError(
            "SOURCE is empty: give an http(s):// URL or a path (e.g. /source/Qwen2.5-0.5B-Instruct)"
        )
    m = _SHA256.search(text)
    sha = m.group(1).lower() if m else None
    bare = text[: m.start()] if m else text
    if "://" in bare:
        scheme = bare.split("://", 1)[0].lower()
        if scheme not in _SCHEMES:
            raise LoadError(
                f"SOURCE {bare}: scheme {scheme!r} is not supported; give an http:// or https:// URL, "
                "or mount the data as a volume and give its path"
            )
        if not urlsplit(bare).hostname:
            raise LoadError(f"SOURCE {bare}: the URL has no host")
    return Source(text=bare, sha256=sha)


Progress = Callable[[str], None]


def download(source: Source, target: Path, say: Progress) -> str:
    """Stream the URL into ``target`` (a new file); return the bytes' sha256.

    Proxies come from the usual ``HTTPS_PROXY`` / ``NO_PROXY`` variables (urllib reads them).
    """
    request = urllib.request.Request(source.text, headers={"User-Agent": "verl-consistency-load"})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        message = f"SOURCE {source.text}: the server answered HTTP {exc.code} {exc.reason}"
        if exc.code >= 500 or exc.code in (408, 429):
            raise FetchError(message + "; retrying may help") from None
        raise LoadError(message + "; check the URL (and that it needs no login)") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FetchError(
            f"SOURCE {source.text}: cannot connect ({reason}); check the host name, and whether the "
            "pod needs a proxy (HTTPS_PROXY) to reach it"
        ) from None
    length = response.headers.get("Content-Length")
    total = int(length) if length and length.isdigit() else None
    sha = hashlib.sha256()
    got = 0
    last = time.monotonic()
    try:
        with response, target.open("xb") as out:
            while chunk := response.read(CHUNK):
                out.write(chunk)
                sha.update(chunk)
                got += len(chunk)
                if time.monotonic() - last > 30:
                    last = time.monotonic()
                    say(f"downloaded {_mib(got)}" + (f" of {_mib(total)}" if total else ""))
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise FetchError(f"SOURCE {source.text}: the download broke off after {_mib(got)} ({exc})") from None
    if total is not None and got != total:
        raise FetchError(f"SOURCE {source.text}: got {got} bytes, the server announced {total}")
    say(f"downloaded {_mib(got)} from {source.text}")
    return sha.hexdigest()


def local_path(source: Source) -> Path:
    """The source path, which must exist (a file or a folder) and be readable."""
    path = Path(source.text)
    if not path.is_absolute():
        raise LoadError(f"SOURCE {source.text}: give an absolute path (as the loader pod sees it)")
    if not path.exists():
        parent = next((p for p in path.parents if p.exists()), Path("/"))
        raise LoadError(
            f"SOURCE {source.text}: no such file or folder ({parent} exists; is the source volume "
            "mounted there, and the path right?)"
        )
    if not (path.is_file() or path.is_dir()):
        raise LoadError(f"SOURCE {source.text}: neither a file nor a folder")
    return path


def copy_file(src: Path, target: Path) -> str:
    """Copy one file's bytes into ``target`` (a new file); return their sha256."""
    sha = hashlib.sha256()
    with src.open("rb") as inp, target.open("xb") as out:
        while chunk := inp.read(CHUNK):
            out.write(chunk)
            sha.update(chunk)
    return sha.hexdigest()


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as inp:
        while chunk := inp.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def copy_folder(src: Path, target: Path) -> None:
    """Copy a folder's files (the contents of links, as ``cp -rL`` does); refuse special files."""
    try:
        shutil.copytree(src, target, symlinks=False, copy_function=shutil.copyfile)
    except shutil.Error as exc:
        first = exc.args[0][0] if exc.args and exc.args[0] else exc
        raise LoadError(f"SOURCE {src}: cannot copy every file ({first})") from None


def _mib(n: int | None) -> str:
    return f"{(n or 0) / (1 << 20):.1f} MiB"
