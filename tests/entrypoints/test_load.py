"""``verl-consistency load``: a model, a dataset or a reward file onto a volume, from a URL or a path.

Real sources only: a local HTTP server (tests/fixtures/http_files.py, Python's http.server)
serves real tar, tar.gz and tar.zst archives built here, and a folder on disk stands for a
mounted PVC. The command runs through the real CLI (typer's CliRunner), as the loader Job runs it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import socket
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard
from typer.testing import CliRunner, Result

from tests.fixtures.http_files import Routes, serve
from verl_consistency.entrypoints.cli import app
from verl_consistency.entrypoints.load.place import record_path

MODEL_FILES = {
    "config.json": b'{"model_type": "qwen2"}\n',
    "model.safetensors": os.urandom(3 << 20),  # several download chunks
    "tokenizer/vocab.json": b"{}\n",
}


def tar_bytes(members: dict[str, bytes], top: str | None = "Qwen-tiny", compress: str = "zst") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    if compress == "zst":
        return zstandard.ZstdCompressor().compress(raw)
    if compress == "gz":
        return gzip.compress(raw)
    return raw


def evil_tar(kind: str) -> bytes:
    """A tar that tries to write outside the target: a `..` name, an absolute name, or a link."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        ok = tarfile.TarInfo("m/config.json")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"{}"))
        if kind == "symlink":
            link = tarfile.TarInfo("m/escape")
            link.type = tarfile.SYMTYPE
            link.linkname = "../../outside"
            tar.addfile(link)
        else:
            name = {"dotdot": "m/../../outside.txt", "absolute": "/tmp/outside.txt"}[kind]
            info = tarfile.TarInfo(name)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    return buf.getvalue()


@pytest.fixture
def server() -> Iterator[tuple[str, Routes]]:
    with serve() as served:
        yield served


def load(*args: str) -> Result:
    return CliRunner().invoke(app, ["load", *args])


def tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_a_tar_zst_url_is_unpacked_once_and_a_rerun_does_nothing(server, tmp_path: Path) -> None:
    url, routes = server
    routes["/models/qwen.tar.zst"] = (200, tar_bytes(MODEL_FILES))
    models = tmp_path / "models"
    dest = models / "Qwen-tiny"
    res = load(f"{url}/models/qwen.tar.zst", str(dest), "--root", str(models))
    assert res.exit_code == 0, res.output
    assert tree(dest) == MODEL_FILES  # the archive's single top folder is dropped
    assert "loaded" in res.output
    assert sorted(p.name for p in models.iterdir()) == [".Qwen-tiny.load.json", "Qwen-tiny"]
    stamp = (dest / "config.json").stat().st_mtime_ns
    routes.clear()  # a rerun must not even ask the server
    again = load(f"{url}/models/qwen.tar.zst", str(dest), "--root", str(models))
    assert again.exit_code == 0, again.output
    assert "already loaded" in again.output
    assert (dest / "config.json").stat().st_mtime_ns == stamp


def test_a_single_file_url_with_its_checksum(server, tmp_path: Path) -> None:
    url, routes = server
    data = b"PAR1" + os.urandom(5000)
    routes["/data/train.parquet"] = (200, data)
    sha = hashlib.sha256(data).hexdigest()
    dest = tmp_path / "models" / "data" / "train.parquet"
    res = load(f"{url}/data/train.parquet#sha256={sha}", str(dest))
    assert res.exit_code == 0, res.output
    assert dest.read_bytes() == data
    assert f'"sha256": "{sha}"' in record_path(dest).read_text()


def test_a_wrong_checksum_leaves_nothing(server, tmp_path: Path) -> None:
    url, routes = server
    routes["/reward.py"] = (200, b"def compute_score(*a, **k):\n    return 0.0\n")
    dest = tmp_path / "models" / "reward.py"
    res = load(f"{url}/reward.py#sha256={'0' * 64}", str(dest))
    assert res.exit_code == 2
    assert "is not the 0000" in res.output
    assert list((tmp_path / "models").iterdir()) == []  # no DEST, no record, no scratch


@pytest.mark.parametrize(
    ("route", "status", "body", "words"),
    [
        ("/missing.tar.zst", None, None, "HTTP 404"),
        ("/login.tar.zst", 200, b"<html><body>Sign in</body></html>", "is the URL a web page"),
        ("/broken.tar.zst", 200, b"\x28\xb5\x2f\xfd" + b"garbage" * 10, "cannot be read"),
    ],
)
def test_a_bad_url_is_a_clear_error(server, tmp_path: Path, route, status, body, words) -> None:
    url, routes = server
    if status is not None:
        routes[route] = (status, body)
    dest = tmp_path / "models" / "m"
    res = load(f"{url}{route}", str(dest))
    assert res.exit_code == 2, res.output
    assert words in res.output
    assert not dest.exists()
    assert [p.name for p in (tmp_path / "models").iterdir()] == []


