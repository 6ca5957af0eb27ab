"""The comparison bundle: one ``tar.zst`` per run, written atomically, verified by checksum.

Writing streams every file once: it is hashed as tarfile reads it into a zstd stream, so the
bundle costs one read of the paired files (never the whole dump tree). ``manifest.json`` goes
last, since it carries the checksums. The archive is built under a temporary name in the output
folder, fsynced, and renamed onto ``bundle-<run>.tar.zst``: a killed writer leaves at most a
``.bundle-<run>.tar.zst.<pid>.tmp`` that the next run removes, never a partial bundle under the
final name, and a rerun replaces the old bundle in one step.

Reading (``verify``, ``extract``) trusts nothing in the archive: a member must be a regular file
or a folder with a relative, ``..``-free name; links, devices and fifos are refused (the rule of
``contracts/safe_tar.py``, which the model loader follows too). Extraction
never calls ``tarfile.extract``: it writes each file itself with ``O_EXCL | O_NOFOLLOW`` into a
scratch folder inside the target, and moves the result into place only once every checksum
matched.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import shutil
import stat
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Literal

import zstandard
from pydantic import ValidationError

from verl_consistency.contracts import layout
from verl_consistency.contracts.safe_tar import UnsafeMember, make_dirs_below, safe_member_name
from verl_consistency.contracts.weight_records import WEIGHTS_DIR
from verl_consistency.postprocess.output.bundle_manifest import (
    MANIFEST_NAME,
    MANIFEST_VERSION,
    RESULTS_DIR,
    SCHEMA_NAME,
    BundleManifest,
    FileEntry,
    schema_bytes,
)
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.pair import PairingResult

DEFAULT_LEVEL = 3
"""zstd's own default, and what ``tar --zstd`` uses."""

_CHUNK = 1 << 20
_MAX_MANIFEST = 512 << 20

Kind = Literal["dump", "log", "run_manifest", "result", "schema"]
Progress = Callable[[int, int], None]
"""(bytes done, bytes total)."""


class BundleError(Exception):
    """The bundle cannot be read, or is unsafe to extract. The message names the member."""


@dataclass(frozen=True)
class Item:
    arcname: str
    path: Path
    kind: Kind


def collect(
    result: PairingResult,
    *,
    run_json: Path | None = None,
    results_dir: Path | None = None,
    check_json: Path | None = None,
    dump_dirs: Iterable[str] = (),
    weight_logs: Iterable[Path] = (),
) -> list[Item]:
    """What goes into the bundle: the logs, the paired dumps (with their tensor folders), the run
    manifest and the compare results. Never anything else from the dump tree.

    A check run adds its ``check.json`` and ``dump_dirs``: the batch variance's rollout dumps
    (virtual paths), of which the batched ones belong to no pair. ``weight_logs``: the weight
    check's records (``<run>/weights/*.jsonl``), kept under ``weights/``."""
    items: dict[str, Item] = {}
    roots = result.roots

    def add(arcname: str, path: Path, kind: Kind) -> None:
        items.setdefault(arcname, Item(arcname, path, kind))

    for log in result.logs:
        add(log.virtual, log.path, "log")
    for path in weight_logs:
        add(f"{WEIGHTS_DIR}/{path.name}", path, "log")
    dirs = dict.fromkeys(d for p in result.pairs for d in (p.rollout.dir, p.actor.dir))
    dirs.update(dict.fromkeys(dump_dirs))
    for d in dirs:
        side = d.partition("/")[0]
        real_dir = roots.to_real(d)
        for name in discover.DUMP_FILES:
            real = roots.contain(side, real_dir / name)  # type: ignore[arg-type]
            if real is not None and real.is_file():
                add(f"{d}/{name}", real, "dump")
        tensors = real_dir / discover.TENSOR_DIR
        if tensors.is_dir() and not tensors.is_symlink():
            for path in _walk_files(tensors):
                rel = path.relative_to(tensors).as_posix()
                if not discover.is_utf8(rel):
                    continue  # a manifest (JSON) cannot name it; msprobe never writes such names
                real = roots.contain(side, path)  # type: ignore[arg-type]
                if real is not None:
                    add(f"{d}/{discover.TENSOR_DIR}/{rel}", real, "dump")
    if run_json is not None and run_json.is_file():
        add(layout.RUN_MANIFEST, run_json, "run_manifest")
    if check_json is not None and check_json.is_file():
        add(check_json.name, check_json, "run_manifest")
    if results_dir is not None and results_dir.is_dir():
        for path in _walk_files(results_dir):
            add(f"{RESULTS_DIR}/{path.relative_to(results_dir).as_posix()}", path, "result")
    return list(items.values())


