"""The six defects of issue 11, one test (or one family) each: a chunk-split prefill in the
recipe's log format, training ids that look like vLLM ids, a worker folder whose name is not
UTF-8, non-regular files where a file is expected, a verdict for every request, and a log line
far longer than any real one."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import orjson
import pytest

from verl_consistency.contracts import records
from verl_consistency.postprocess import pipeline
from verl_consistency.postprocess.output import bundle
from verl_consistency.postprocess.pairing.discover import Roots
from verl_consistency.postprocess.pairing.pair import pair_run
from verl_consistency.postprocess.pairing.pair_types import UnpairedReason as R

from .pairing_trees import RunTree, req, tree_digest, vid


def _pair(tree: RunTree):
    return pair_run(Roots.open(tree.run_dir, **tree.roots_args()))


def _requests(result) -> dict[str, R]:
    return {u.ref: u.reason for u in result.unpaired if u.subject == "request"}


def _recipe_line(pid: int, rank: int, step: int, reqs: list[dict], phase: str = "prefill") -> bytes:
    """A dispatch_log.jsonl line exactly as the recipe's DispatchLogger writes it (no
    prompt_tokens, no num_computed_tokens, no attn_state, no dump_path)."""
    rec = {
        "source": "dispatch_logger",
        "timestamp": "2026-05-13T10:00:00",
        "pid": pid,
        "rank": rank,
        "step": step,
        "phase": phase,
        "total_num_scheduled_tokens": sum(r["tokens"] for r in reqs),
        "requests": reqs,
    }
    return json.dumps(rec, ensure_ascii=False).encode() + b"\n"


def _recipe_step(t: RunTree, pid: int, step: int, reqs: list[dict], phase: str = "prefill") -> None:
    log = t.rollout_root / str(pid) / records.DISPATCH_LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        fh.write(_recipe_line(pid, 0, step, reqs, phase))
    t.write_dump(t.rollout_root / str(pid) / f"step_{step}" / "rank_0", vllm=True)


def _e(request_id: str, tokens: int, type: str = "new", **extra) -> dict:
    return {"request_id": request_id, "type": type, "tokens": tokens, **extra}


# -- 1. chunked prefill in the recipe's format ---------------------------------------------------


def test_recipe_format_chunk_split_prefill_is_not_paired(tmp_path):
    """The first chunk looks whole (type new, no prompt_tokens); the later cached chunk on the
    same worker gives it away."""
    t = RunTree(tmp_path, recipe=True)
    _recipe_step(t, 4242, 0, [_e(vid("chunky"), 8)])
    _recipe_step(t, 4242, 1, [_e(vid("chunky"), 12, "cached")])
    _recipe_step(t, 4242, 2, [_e(vid("chunky"), 1, "cached")], phase="decode")
    t.actor_step(77, 0, 0, ["chunky"], backend=None)
    res = _pair(t)
    assert res.pairs == []
    assert _requests(res) == {"chunky": R.CHUNKED_PREFILL}
    assert res.counts["rollout_step"] == {"chunked_prefill": 2, "decode_only": 1}


def test_recipe_format_decodes_in_a_mixed_step_are_not_chunks(tmp_path):
    """A new request prefilled next to decodes: the decodes (one token, or one plus the logged
    speculative tokens) do not make the decoding requests' own prefills chunks."""
    t = RunTree(tmp_path, recipe=True)
    _recipe_step(t, 4242, 0, [_e(vid("a"), 16)])
    _recipe_step(t, 4242, 1, [_e(vid("b"), 16)])
    _recipe_step(
        t, 4242, 2, [_e(vid("c"), 9), _e(vid("a"), 1, "cached"), _e(vid("b"), 4, "cached", spec_tokens=3)]
    )
    for step, rid in enumerate(["a", "b", "c"]):
        t.actor_step(77, 0, step, [rid], backend=None)
    res = _pair(t)
    assert sorted(p.request_id for p in res.pairs) == ["a", "b"]
    assert _requests(res) == {"c": R.MULTI_REQUEST_STEP}


