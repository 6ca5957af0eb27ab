"""The bundle: only what was paired, checksummed, atomic, and safe to extract."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
import zstandard

from verl_consistency.postprocess import pipeline
from verl_consistency.postprocess.output import bundle
from verl_consistency.postprocess.output.bundle_manifest import MANIFEST_NAME, BundleManifest

from .pairing_trees import RunTree, req, tree_digest, vid


def _tree(root: Path) -> RunTree:
    t = RunTree(root)
    t.run_json()
    t.rollout_step(1, 0, 0, [req(vid("p1"))])
    t.rollout_step(1, 0, 1, [req(vid("p1"), 1, type="cached")], phase="decode")  # dumped, not paired
    t.rollout_step(1, 0, 2, [req(vid("t1"))], task="tensor")
    t.rollout_step(1, 0, 3, [req(vid("u1")), req(vid("u2"))])  # dumped, not paired
    t.actor_step(2, 0, 0, ["p1"])
    t.actor_step(2, 0, 1, ["t1"], task="tensor")
    t.actor_step(2, 0, 2, ["u1", "u2"])
    return t


def _members(path: Path) -> dict[str, bytes]:
    with (
        path.open("rb") as fh,
        zstandard.ZstdDecompressor().stream_reader(fh) as zr,
        tarfile.open(fileobj=zr, mode="r|") as tar,
    ):
        return {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}


def test_bundle_holds_only_paired_dumps_logs_and_run_manifest(tmp_path):
    t = _tree(tmp_path / "dump")
    before = tree_digest(t.run_dir)
    outcome = pipeline.postprocess(t.run_dir, compare=False)
    assert outcome.bundle == tmp_path / "dump" / "bundles" / f"bundle-{t.run_id}.tar.zst"
    names = set(_members(outcome.bundle))
    paired = {
        f"{d}/{f}"
        for d in (
            "rollout/1/step0/rank0",
            "actor/2/step0/rank0",
            "rollout/1/step2/rank0",
            "actor/2/step1/rank0",
        )
        for f in ("dump.json", "stack.json", "construct.json")
    }
    tensors = {n for n in names if "/dump_tensor_data/" in n}
    assert len(tensors) == 6  # 3 files per side of the tensor-mode pair
    assert names == paired | tensors | {
        "manifest.json",
        "manifest.schema.json",
        "run.json",
        "rollout/1/dispatch_log.jsonl",
        "actor/2/update_actor_log.jsonl",
    }
    m = outcome.manifest
    assert {p.pair_id: p.task for p in m.pairs} == {"p1.r0.a0": "statistics", "t1.r0.a0": "tensor"}
    assert {f.path for f in m.files} == names - {"manifest.json"}
    body = _members(outcome.bundle)
    for f in m.files:
        assert hashlib.sha256(body[f.path]).hexdigest() == f.sha256
        assert len(body[f.path]) == f.size
    assert BundleManifest.model_validate_json(body["manifest.json"]) == m
    assert tree_digest(t.run_dir) == before


def test_rerun_replaces_the_bundle_and_leaves_no_temp_files(tmp_path):
    t = _tree(tmp_path / "dump")
    first = pipeline.postprocess(t.run_dir, compare=False).bundle
    t.actor_step(2, 0, 3, ["u1"])  # more training data arrives; the rerun sees it
    second = pipeline.postprocess(t.run_dir, compare=False)
    assert second.bundle == first
    assert [p.name for p in first.parent.iterdir() if p.is_file()] == [first.name]
    assert bundle.verify(first).ok
    assert any(u.ref == "u1" for u in second.manifest.unpaired)


def test_verify_and_extract_round_trip(tmp_path):
    t = _tree(tmp_path / "dump")
    out = pipeline.postprocess(t.run_dir, compare=False)
    res = bundle.verify(out.bundle)
    assert res.ok, res.errors
    assert res.files == len(out.manifest.files)
    dest = tmp_path / "x" / "y"
    res = bundle.extract(out.bundle, dest)
    assert res.ok
    for p in out.manifest.pairs:
        for ref in (p.rollout, p.actor):
            assert (dest / ref.dir / "dump.json").read_bytes() == (
                t.run_dir / ref.dir / "dump.json"
            ).read_bytes()
    assert BundleManifest.model_validate_json((dest / MANIFEST_NAME).read_bytes()) == out.manifest
    assert not [p for p in dest.iterdir() if p.name.startswith(".extract-")]
    with pytest.raises(bundle.BundleError, match="not an empty folder"):
        bundle.extract(out.bundle, dest)


def _rewrite(src: Path, dst: Path, change) -> None:
    """Copy a bundle member by member, letting ``change(name, data)`` alter or drop members."""
    members = _members(src)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            new = change(name, data)
            if new is None:
                continue
            info = tarfile.TarInfo(name)
            info.size = len(new)
            tar.addfile(info, io.BytesIO(new))
    dst.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))


def test_verify_finds_altered_missing_and_extra_members(tmp_path):
    t = _tree(tmp_path / "dump")
    good = pipeline.postprocess(t.run_dir, compare=False).bundle
    bad = tmp_path / "bad.tar.zst"

    _rewrite(
        good, bad, lambda n, d: d.replace(b"1.5", b"9.5") if n == "rollout/1/step0/rank0/dump.json" else d
    )
    assert bundle.verify(bad).errors == [
        "rollout/1/step0/rank0/dump.json: size/sha256 differ from the manifest (corrupted or altered)"
    ]
    dest = tmp_path / "ex"
    assert not bundle.extract(bad, dest).ok
    assert not dest.exists()  # nothing is left behind from a bundle that failed its checksums

    _rewrite(good, bad, lambda n, d: None if n == "run.json" else d)
    assert bundle.verify(bad).errors == ["run.json: listed in the manifest but missing from the bundle"]

    members = _members(good)
    members["extra.txt"] = b"x"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    bad.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    assert bundle.verify(bad).errors == ["extra.txt: in the bundle but not in the manifest"]

    _rewrite(good, bad, lambda n, d: None if n == MANIFEST_NAME else d)
    with pytest.raises(bundle.BundleError, match=r"no manifest\.json"):
        bundle.verify(bad)

    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(bundle.BundleError, match=r"not a readable tar\.zst"):
        bundle.verify(bad)
    bad.write_bytes(b"not zstd at all")
    with pytest.raises(bundle.BundleError, match=r"not a readable tar\.zst"):
        bundle.verify(bad)


def _evil(path: Path, build) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        build(tar)
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return path


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"pwned") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _special(tar: tarfile.TarFile, name: str, kind: bytes, target: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    tar.addfile(info)


EVIL = {
    "dotdot": (lambda tar: _file(tar, "../escaped.txt"), "outside the target"),
    "nested dotdot": (lambda tar: _file(tar, "a/b/../../../escaped.txt"), "outside the target"),
    "absolute": (lambda tar: _file(tar, "/tmp/escaped-abs.txt"), "outside the target"),
    "symlink": (lambda tar: _special(tar, "link", tarfile.SYMTYPE, "/etc/passwd"), "symlink"),
    "symlink then write through it": (
        lambda tar: (_special(tar, "d", tarfile.SYMTYPE, ".."), _file(tar, "d/escaped.txt")),
        "symlink",
    ),
    "hardlink": (lambda tar: _special(tar, "hl", tarfile.LNKTYPE, "/etc/passwd"), "hardlink"),
    "char device": (lambda tar: _special(tar, "dev", tarfile.CHRTYPE), "device"),
    "fifo": (lambda tar: _special(tar, "fifo", tarfile.FIFOTYPE), "fifo"),
    "duplicate member": (lambda tar: (_file(tar, "a.txt"), _file(tar, "a.txt")), "twice"),
    "backslash": (lambda tar: _file(tar, "..\\escaped.txt"), "unsafe name"),
}


@pytest.mark.parametrize("name", list(EVIL))
def test_extract_refuses_unsafe_members_and_writes_nothing(tmp_path, name):
    build, message = EVIL[name]
    evil = _evil(tmp_path / "evil.tar.zst", build)
    area = tmp_path / "area"
    dest = area / "dest"
    area.mkdir()
    before = tree_digest(tmp_path, dir_mtimes=False)  # dest is created, then removed again
    with pytest.raises(bundle.BundleError, match=message):
        bundle.extract(evil, dest)
    with pytest.raises(bundle.BundleError, match=message):
        bundle.verify(evil)
    assert tree_digest(tmp_path, dir_mtimes=False) == before
    assert not Path("/tmp/escaped-abs.txt").exists()


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from verl_consistency.postprocess.output import bundle
    from verl_consistency.postprocess.output import bundle_manifest as manifest
    src, dest = Path(sys.argv[1]), Path(sys.argv[2])
    items = [bundle.Item(f"f{i}", p, "dump") for i, p in enumerate(sorted(src.iterdir()))]
    orig = bundle._HashingReader.read
    def slow(self, n=-1):
        time.sleep(0.05)
        return orig(self, n)
    bundle._HashingReader.read = slow
    def progress(done, total):
        print("progress", done, flush=True)
    bundle.write_bundle(dest, items, lambda files: None, progress=progress)
""")


