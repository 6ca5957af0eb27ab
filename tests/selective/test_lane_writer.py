"""The lane writer's helper process (``patches/hooks/lanes/lane_writer.py``, issue 43): what it writes,
what it says when it cannot, and the training side's records waiting for its files.

The byte-for-byte equality with the in-line write on real msprobe dumps is in ``test_lane_stats.py``
(``test_the_helper_process_writes_each_lane_byte_for_byte_as_in_line``); here the helper runs as
the training process starts it (a real ``python -c`` child), on steps made from one template.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from verl_consistency.contracts import env, records
from verl_consistency.patches.hooks.lanes.lane_json import LANE_RECORD, StepTemplate
from verl_consistency.patches.hooks.lanes.lane_writer import (
    LaneFiles,
    LaneWriteError,
    LaneWriter,
    write_files,
)


def _rec(i: int) -> dict[str, Any]:
    return {"type": "torch.Tensor", "dtype": "torch.float32", LANE_RECORD: i, "requires_grad": False}


CACHE = {
    "task": "statistics",
    "level": "L0",
    "data": {
        "Module.a.forward.0": {"input_args": [_rec(0)], "output": [_rec(1)]},
        "Module.b.forward.0": {"input_args": [_rec(1)], "output": [_rec(2)]},
    },
}


def _files(folder: Path, lanes: int, scale: float, template: StepTemplate | None) -> LaneFiles:
    """A step of ``lanes`` lanes into ``folder/req{k}/``: lane k's values depend on k and ``scale``."""
    paths = []
    for k in range(lanes):
        (folder / f"req{k}").mkdir(parents=True, exist_ok=True)
        paths.append(folder / f"req{k}")
    return LaneFiles(
        template=template,
        shapes=[[[k + 1, 4] for k in range(lanes)] for _ in range(3)],
        values=[[[scale * (i + k), -scale, scale / 3, None] for k in range(lanes)] for i in range(3)],
        shared=[False, False, False],
        dump_paths=[str(p / "dump.json") for p in paths],
        stack_paths=[str(p / "stack.json") for p in paths],
        construct_paths=[str(p / "construct.json") for p in paths],
        stack={"Module.a.forward.0": ["File x.py, line 1, in f"]},
        construct={"Module.a.forward.0": None, "Module.b.forward.0": "Module.a.forward.0"},
        where=str(folder),
    )