def _walk_files(top: Path) -> Iterable[Path]:
    """Regular files under ``top``, sorted; symlinks are neither followed nor listed."""
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if stat.S_ISREG(p.lstat().st_mode):
                yield p


class _HashingReader:
    """Hashes what tarfile reads, so each input is read exactly once."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self.sha = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data


def tmp_name(dest: Path, pid: int | None = None) -> Path:
    return dest.with_name(f".{dest.name}.{os.getpid() if pid is None else pid}.tmp")


def remove_stale_tmp(dest: Path) -> list[Path]:
    """Temporary bundles of writers that are no longer running (killed, or a crashed pod)."""
    removed = []
    prefix = f".{dest.name}."
    if not dest.parent.is_dir():
        return removed
    for entry in os.scandir(dest.parent):
        if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
            continue
        pid_text = entry.name[len(prefix) : -len(".tmp")]
        if not pid_text.isdigit() or (int(pid_text) != os.getpid() and _alive(int(pid_text))):
            continue
        Path(entry.path).unlink(missing_ok=True)
        removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_bundle(
    dest: Path,
    items: list[Item],
    make_manifest: Callable[[list[FileEntry]], BundleManifest],
    *,
    level: int = DEFAULT_LEVEL,
    threads: int = 1,
    progress: Progress | None = None,
) -> BundleManifest:
    """Stream ``items`` into ``dest`` (atomically). Returns the manifest that was written."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(dest)
    tmp = tmp_name(dest)
    total = sum(i.path.stat().st_size for i in items)
    done = 0
    entries: list[FileEntry] = []
    cctx = zstandard.ZstdCompressor(level=level, threads=threads, write_checksum=True)
    try:
        with tmp.open("wb") as raw:
            # tarfile's plain "w" mode on the zstd writer: it only appends (tell() is asked once, at
            # 0), and it skips the stream mode's extra buffer copy.
            with (
                cctx.stream_writer(raw, closefd=False, write_size=_CHUNK) as zw,
                tarfile.open(fileobj=zw, mode="w", format=tarfile.PAX_FORMAT) as tar,  # type: ignore[call-overload]
            ):
                tar.copybufsize = _CHUNK
                schema = schema_bytes()
                _add_bytes(tar, SCHEMA_NAME, schema)
                entries.append(
                    FileEntry(
                        path=SCHEMA_NAME,
                        size=len(schema),
                        sha256=hashlib.sha256(schema).hexdigest(),
                        kind="schema",
                    )
                )
                for item in items:
                    with item.path.open("rb") as fh:
                        st = os.fstat(fh.fileno())
                        info = _info(item.arcname, st.st_size, int(st.st_mtime))
                        reader = _HashingReader(fh)
                        tar.addfile(info, reader)  # type: ignore[arg-type]
                    entries.append(
                        FileEntry(
                            path=item.arcname, size=reader.size, sha256=reader.sha.hexdigest(), kind=item.kind
                        )
                    )
                    done += reader.size
                    if progress:
                        progress(done, total)
                manifest = make_manifest(entries)
                _add_bytes(tar, MANIFEST_NAME, manifest.model_dump_json(indent=1).encode())
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(dest.parent)
    return manifest