def test_a_server_error_or_no_server_asks_for_a_retry(server, tmp_path: Path) -> None:
    url, routes = server
    routes["/busy.tar"] = (503, b"try later")
    res = load(f"{url}/busy.tar", str(tmp_path / "m"))
    assert res.exit_code == 1
    assert "HTTP 503" in res.output
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = load(f"http://127.0.0.1:{port}/x.tar", str(tmp_path / "m"))
    assert res.exit_code == 1
    assert "cannot connect" in res.output


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_an_archive_that_escapes_is_refused(server, tmp_path: Path, kind: str) -> None:
    url, routes = server
    routes["/evil.tar"] = (200, evil_tar(kind))
    models = tmp_path / "volume" / "models"
    models.mkdir(parents=True)
    res = load(f"{url}/evil.tar", str(models / "m"), "--root", str(models))
    assert res.exit_code == 2, res.output
    assert {"dotdot": "outside the target folder", "absolute": "outside the target folder"}.get(
        kind, "symlink"
    ) in res.output
    assert list(models.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "volume").iterdir()) == ["models"]
    assert not Path("/tmp/outside.txt").exists()


def test_a_local_folder_and_a_local_archive(tmp_path: Path) -> None:
    """A PVC path: a model folder is copied (a link inside is copied as its file), a tar.gz unpacked."""
    src = tmp_path / "source" / "Qwen-tiny"
    for name, data in MODEL_FILES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    (src / "linked.json").symlink_to(src / "config.json")
    models = tmp_path / "models"
    res = load(str(src), str(models / "Qwen-tiny"), "--root", str(models))
    assert res.exit_code == 0, res.output
    assert tree(models / "Qwen-tiny") == {**MODEL_FILES, "linked.json": MODEL_FILES["config.json"]}
    assert not (models / "Qwen-tiny" / "linked.json").is_symlink()
    archive = tmp_path / "source" / "data.tar.gz"
    archive.write_bytes(tar_bytes({"train.parquet": b"a", "val.parquet": b"b"}, top=None, compress="gz"))
    res = load(str(archive), str(models / "data" / "my-set"), "--root", str(models))
    assert res.exit_code == 0, res.output
    assert tree(models / "data" / "my-set") == {"train.parquet": b"a", "val.parquet": b"b"}
    assert archive.is_file()  # the source is never changed


def test_dest_that_exists_from_elsewhere_is_never_overwritten(server, tmp_path: Path) -> None:
    url, routes = server
    routes["/a.tar"] = (200, tar_bytes({"x": b"1"}, compress="none"))
    routes["/b.tar"] = (200, tar_bytes({"x": b"2"}, compress="none"))
    models = tmp_path / "models"
    assert load(f"{url}/a.tar", str(models / "m")).exit_code == 0
    res = load(f"{url}/b.tar", str(models / "m"))
    assert res.exit_code == 2
    assert f"loaded from {url}/a.tar" in res.output
    assert (models / "m" / "x").read_bytes() == b"1"
    (models / "by-hand").mkdir()
    res = load(f"{url}/a.tar", str(models / "by-hand"))
    assert res.exit_code == 2
    assert "not put there by this loader" in res.output


def test_a_killed_loads_scratch_is_removed(server, tmp_path: Path) -> None:
    url, routes = server
    routes["/a.tar"] = (200, tar_bytes({"x": b"1"}, compress="none"))
    models = tmp_path / "models"
    stale = models / ".m.partial-dead"
    (stale / "archive").mkdir(parents=True)
    assert load(f"{url}/a.tar", str(models / "m")).exit_code == 0
    assert not stale.exists()
    assert sorted(p.name for p in models.iterdir()) == [".m.load.json", "m"]


@pytest.mark.parametrize(
    ("dest", "words"),
    [
        ("relative/m", "absolute path"),
        ("{root}", "must be a path inside"),
        ("{root}/../elsewhere", "must be a path inside"),
        ("{root}/link-out/m", "must be a path inside"),
    ],
)
def test_dest_must_lie_inside_root(tmp_path: Path, dest: str, words: str) -> None:
    root = tmp_path / "models"
    root.mkdir()
    (root / "link-out").symlink_to(tmp_path)
    src = tmp_path / "src.txt"
    src.write_text("x")
    res = load(str(src), dest.format(root=root), "--root", str(root))
    assert res.exit_code == 2, res.output
    assert words in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "src.txt"]


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("", "SOURCE is empty"),
        ("s3://bucket/model.tar", "scheme 's3' is not supported"),
        ("/nowhere/model", "no such file or folder"),
        ("source/model", "absolute path"),
    ],
)
def test_a_bad_source_is_named(tmp_path: Path, source: str, words: str) -> None:
    res = load(source, str(tmp_path / "m"))
    assert res.exit_code == 2
    assert words in res.output
    assert not (tmp_path / "m").exists()
