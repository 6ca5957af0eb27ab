"""The loopback clusters' ports (``tests/k8s/raycluster.py``): two clusters on one host, as CI's two
sets' lanes start them side by side, never get the same port; a port in use is never handed out."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.k8s import raycluster
from tests.k8s.raycluster import PortPool


@pytest.fixture
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(raycluster, "PORT_LOCKS", tmp_path / "locks")
    return tmp_path / "locks"


def test_two_pools_hold_disjoint_ports_until_released(locks: Path) -> None:
    a, b = PortPool(), PortPool()
    mine = {a.take() for _ in range(40)}
    theirs = {b.take() for _ in range(40)}
    assert len(mine) == len(theirs) == 40
    assert not mine & theirs
    assert all(p in raycluster.PORTS for p in mine | theirs)
    assert all(p >= 20000 for p in mine), "outside Ray's worker ports"
    a.release()
    b.release()
    assert not a.held
    assert not b.held


def test_a_port_locked_by_another_process_is_not_handed_out(
    locks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = PortPool()
    port = first.take()  # a port free now
    first.release()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import fcntl, os, sys, time
                fd = os.open({str(locks / f"{port}.lock")!r}, os.O_CREAT | os.O_RDWR)
                fcntl.flock(fd, fcntl.LOCK_EX)
                print("held", flush=True)
                time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(raycluster, "PORTS", range(port, port + 1))
        with pytest.raises(RuntimeError, match="no free port"):
            PortPool().take()
    finally:
        holder.kill()
        holder.wait()
    again = PortPool()
    assert again.take() == port, "free again once its holder is gone"
    again.release()


def test_a_port_bound_without_a_lock_is_not_handed_out(locks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        monkeypatch.setattr(raycluster, "PORTS", range(port, port + 1))
        with pytest.raises(RuntimeError, match="no free port"):
            PortPool().take()
