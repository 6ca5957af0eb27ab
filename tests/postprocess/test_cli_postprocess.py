"""The command line: sub-commands registered on ``verl-consistency``, documented exit codes."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile

import zstandard
from typer.testing import CliRunner

from verl_consistency.entrypoints.cli import app
from verl_consistency.postprocess.pipeline import Exit

from .pairing_trees import RunTree, req, vid

runner = CliRunner()


def _tree(root, *, pairable: bool = True) -> RunTree:
    t = RunTree(root)
    t.rollout_step(1, 0, 0, [req(vid("a"))] if pairable else [req(vid("a")), req(vid("b"))])
    t.rollout_step(1, 0, 1, [req(vid("a"), 1, type="cached")], phase="decode")
    t.actor_step(2, 0, 0, ["a"])
    return t


def test_exit_codes_are_distinct_and_documented(repo):
    """Documented once, in postprocess/README.md's table; the top README links to it."""
    assert {e.value for e in Exit} == {0, 3, 4, 5, 6}
    table = (repo / "postprocess/README.md").read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for e in Exit:
        assert f"\n| {e.value} |" in table, e
    assert "postprocess/README.md#exit-codes" in (repo / "README.md").read_text()


def test_postprocess_success_prints_the_reasons_table(tmp_path):
    t = _tree(tmp_path)
    res = runner.invoke(app, ["postprocess", str(t.run_dir), "--no-compare", "--out", str(tmp_path / "o")])
    assert res.exit_code == Exit.OK, res.output
    assert "Not paired, and why" in res.output
    assert "decode_only" in res.output
    assert "1 pair(s) from 2 dispatch and 1 training records" in res.output
    assert (tmp_path / "o" / f"bundle-{t.run_id}.tar.zst").is_file()


def test_nothing_paired_exits_4_and_still_writes_the_bundle(tmp_path):
    t = _tree(tmp_path, pairable=False)
    res = runner.invoke(app, ["postprocess", str(t.run_dir), "--no-compare"])
    assert res.exit_code == Exit.NOTHING_PAIRED
    assert "multi_request_step" in res.output
    assert (tmp_path / "bundles" / f"bundle-{t.run_id}.tar.zst").is_file()


def test_bad_input_exits_3_with_what_to_do(tmp_path):
    res = runner.invoke(app, ["postprocess", str(tmp_path / "nope"), "--no-compare"])
    assert res.exit_code == Exit.BAD_INPUT
    assert "not a folder" in res.output
    (tmp_path / "run").mkdir()
    res = runner.invoke(app, ["postprocess", str(tmp_path / "run"), "--no-compare"])
    assert res.exit_code == Exit.BAD_INPUT
    assert "--rollout-dir" in res.output


def test_recipe_dumps_by_hand_with_side_folders(tmp_path):
    t = RunTree(tmp_path, recipe=True)
    t.rollout_step(1, 0, 0, [req(vid("a"))], rank_folder="proc1")
    t.actor_step(2, 0, 0, ["a"], backend=None)
    res = runner.invoke(
        app,
        [
            "postprocess",
            str(t.run_dir),
            "--no-compare",
            "--rollout-dir",
            str(t.rollout_root),
            "--actor-dir",
            str(t.actor_root),
        ],
    )
    assert res.exit_code == Exit.OK, res.output


def test_verify_and_extract_exit_codes(tmp_path):
    t = _tree(tmp_path)
    assert runner.invoke(app, ["postprocess", str(t.run_dir), "--no-compare"]).exit_code == 0
    bundle = tmp_path / "bundles" / f"bundle-{t.run_id}.tar.zst"
    res = runner.invoke(app, ["verify", str(bundle)])
    assert res.exit_code == Exit.OK, res.output
    assert "all checksums match" in res.output
    res = runner.invoke(app, ["extract", str(bundle), str(tmp_path / "x")])
    assert res.exit_code == Exit.OK, res.output
    assert (tmp_path / "x" / "rollout/1/step0/rank0/dump.json").is_file()
    assert runner.invoke(app, ["extract", str(bundle), str(tmp_path / "x")]).exit_code == Exit.BAD_INPUT

    garbage = tmp_path / "g.tar.zst"
    garbage.write_bytes(b"\x00" * 100)
    assert runner.invoke(app, ["verify", str(garbage)]).exit_code == Exit.BAD_INPUT

    with (
        bundle.open("rb") as fh,
        zstandard.ZstdDecompressor().stream_reader(fh) as zr,
        tarfile.open(fileobj=zr, mode="r|") as tar,
    ):
        members = [(m, tar.extractfile(m).read()) for m in tar]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m, data in members:
            if m.name.endswith("dispatch_log.jsonl"):
                data = data.replace(b'"step":0', b'"step":5')
            tar.addfile(m, io.BytesIO(data))
    tampered = tmp_path / "t.tar.zst"
    tampered.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    res = runner.invoke(app, ["verify", str(tampered)])
    assert res.exit_code == Exit.CHECKSUM_MISMATCH
    assert "rollout/1/dispatch_log.jsonl" in res.output
    assert (
        runner.invoke(app, ["extract", str(tampered), str(tmp_path / "y")]).exit_code
        == Exit.CHECKSUM_MISMATCH
    )
    assert not (tmp_path / "y").exists()


def test_the_installed_command_runs_it(tmp_path):
    """Through ``python -m verl_consistency.entrypoints``, as the Kubernetes Job calls it."""
    t = _tree(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "verl_consistency.entrypoints", "postprocess", str(t.run_dir), "--no-compare"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "bundle:" in proc.stdout


def test_backend_comes_from_the_run_manifest_when_records_do_not_say(tmp_path):
    from verl_consistency.postprocess import pipeline

    t = RunTree(tmp_path)
    t.run_json(overrides=["actor_rollout_ref.actor.strategy=megatron", "trainer.n_gpus_per_node=8"])
    t.rollout_step(1, 0, 0, [req(vid("a"))])
    t.actor_step(2, 0, 0, ["a"], backend=None)
    out = pipeline.postprocess(t.run_dir, compare=False)
    assert [p.backend for p in out.manifest.pairs] == ["megatron"]
    assert out.manifest.run_manifest == "run.json"
    assert pipeline.backend_of(None) == "fsdp"
