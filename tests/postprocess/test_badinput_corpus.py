"""A corpus of broken inputs. Each one gives its documented error or warning; none crashes, none
changes a byte (or an mtime) of the inputs, and the good pairs around the damage still pair."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verl_consistency.entrypoints.cli import app
from verl_consistency.postprocess import pipeline
from verl_consistency.postprocess.output import bundle as bundle_mod
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.pair_types import UnpairedReason as R
from verl_consistency.postprocess.pipeline import Exit

from .pairing_trees import RunTree, req, tree_digest, vid

runner = CliRunner()

ROLL_LOG = "rollout/1/dispatch_log.jsonl"
ACT_LOG = "actor/2/update_actor_log.jsonl"


@dataclass(frozen=True)
class Case:
    name: str
    mutate: Callable[[RunTree, Path], None]
    reason: R | None = None
    """An Unpaired entry with this reason is expected ..."""
    ref: str = ""
    """... whose ref (or detail) contains this."""
    bad_input: str = ""
    """Or: BadInput whose message contains this."""
    warning: str = ""
    pairs: int | None = None
    """Expected number of pairs (None: the two good ones minus what the case broke, not checked)."""


def base_tree(root: Path) -> RunTree:
    t = RunTree(root)
    t.run_json(backend="fsdp")
    t.rollout_step(1, 0, 0, [req(vid("good1"))])
    t.rollout_step(1, 0, 1, [req(vid("good2"))])
    t.rollout_step(1, 0, 2, [req(vid("good2"), 1, type="cached")], phase="decode")
    t.actor_step(2, 0, 0, ["good1"])
    t.actor_step(2, 0, 1, ["good2"])
    return t


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as fh:
        fh.write(data)


def line(**rec) -> bytes:
    base = {
        "source": "dispatch_logger",
        "timestamp": "t",
        "pid": 1,
        "rank": 0,
        "step": 9,
        "phase": "prefill",
        "total_num_scheduled_tokens": 4,
        "requests": [req(vid("zz"), 4)],
    }
    base.update(rec)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode() + b"\n"


def rlog(t: RunTree) -> Path:
    return t.run_dir / ROLL_LOG


def alog(t: RunTree) -> Path:
    return t.run_dir / ACT_LOG


def dump1(t: RunTree) -> Path:
    return t.run_dir / "rollout/1/step0/rank0/dump.json"


def _mv_run(t: RunTree, outside: Path) -> None:
    t.run_dir.rename(outside / "gone")


CASES = [
    # -- the folders themselves -------------------------------------------------------------
    Case("run dir missing", lambda t, o: _mv_run(t, o), bad_input="not a folder"),
    Case(
        "run dir is a file", lambda t, o: (_mv_run(t, o), t.run_dir.write_text("x")), bad_input="not a folder"
    ),
    Case(
        "no rollout folder", lambda t, o: (t.run_dir / "rollout").rename(o / "r"), bad_input="--rollout-dir"
    ),
    Case("no actor folder", lambda t, o: (t.run_dir / "actor").rename(o / "a"), bad_input="--actor-dir"),
    Case(
        "no logs at all",
        lambda t, o: (rlog(t).rename(o / "1"), alog(t).rename(o / "2")),
        bad_input="DUMP_ON=1",
    ),
    # -- dispatch_log.jsonl lines -----------------------------------------------------------
    Case(
        "garbage line",
        lambda t, o: append(rlog(t), b"this is not json\n"),
        R.BAD_LOG_LINE,
        f"{ROLL_LOG}:4",
        pairs=2,
    ),
    Case(
        "torn last line", lambda t, o: append(rlog(t), line()[:30]), R.BAD_LOG_LINE, f"{ROLL_LOG}:4", pairs=2
    ),
    Case("line is an array", lambda t, o: append(rlog(t), b"[1, 2]\n"), R.BAD_LOG_LINE, "not a JSON object"),
    Case(
        "missing requests",
        lambda t, o: append(rlog(t), line(requests=...)),
        R.BAD_LOG_LINE,
        "missing field 'requests'",
    ),
    Case("step is a string", lambda t, o: append(rlog(t), line(step="3")), R.BAD_LOG_LINE, "integers"),
    Case("unknown phase", lambda t, o: append(rlog(t), line(phase="prefil")), R.BAD_LOG_LINE, "'prefil'"),
    Case(
        "requests not a list",
        lambda t, o: append(rlog(t), line(requests={"a": 1})),
        R.BAD_LOG_LINE,
        "requests must be a list",
    ),
    Case(
        "request without id",
        lambda t, o: append(rlog(t), line(requests=[{"type": "new", "tokens": 3}])),
        R.BAD_LOG_LINE,
        "missing field 'request_id'",
    ),
    Case(
        "invalid utf-8",
        lambda t, o: append(rlog(t), b'{"step": "\xff\xfe"}\n'),
        R.BAD_LOG_LINE,
        f"{ROLL_LOG}:4",
    ),
    Case(
        "prefill with no requests",
        lambda t, o: append(rlog(t), line(requests=[])),
        R.BAD_LOG_LINE,
        "no requests",
    ),
    Case(
        "captured id not in step",
        lambda t, o: append(
            rlog(t), line(requests=[req(vid("p")), req(vid("q"))], captured_request_id="nope")
        ),
        R.BAD_LOG_LINE,
        "'nope'",
    ),
    Case("blank lines are skipped", lambda t, o: append(rlog(t), b"\n\n  \n"), pairs=2),
    Case(
        "bare NaN in a log line",
        lambda t, o: append(
            rlog(t),
            line(step=7, requests=[req(vid("nan"))]).replace(b'"timestamp": "t"', b'"timestamp": NaN'),
        ),
        R.NO_TRAINING_MICRO_BATCH,
        "nan",
        pairs=2,
    ),
    # -- update_actor_log.jsonl lines -------------------------------------------------------
    Case(
        "actor line without request_ids",
        lambda t, o: append(alog(t), b'{"pid": 2, "rank": 0, "step": 5}\n'),
        R.BAD_LOG_LINE,
        f"{ACT_LOG}:3",
    ),
    Case(
        "actor request id is a number",
        lambda t, o: append(
            alog(t),
            json.dumps({"pid": 2, "rank": 0, "step": 5, "request_ids": [5], "num_requests": 1}).encode()
            + b"\n",
        ),
        R.BAD_LOG_LINE,
        "strings",
    ),
    # -- dump.json --------------------------------------------------------------------------
    Case(
        "truncated dump.json",
        lambda t, o: dump1(t).write_bytes(dump1(t).read_bytes()[:200]),
        R.DUMP_UNREADABLE,
        "good1",
        pairs=1,
    ),
    Case(
        "binary dump.json",
        lambda t, o: dump1(t).write_bytes(os.urandom(64)),
        R.DUMP_UNREADABLE,
        "rollout/1/step0/rank0",
        pairs=1,
    ),
    Case(
        "dump.json without data",
        lambda t, o: dump1(t).write_text('{"task": "statistics"}'),
        R.DUMP_UNREADABLE,
        "no 'data'",
        pairs=1,
    ),
    Case(
        "NaN and Infinity values are fine",
        lambda t, o: dump1(t).write_text(
            dump1(t)
            .read_text()
            .replace('"Max": 1.5', '"Max": NaN')
            .replace('"Min": -1.25', '"Min": -Infinity')
        ),
        pairs=2,
    ),
    Case(
        "step folder missing",
        lambda t, o: (t.run_dir / "rollout/1/step0").rename(o / "s"),
        R.DUMP_MISSING,
        "step0",
        pairs=1,
    ),
    Case(
        "rank folder missing",
        lambda t, o: (t.run_dir / "actor/2/step1/rank0").rename(o / "k"),
        R.DUMP_MISSING,
        "rank0",
        pairs=1,
    ),
    Case(
        "two foreign rank folders",
        lambda t, o: (t.run_dir / "actor/2/step1/rank0").rename(t.run_dir / "actor/2/step1/rank5"),
        R.DUMP_MISSING,
        "actor",
        pairs=1,
    ),
    Case(
        "dump.json is a symlink outside",
        lambda t, o: (dump1(t).unlink(), (o / "d.json").write_text("{}"), dump1(t).symlink_to(o / "d.json")),
        R.OUTSIDE_RUN,
        "leads outside",
        pairs=1,
    ),
    Case(
        "step folder is a symlink outside",
        lambda t, o: (
            (t.run_dir / "rollout/1/step1").rename(o / "step1"),
            (t.run_dir / "rollout/1/step1").symlink_to(o / "step1"),
        ),
        R.OUTSIDE_RUN,
        "leads outside",
        pairs=1,
    ),
    Case(
        "dump_path absolute elsewhere",
        lambda t, o: (
            append(rlog(t), line(step=0, requests=[req(vid("abs"))], dump_path="/etc")),
            t.actor_step(2, 0, 3, ["abs"]),
        ),
        R.OUTSIDE_RUN,
        "'/etc'",
        pairs=2,
    ),
    Case(
        "dump_path escapes with ..",
        lambda t, o: (
            append(rlog(t), line(step=0, requests=[req(vid("esc"))], dump_path="rollout/../../..")),
            t.actor_step(2, 0, 3, ["esc"]),
        ),
        R.OUTSIDE_RUN,
        "rollout/../../..",
        pairs=2,
    ),
    # -- log files --------------------------------------------------------------------------
    Case(
        "log is a symlink outside",
        lambda t, o: (
            (o / "x.jsonl").write_bytes(rlog(t).read_bytes()),
            (t.run_dir / "rollout/5").mkdir(),
            (t.run_dir / "rollout/5/dispatch_log.jsonl").symlink_to(o / "x.jsonl"),
        ),
        R.OUTSIDE_RUN,
        "rollout/5/dispatch_log.jsonl",
        pairs=2,
    ),
    Case(
        "dangling log symlink",
        lambda t, o: (
            (t.run_dir / "actor/6").mkdir(),
            (t.run_dir / "actor/6/update_actor_log.jsonl").symlink_to(o / "none"),
        ),
        R.LOG_UNREADABLE,
        "actor/6/update_actor_log.jsonl",
        pairs=2,
    ),
    Case(
        "log is a folder",
        lambda t, o: (t.run_dir / "rollout/7/dispatch_log.jsonl").mkdir(parents=True),
        R.LOG_UNREADABLE,
        "not a regular file",
        pairs=2,
    ),
    Case(
        "log is a fifo",
        lambda t, o: (
            (t.run_dir / "rollout/8").mkdir(),
            os.mkfifo(t.run_dir / "rollout/8/dispatch_log.jsonl"),
        ),
        R.LOG_UNREADABLE,
        "rollout/8/dispatch_log.jsonl",
        pairs=2,
    ),
    # -- duplicates and the run manifest ---------------------------------------------------
    Case(
        "duplicate prefill on one rank",
        lambda t, o: t.rollout_step(9, 0, 0, [req(vid("good1", suffix="99999999"))]),
        R.DUPLICATE_ID,
        "rollout/9/step0/rank0",
        pairs=2,
    ),
    Case(
        "duplicate micro batch",
        lambda t, o: t.actor_step(2, 0, 7, ["good1"]),
        R.REPEATED_MICRO_BATCH,
        "actor/2/step7",
        pairs=2,
    ),
    Case(
        "run.json malformed",
        lambda t, o: (t.run_dir / "run.json").write_text("{not json"),
        warning="unreadable run manifest",
        pairs=2,
    ),
    Case("empty micro batch", lambda t, o: t.actor_step(2, 0, 8, []), pairs=2),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(tmp_path, case: Case):
    assert len(CASES) >= 30
    outside = tmp_path / "outside"
    outside.mkdir()
    t = base_tree(tmp_path / "tree")
    case.mutate(t, outside)
    before = tree_digest(tmp_path / "tree", outside)
    out = tmp_path / "bundles"
    if case.bad_input:
        with pytest.raises(discover.BadInput, match=re.escape(case.bad_input)):
            pipeline.postprocess(t.run_dir, out=out, compare=False)
        assert not out.exists() or not any(out.glob("bundle-*"))
    else:
        outcome = pipeline.postprocess(t.run_dir, out=out, compare=False)
        m = outcome.manifest
        if case.reason is not None:
            hits = [u for u in m.unpaired if u.reason is case.reason and case.ref in u.ref + u.detail]
            assert hits, [u.model_dump() for u in m.unpaired]
        if case.warning:
            assert any(case.warning in w for w in m.warnings)
        if case.pairs is not None:
            assert len(m.pairs) == case.pairs
        assert outcome.bundle.is_file()
    assert tree_digest(tmp_path / "tree", outside) == before


def test_empty_micro_batches_are_counted_as_no_request_id(tmp_path):
    t = base_tree(tmp_path / "tree")
    t.actor_step(2, 0, 8, [])
    outcome = pipeline.postprocess(t.run_dir, out=tmp_path / "b", compare=False)
    assert outcome.manifest.pairing.unpaired_counts["actor_step"] == {"no_request_id": 1}


def test_out_inside_a_dump_folder_is_refused(tmp_path):
    t = base_tree(tmp_path / "tree")
    before = tree_digest(tmp_path / "tree")
    for inside in (t.run_dir / "rollout" / "b", t.run_dir, t.run_dir / "x"):
        with pytest.raises(discover.BadInput, match="inside the run or a dump folder"):
            pipeline.postprocess(t.run_dir, out=inside, compare=False)
    assert tree_digest(tmp_path / "tree") == before


# -- nesting deeper than any JSON reader recurses: exit 3 naming the file, never a traceback ------

DEEP = 200_000
"""Arrays nested this deep: far past Python's recursion limit (orjson stops at 1,024)."""