def _info(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, mtime, 0o644
    info.uname = info.gname = ""
    return info


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    import time

    tar.addfile(_info(name, len(data), int(time.time())), io.BytesIO(data))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# verify / extract


@dataclass
class CheckResult:
    manifest: BundleManifest | None = None
    errors: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    manifest_raw: bytes = b""

    @property
    def ok(self) -> bool:
        return not self.errors


Sink = Callable[[str, tarfile.TarInfo, IO[bytes] | None], tuple[int, str] | None]


def _scan(bundle: Path, sink: Sink | None, result: CheckResult) -> None:
    """One pass over the archive: hash each file (and hand it to ``sink``), then check the manifest."""
    seen: dict[str, tuple[int, str]] = {}
    manifest_raw: bytes | None = None
    try:
        fh = bundle.open("rb")
    except OSError as exc:
        raise BundleError(f"{bundle}: cannot open ({exc.strerror or exc})") from exc
    try:
        with (
            fh,
            zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True) as zr,
            tarfile.open(fileobj=zr, mode="r|") as tar,  # type: ignore[call-overload]
        ):
            for member in tar:
                name = safe_member_name(member)
                if name in seen or (name == MANIFEST_NAME and manifest_raw is not None):
                    raise BundleError(f"member {name!r} appears twice")
                if member.isdir():
                    if sink:
                        sink(name, member, None)
                    continue
                src = tar.extractfile(member)
                assert src is not None
                if name == MANIFEST_NAME:
                    if member.size > _MAX_MANIFEST:
                        raise BundleError(f"{MANIFEST_NAME} is {member.size} bytes; refusing")
                    manifest_raw = src.read()
                    continue
                if sink:
                    got = sink(name, member, src)
                    assert got is not None
                else:
                    got = _hash_stream(src)
                seen[name] = got
                result.files += 1
                result.bytes += got[0]
    except UnsafeMember as exc:  # the contract's rule (contracts/safe_tar.py), the bundle's error
        raise BundleError(str(exc)) from None
    except (zstandard.ZstdError, tarfile.TarError, EOFError, OSError) as exc:
        raise BundleError(f"{bundle}: not a readable tar.zst bundle ({exc}); download it again") from exc
    if manifest_raw is None:
        raise BundleError(f"{bundle}: no {MANIFEST_NAME}; not a verl-consistency bundle")
    try:
        manifest = BundleManifest.model_validate_json(manifest_raw)
    except ValidationError as exc:
        version = _peek_version(manifest_raw)
        if isinstance(version, int) and version > MANIFEST_VERSION:
            raise BundleError(
                f"manifest version {version} is newer than this tool reads "
                f"({MANIFEST_VERSION}); upgrade verl-consistency"
            ) from exc
        raise BundleError(f"{MANIFEST_NAME} does not match the schema: {exc.errors()[:3]}") from exc
    result.manifest = manifest
    result.manifest_raw = manifest_raw
    listed = {e.path: e for e in manifest.files}
    for path, entry in listed.items():
        if path not in seen:
            result.errors.append(f"{path}: listed in the manifest but missing from the bundle")
        elif seen[path] != (entry.size, entry.sha256):
            result.errors.append(f"{path}: size/sha256 differ from the manifest (corrupted or altered)")
    result.errors += [f"{p}: in the bundle but not in the manifest" for p in seen if p not in listed]


def _peek_version(raw: bytes) -> object:
    import orjson

    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return obj.get("manifest_version") if isinstance(obj, dict) else None


def _hash_stream(src: IO[bytes], out: IO[bytes] | None = None) -> tuple[int, str]:
    sha = hashlib.sha256()
    n = 0
    while chunk := src.read(_CHUNK):
        sha.update(chunk)
        n += len(chunk)
        if out is not None:
            out.write(chunk)
    return n, sha.hexdigest()


def verify(bundle: Path) -> CheckResult:
    result = CheckResult()
    _scan(bundle, None, result)
    return result


def extract(bundle: Path, dest: Path) -> CheckResult:
    """Extract into ``dest`` (absent or empty). Nothing is left in ``dest`` unless every checksum
    matched; nothing is ever written outside it."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BundleError(f"{dest}: exists and is not an empty folder; pick a new target")
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    scratch = dest / f".extract-{secrets.token_hex(4)}"
    scratch.mkdir()
    root = scratch.resolve()

    def sink(name: str, member: tarfile.TarInfo, src: IO[bytes] | None) -> tuple[int, str] | None:
        target = root.joinpath(*PurePosixPath(name).parts)
        make_dirs_below(root, target if src is None else target.parent)
        if src is None:
            return None
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out:
            return _hash_stream(src, out)

    result = CheckResult()
    try:
        _scan(bundle, sink, result)
        if result.ok:
            fd = os.open(root / MANIFEST_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(result.manifest_raw)
            for child in sorted(root.iterdir()):
                os.rename(child, dest / child.name)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        if created:
            shutil.rmtree(dest, ignore_errors=True)
        raise
    shutil.rmtree(scratch, ignore_errors=True)
    if not result.ok and created:
        shutil.rmtree(dest, ignore_errors=True)
    return result