def _texts(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.json"))}


def test_the_helper_writes_each_step_as_the_training_process_would(tmp_path: Path) -> None:
    """Three steps, the template sent once and then a second one: every file equals write_files'."""
    first = StepTemplate(CACHE, lambda n: n.get(LANE_RECORD))
    second = StepTemplate({**CACHE, "level": "L1"}, lambda n: n.get(LANE_RECORD))
    steps = [(first, 1.0), (first, 2.5), (second, -4.0), (None, 0.0)]
    writer = LaneWriter(max_pending=2)
    try:
        for n, (template, scale) in enumerate(steps):
            write_files(_files(tmp_path / "inline" / f"step{n}", 3, scale, template))
            writer.submit(_files(tmp_path / "helper" / f"step{n}", 3, scale, template))
        writer.drain()
        assert not writer.busy
    finally:
        writer.close()
    want, got = _texts(tmp_path / "inline"), _texts(tmp_path / "helper")
    assert len(want) == 3 * 3 * 3 + 3 * 2  # the last step has no template: no dump.json
    assert got == want
    data = json.loads(want["step2/req1/dump.json"])["data"]
    assert data["Module.b.forward.0"]["output"][0]["Max"] == -4.0 * 3  # lane 1's values, record 2


def test_a_step_the_helper_cannot_write_is_named_and_the_others_are_written(tmp_path: Path) -> None:
    template = StepTemplate(CACHE, lambda n: n.get(LANE_RECORD))
    bad = _files(tmp_path / "step0", 2, 1.0, template)
    bad.dump_paths[1] = str(tmp_path / "no-such-folder" / "dump.json")
    writer = LaneWriter()
    try:
        writer.submit(bad)
        writer.submit(_files(tmp_path / "step1", 2, 1.0, template))
        with pytest.raises(LaneWriteError) as caught:
            writer.drain()
        assert str(tmp_path / "step0") in str(caught.value)
        assert "FileNotFoundError" in str(caught.value)
        assert "no-such-folder" in str(caught.value)
        assert (tmp_path / "step1" / "req1" / "dump.json").is_file()  # the step after it was written
        writer.submit(_files(tmp_path / "step2", 2, 1.0, template))  # and the helper goes on
        writer.drain()
        assert (tmp_path / "step2" / "req0" / "construct.json").is_file()
    finally:
        writer.close()


def test_a_helper_that_ends_is_named_with_the_steps_it_did_not_write(tmp_path: Path) -> None:
    template = StepTemplate(CACHE, lambda n: n.get(LANE_RECORD))
    writer = LaneWriter()
    writer.submit(_files(tmp_path / "step0", 1, 1.0, template))
    writer.drain()
    assert writer._proc is not None
    writer._proc.kill()
    writer._proc.wait()
    writer.submit(_files(tmp_path / "step1", 1, 1.0, template))
    with pytest.raises(LaneWriteError, match=r"ended with exit code -9 .*step1.*LANE_WRITE=inline"):
        writer.drain()
    # the next step starts a new helper, which is sent the template again
    writer.submit(_files(tmp_path / "step2", 1, 1.0, template))
    writer.drain()
    writer.close()
    assert json.loads((tmp_path / "step2" / "req0" / "dump.json").read_text())["data"]


@pytest.mark.msprobe
def test_the_training_records_wait_for_the_helpers_files(tmp_path: Path, monkeypatch: Any) -> None:
    """A dumped step's ``update_actor_log.jsonl`` record is appended once its lane files are on disk
    (``dump_session.Session.log`` and ``finish_writes``), after the steps before it, in order."""
    from verl_consistency.patches.hooks.training import dump_session

    config = tmp_path / "msprobe_actor.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": "L0"}))
    monkeypatch.setenv(env.ACTOR_CONFIG, str(config))
    monkeypatch.delenv(env.RUN_DIR, raising=False)
    monkeypatch.delenv(env.LANE_WRITE, raising=False)
    dump_session.reset_for_tests()
    try:
        session = dump_session.session()
        helper = session.lane_writer()
        assert helper is not None
        template = StepTemplate(CACHE, lambda n: n.get(LANE_RECORD))
        log = session.dump_dir / records.UPDATE_ACTOR_LOG

        def record(step: int) -> records.UpdateActorRecord:
            return records.UpdateActorRecord(
                timestamp=records.now(), pid=os.getpid(), rank=0, step=step, dump_path="x",
                phase="log_prob", backend="fsdp", request_ids=["r"], num_requests=1,
            )  # fmt: skip

        helper.submit(_files(tmp_path / "step0", 2, 1.0, template))
        session.log(record(0))
        session.log(record(1))  # a step after one still being written waits too, to keep the order
        logged = log.read_bytes().splitlines() if log.exists() else []
        assert logged == []
        session.finish_writes()
        assert [orjson.loads(line)["step"] for line in log.read_bytes().splitlines()] == [0, 1]
        assert (tmp_path / "step0" / "req1" / "dump.json").is_file()
        session.log(record(2))  # nothing in flight: appended at once
        assert len(log.read_bytes().splitlines()) == 3
    finally:
        dump_session.reset_for_tests()


@pytest.mark.msprobe
def test_inline_is_the_only_other_write_mode(tmp_path: Path, monkeypatch: Any) -> None:
    from verl_consistency.patches.hooks.training import dump_session

    config = tmp_path / "msprobe_actor.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "dump")}))
    monkeypatch.setenv(env.ACTOR_CONFIG, str(config))
    monkeypatch.setenv(env.LANE_WRITE, "inline")
    dump_session.reset_for_tests()
    try:
        assert dump_session.session().lane_writer() is None
    finally:
        dump_session.reset_for_tests()
    monkeypatch.setenv(env.LANE_WRITE, "thread")
    with pytest.raises(dump_session.TrainingDumpError, match="VERL_CONSISTENCY_LANE_WRITE='thread'"):
        dump_session.Session(os.environ)


def test_a_helper_that_cannot_start_says_how_to_write_in_line(tmp_path: Path, monkeypatch: Any) -> None:
    import sys

    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    writer = LaneWriter()
    template = StepTemplate(CACHE, lambda n: n.get(LANE_RECORD))
    with pytest.raises(LaneWriteError, match=r"could not start the lane writer.*LANE_WRITE=inline"):
        writer.submit(_files(tmp_path / "step0", 1, 1.0, template))
    assert not writer.busy  # nothing was handed over
