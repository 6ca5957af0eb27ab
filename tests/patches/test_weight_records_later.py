"""The weight check's records are written off the sync's path (issue 42): the sync launches the
sums, one writer thread per process reads them back from the device and writes the record.

Why it matters: reading the prints waits for the device; on a GPU that wait was about half of the
check's time, and the sync would hold for it. These tests drive the trainer-side hook
(``weight_export.exporting``) as patch 0007 does and block the read, so they fail if the sync's
own thread reads or writes."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from verl_consistency.contracts import env
from verl_consistency.contracts.weight_records import WEIGHTS_DIR, WeightSyncRecord
from verl_consistency.patches.hooks.training import weight_export
from verl_consistency.patches.hooks.weights import fingerprint, sync_log
from verl_consistency.postprocess.compare.token_level import BadLine, read_models


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(env.RUN_DIR, str(tmp_path))
    monkeypatch.delenv(env.WEIGHT_CHECK, raising=False)
    monkeypatch.delenv(env.WEIGHT_CHECK_ARRIVALS, raising=False)
    return tmp_path / WEIGHTS_DIR


def _stream() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [("a.weight", torch.randn(8, 4)), ("a.bias", torch.randn(8))]


def _records(folder: Path) -> list[WeightSyncRecord]:
    bad: list[BadLine] = []
    found = [
        r for log in sorted(folder.glob("export-*.jsonl")) for r in read_models(log, WeightSyncRecord, bad)
    ]
    assert bad == []
    return found


def test_the_sync_goes_on_while_the_writer_reads_and_writes(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, readers = threading.Event(), []
    read = fingerprint.Pending.read

    def held_read(self: fingerprint.Pending) -> dict[str, object]:
        readers.append(threading.current_thread().name)
        assert gate.wait(30), "the test never let the read go on"
        return read(self)

    monkeypatch.setattr(fingerprint.Pending, "read", held_read)
    stream = _stream()
    assert list(weight_export.exporting(iter(stream), 3, "bfloat16")) == stream  # returns with the read held
    assert _records(folder) == []  # nothing written on the sync's thread
    gate.set()
    sync_log.drain()
    (record,) = _records(folder)
    assert readers == [readers[0]]
    assert readers[0].startswith("verl-consistency-weights")
    assert record.version == 3
    assert record.read_s is not None
    assert record.tensors["a.weight"] == fingerprint.fingerprint(stream[0][1], torch.bfloat16)


def test_without_a_device_event_the_sync_reads_itself(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An accelerator whose torch module has no Event (none known): the prints are read and the
    record written on the sync's thread, as before, rather than read where the sums may not be done."""
    monkeypatch.setattr(fingerprint, "_events", lambda by_device: None)
    list(weight_export.exporting(iter(_stream()), 1, "bfloat16"))
    assert [r.version for r in _records(folder)] == [1]  # written before any drain


def test_a_record_that_fails_is_said_and_the_sync_goes_on(
    folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(self: fingerprint.Pending) -> dict[str, object]:
        raise RuntimeError("device lost")

    monkeypatch.setattr(fingerprint.Pending, "read", broken)
    stream = _stream()
    assert list(weight_export.exporting(iter(stream), 2, "bfloat16")) == stream
    sync_log.drain()
    assert _records(folder) == []
    err = capsys.readouterr().err
    assert "weight check: a record for" in err
    assert "device lost" in err