def test_killing_the_writer_leaves_no_partial_bundle_under_the_final_name(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"{i}.bin").write_bytes(os.urandom(256 << 10))
    t = _tree(tmp_path / "dump")
    dest = tmp_path / "bundles" / f"bundle-{t.run_id}.tar.zst"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(src), str(dest)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        for _ in range(12):  # 3 of 10 MiB streamed (zstd's worker may still hold them in memory)
            assert proc.stdout.readline().startswith("progress")
        assert bundle.tmp_name(dest, proc.pid).is_file()  # it really was mid-write
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not dest.exists()
    assert bundle.tmp_name(dest, proc.pid).exists()

    # The next run removes the dead writer's leftover and writes a complete bundle.
    out = pipeline.postprocess(t.run_dir, out=tmp_path / "bundles", compare=False)
    assert out.bundle == dest
    assert not bundle.tmp_name(dest, proc.pid).exists()
    assert bundle.verify(out.bundle).ok


def test_a_killed_rewrite_keeps_the_previous_bundle_intact(tmp_path):
    t = _tree(tmp_path / "dump")
    good = pipeline.postprocess(t.run_dir, compare=False).bundle
    data = good.read_bytes()
    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"{i}.bin").write_bytes(os.urandom(128 << 10))
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(src), str(good)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("progress")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert good.read_bytes() == data
    assert bundle.verify(good).ok