def test_a_chunk_on_another_worker_does_not_count(tmp_path):
    """The rule is per worker: the same request id on another vLLM worker is another story."""
    t = RunTree(tmp_path, recipe=True)
    _recipe_step(t, 4242, 0, [_e(vid("w"), 8)])
    _recipe_step(t, 4343, 0, [_e(vid("w"), 12, "cached")])
    t.actor_step(77, 0, 0, ["w"], backend=None)
    (p,) = _pair(t).pairs
    assert p.rollout.dir == "rollout/4242/step_0/rank_0"


# -- 2. training ids are verl's own ---------------------------------------------------------------


def test_a_training_id_that_ends_like_a_vllm_suffix_is_not_cut(tmp_path):
    verl_id = "my-agent-loop-0123abcd"
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid(verl_id))])
    t.actor_step(2, 0, 0, [verl_id])
    res = _pair(t)
    (p,) = res.pairs
    assert (p.request_id, p.vllm_request_id) == (verl_id, vid(verl_id))
    assert _requests(res) == {}


def test_a_training_id_equal_to_the_unsuffixed_vllm_id_pairs(tmp_path):
    """vLLM before 0.14 kept the id as sent: the dispatch log then holds verl's id verbatim."""
    verl_id = "plain-deadbeef"
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(verl_id)])
    t.actor_step(2, 0, 0, [verl_id])
    (p,) = _pair(t).pairs
    assert p.request_id == verl_id


# -- 3. a worker folder whose name is not UTF-8 ---------------------------------------------------


def test_a_worker_folder_with_a_non_utf8_name_still_gives_a_bundle(tmp_path):
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("good"))])
    t.actor_step(2, 0, 0, ["good"])
    odd = os.fsencode(t.rollout_root) + b"/w\xff\xfe"
    try:
        os.mkdir(odd)
    except OSError as exc:  # a file system that refuses such names cannot have the problem
        pytest.skip(f"cannot create a non-UTF-8 name here: {exc}")
    with open(odd + b"/" + records.DISPATCH_LOG.encode(), "wb") as fh:
        fh.write(_recipe_line(5, 0, 0, [_e(vid("odd"), 4)]))
    out = tmp_path / "bundles"
    outcome = pipeline.postprocess(t.run_dir, out=out, compare=False)
    assert outcome.code == pipeline.Exit.OK
    assert outcome.bundle.is_file()
    assert [p.request_id for p in outcome.manifest.pairs] == ["good"]
    (skipped,) = [u for u in outcome.manifest.unpaired if u.reason is R.LOG_UNREADABLE]
    assert skipped.ref == "rollout/w\\xff\\xfe/dispatch_log.jsonl"
    assert "UTF-8" in skipped.detail
    bundle.verify(outcome.bundle)


def test_a_run_folder_and_tensor_files_with_non_utf8_names_still_give_a_bundle(tmp_path):
    odd_root = os.fsencode(tmp_path) + b"/runs\xe9"
    try:
        os.mkdir(odd_root)
    except OSError as exc:
        pytest.skip(f"cannot create a non-UTF-8 name here: {exc}")
    t = RunTree(Path(os.fsdecode(odd_root)))
    t.rollout_step(1, 0, 0, [req(vid("good"))], task="tensor")
    t.actor_step(2, 0, 0, ["good"], task="tensor")
    tensors = os.fsencode(t.run_dir / "rollout/1/step0/rank0/dump_tensor_data")
    with open(tensors + b"/odd\xff.pt", "wb") as fh:
        fh.write(b"x")
    outcome = pipeline.postprocess(t.run_dir, out=tmp_path / "bundles", compare=False)
    assert [p.request_id for p in outcome.manifest.pairs] == ["good"]
    assert "\\xe9" in outcome.manifest.source.run_dir
    assert not any("odd" in f.path for f in outcome.manifest.files)
    bundle.verify(outcome.bundle)