def _deep(depth: int = DEEP) -> bytes:
    return b"[" * depth + b"]" * depth


def _postprocess_refused(t: RunTree, out: Path) -> str:
    """``verl-consistency postprocess`` itself (typer's runner): exit 3, no traceback, no bundle."""
    res = runner.invoke(app, ["postprocess", str(t.run_dir), "--no-compare", "--out", str(out)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output, res.output
    assert "RecursionError" not in res.output, res.output
    assert res.exit_code == Exit.BAD_INPUT, res.output
    assert not list(out.glob("bundle-*.tar.zst")), "a refused run writes no bundle"
    return " ".join(res.output.split())  # rich wraps long paths


@pytest.mark.parametrize(
    "dump",
    [
        b'{"task": "statistics", "level": "L0", "data": {"Module.x": ' + _deep() + b"}}",
        _deep(),
    ],
    ids=["inside msprobe's shape", "bare"],
)
def test_a_deeply_nested_dump_json_exits_3_naming_the_file(tmp_path, dump: bytes):
    t = base_tree(tmp_path / "tree")
    dump1(t).write_bytes(dump)
    before = dump1(t).read_bytes()
    said = _postprocess_refused(t, tmp_path / "out")
    assert "bad input" in said
    assert "step0/rank0/dump.json" in said.replace(" ", "")
    assert "nested too deep" in said
    assert dump1(t).read_bytes() == before, "inputs are never modified"


@pytest.mark.parametrize(
    ("log", "lineno", "record"),
    [
        # orjson refuses the bare NaN first, so Python's json (which recurses) reads the line
        (ROLL_LOG, 4, b'{"timestamp": NaN, "requests": ' + _deep() + b"}"),
        (ACT_LOG, 3, b'{"loss": -Infinity, "request_ids": ' + _deep() + b"}"),
        # orjson alone reads this one, and stops at its own limit
        (ROLL_LOG, 4, _deep()),
    ],
    ids=["dispatch line with NaN", "update_actor line with Infinity", "dispatch line, plain"],
)
def test_a_deeply_nested_log_line_exits_3_naming_file_and_line(
    tmp_path, log: str, lineno: int, record: bytes
):
    t = base_tree(tmp_path / "tree")
    append(t.run_dir / log, record + b"\n")
    said = _postprocess_refused(t, tmp_path / "out")
    assert f"{log}:{lineno}" in said.replace(" ", "")
    assert "nested too deep" in said


def test_a_shallow_garbage_line_is_still_a_bad_line_and_the_run_goes_on(tmp_path):
    """The control: only nesting no writer produces stops the run; a torn line does not."""
    t = base_tree(tmp_path / "tree")
    append(t.run_dir / ROLL_LOG, b'{"timestamp": "2026-12-01T00:00:00", "requests": [[[\n')
    res = runner.invoke(app, ["postprocess", str(t.run_dir), "--no-compare", "--out", str(tmp_path / "out")])
    assert res.exit_code == Exit.OK, res.output
    (bundle,) = (tmp_path / "out").glob("bundle-*.tar.zst")
    manifest = bundle_mod.verify(bundle).manifest
    assert manifest is not None
    assert [u.ref for u in manifest.unpaired if u.reason is R.BAD_LOG_LINE] == [f"{ROLL_LOG}:4"]
