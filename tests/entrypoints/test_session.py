"""``engines.session``: two engine processes that work at once, answered in any order.

A weight sync runs both ends at once and the trainer's sender blocks until vLLM has loaded each
bucket: when vLLM fails, the trainer never answers. ``answers`` must then raise vLLM's failure at
once and end the blocked process, not wait on it (verl 0.9.1 on CPU hung the flow for 15 minutes
before it did). The processes are ``session_standin.py``: the real protocol, no engine.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from verl_consistency.entrypoints.engines.session import Session, answers
from verl_consistency.entrypoints.engines.stage_runner import StageError

REPO = Path(__file__).resolve().parents[2]
STANDIN = "tests.entrypoints.session_standin"


def _session(role: str, tmp_path: Path) -> Session:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return Session(STANDIN, role, env, tmp_path / f"{role}.log")


def test_both_answers_come_back_in_the_sessions_order(tmp_path: Path) -> None:
    a, b = _session("a", tmp_path), _session("b", tmp_path)
    try:
        a.tell("echo", n=1)
        b.tell("echo", n=2)
        assert answers(a, b) == [{"echo": {"n": 1}}, {"echo": {"n": 2}}]
        b.tell("echo", n=3)
        a.tell("echo", n=4)
        assert answers(b, a) == [{"echo": {"n": 3}}, {"echo": {"n": 4}}]
    finally:
        a.close(timeout=10)
        b.close(timeout=10)


def test_a_failure_raises_at_once_and_ends_the_blocked_peer(tmp_path: Path) -> None:
    sender, receiver = _session("sender", tmp_path), _session("receiver", tmp_path)
    try:
        sender.tell("block")
        receiver.tell("fail", bucket=0)
        t0 = time.monotonic()
        with pytest.raises(StageError, match=r"the receiver session failed(.|\n)*fails as asked"):
            answers(sender, receiver)
        assert time.monotonic() - t0 < 30
        assert sender.proc.poll() is not None, "the blocked sender was left running"
    finally:
        sender.kill()
        receiver.close(timeout=10)


def test_a_process_that_dies_is_a_failure_too(tmp_path: Path) -> None:
    waiting, dying = _session("waiting", tmp_path), _session("dying", tmp_path)
    try:
        waiting.tell("block")
        dying.proc.kill()
        dying.proc.wait()
        with pytest.raises(StageError, match="the dying session exited"):
            answers(waiting, dying)
        assert waiting.proc.poll() is not None
    finally:
        waiting.kill()