# -- 4. non-regular files where a file is expected ------------------------------------------------


def _make_special(path: Path, kind: str, outside: Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        try:
            os.chdir(path.parent)  # AF_UNIX paths are limited to about 107 bytes: bind a short one
            s.bind(path.name)
        finally:
            os.chdir(cwd)
            s.close()
    elif kind == "device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: never ends
        except PermissionError:
            pytest.skip("creating a device node needs CAP_MKNOD")
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "folder":
        path.mkdir()
    else:
        raise AssertionError(kind)


SPECIALS = ["fifo", "socket", "device", "dangling", "folder"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", SPECIALS)
@pytest.mark.parametrize("where", ["dump.json", "stack.json", "dispatch_log.jsonl", "update_actor_log.jsonl"])
def test_a_non_regular_file_where_a_file_is_expected_gets_a_reason(tmp_path, kind, where):
    t = RunTree(tmp_path / "tree")
    t.rollout_step(1, 0, 0, [req(vid("hit"))])
    t.rollout_step(1, 0, 1, [req(vid("ok"))])
    t.actor_step(2, 0, 0, ["hit"])
    t.actor_step(2, 0, 1, ["ok"])
    outside = tmp_path / "outside"
    outside.mkdir()
    if where in ("dump.json", "stack.json"):
        target = t.run_dir / "rollout/1/step0/rank0" / where
        expect = R.DUMP_MISSING if (where, kind) == ("dump.json", "dangling") else R.DUMP_UNREADABLE
        pairs = ["ok"]
    else:  # a second worker whose log is the odd file; the real logs still pair
        side = "rollout/9" if where == "dispatch_log.jsonl" else "actor/9"
        (t.run_dir / side).mkdir(parents=True)
        target = t.run_dir / side / where
        expect = R.LOG_UNREADABLE
        pairs = ["hit", "ok"]
    _make_special(target, kind, outside)
    before = tree_digest(tmp_path / "tree")
    outcome = pipeline.postprocess(t.run_dir, out=tmp_path / "bundles", compare=False)
    m = outcome.manifest
    assert sorted(p.request_id for p in m.pairs) == pairs
    assert any(u.reason is expect for u in m.unpaired), [u.model_dump() for u in m.unpaired]
    assert outcome.bundle.is_file()
    assert tree_digest(tmp_path / "tree") == before
    s = m.pairing
    assert s.requests_seen == s.requests_paired + s.requests_unpaired


# -- 5. a verdict for every request ----------------------------------------------------------------


def test_every_request_gets_exactly_one_verdict(tmp_path):
    """Requests seen only in multi-request prefills, prefix-hit steps or decodes, and trained
    only in multi-request micro batches, each get a line of their own."""
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("m1")), req(vid("m2"))])
    t.rollout_step(1, 0, 1, [req(vid("hit"), 4, prompt=10, computed=6)])
    t.rollout_step(
        1, 0, 2, [req(vid("old"), 1, type="cached"), req(vid("m1"), 1, type="cached")], phase="decode"
    )
    t.rollout_step(1, 0, 3, [req(vid("paired"))])
    t.actor_step(2, 0, 0, ["m1", "hit", "trainonly"])
    t.actor_step(2, 0, 1, ["paired"])
    outcome = pipeline.postprocess(t.run_dir, out=tmp_path / "b", compare=False)
    res, m = outcome.result, outcome.manifest
    assert [p.request_id for p in res.pairs] == ["paired"]
    assert _requests(res) == {
        "m1": R.MULTI_REQUEST_STEP,
        "m2": R.MULTI_REQUEST_STEP,
        "hit": R.PREFIX_CACHE_HIT,
        "old": R.DECODE_ONLY,
        "trainonly": R.NO_ROLLOUT_PREFILL,
    }
    refs = [u.ref for u in res.unpaired if u.subject == "request"]
    assert len(refs) == len(set(refs))
    s = m.pairing
    assert (s.requests_seen, s.requests_paired, s.requests_unpaired) == (6, 1, 5)
    assert sum(m.pairing.unpaired_counts["request"].values()) == s.requests_unpaired


def test_n_children_are_one_request(tmp_path):
    """n>1 siblings are the same verl request: it pairs once, the siblings' steps are listed."""
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("par", 1, "aaaaaaaa"))])
    t.rollout_step(1, 0, 1, [req(vid("par", 0, "bbbbbbbb"))])
    t.actor_step(2, 0, 0, ["par"])
    res = _pair(t)
    (p,) = res.pairs
    assert p.vllm_request_id == "0_par-bbbbbbbb"
    assert _requests(res) == {}
    (sib,) = [u for u in res.unpaired if u.reason is R.DUPLICATE_ID]
    assert sib.subject == "rollout_step"
    assert "1_par" in sib.detail
    assert res.requests_seen == 1


# -- 6. a huge log line ------------------------------------------------------------------------------


def test_an_over_long_log_line_is_one_bad_line_read_in_bounded_memory(tmp_path):
    """A 96 MiB line between two good ones: reported once, the lines after it still count, and
    the reader never holds the line (peak RSS grows by far less than the line)."""
    t = RunTree(tmp_path)
    t.rollout_step(1, 0, 0, [req(vid("before"))])
    log = t.rollout_root / "1" / records.DISPATCH_LOG
    with log.open("ab") as fh:
        fh.write(b'{"pad": "')
        chunk = b"x" * (1 << 20)
        for _ in range(96):
            fh.write(chunk)
        fh.write(b'"}\n')
    t.rollout_step(1, 0, 1, [req(vid("after"))])
    t.actor_step(2, 0, 0, ["before"])
    t.actor_step(2, 0, 1, ["after"])
    script = textwrap.dedent(
        f"""
        import json, resource
        from verl_consistency.postprocess.pairing.discover import Roots
        from verl_consistency.postprocess.pairing.pair import pair_run
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        res = pair_run(Roots.open({str(t.run_dir)!r}))
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        print(json.dumps({{
            "pairs": sorted(p.request_id for p in res.pairs),
            "bad": [(u.ref, u.detail) for u in res.unpaired if u.reason == "bad_log_line"],
            "grew_kib": grew,
        }}))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = orjson.loads(out.stdout.splitlines()[-1])
    assert got["pairs"] == ["after", "before"]
    ((ref, detail),) = got["bad"]
    assert ref == "rollout/1/dispatch_log.jsonl:2"
    assert "longer than" in detail
    assert got["grew_kib"] < 48 * 1024, got


def test_over_long_line_counting_is_exact_at_every_block_boundary(tmp_path):
    """Lines around the cap and around the read block size keep their numbers."""
    from unittest import mock

    from verl_consistency.postprocess.pairing import discover

    path = tmp_path / "x.jsonl"
    lines = []
    for n in (1, 5, 31, 32, 33, 7, 64, 100, 2, 40, 0, 3):
        lines.append(b'{"k":"' + b"y" * n + b'"}' if n else b"")
    path.write_bytes(b"\n".join(lines))  # no newline at the end
    log = discover.LogFile("rollout", path, "rollout/x.jsonl")
    seen: list = []
    with mock.patch.object(discover, "MAX_LINE", 40), mock.patch.object(discover, "_BLOCK", 16):
        got = [(n, len(o["k"])) for n, o in discover.iter_jsonl(log, seen.append)]
    too_long = {i + 1 for i, ln in enumerate(lines) if len(ln) > 40}
    assert got == [(i + 1, len(ln) - 8) for i, ln in enumerate(lines) if ln and i + 1 not in too_long]
    assert sorted(int(u.ref.rsplit(":", 1)[1]) for u in seen) == sorted(too_long)
    assert Counter(u.reason for u in seen) == {R.BAD_LOG_LINE: len(too_long)}
