"""contracts.atomic: whole file or old file, the mode asked for, no temp file left."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from verl_consistency.contracts.atomic import atomic_path, write_bytes_atomic, write_json_atomic


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_json_lands_whole_with_mode_0644_and_folders_made(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "config.json"
    write_json_atomic(target, {"task": "statistics", "rank": []})
    assert target.read_text() == '{\n  "task": "statistics",\n  "rank": []\n}\n'
    assert json.loads(target.read_text()) == {"task": "statistics", "rank": []}
    assert _mode(target) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["config.json"]


def test_mode_none_keeps_the_private_temp_mode(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    write_bytes_atomic(target, b"{}", mode=None)
    assert _mode(target) == 0o600


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    target.write_text("old\n")

    def half_write() -> None:
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("half way")

    with pytest.raises(RuntimeError, match="half way"):
        half_write()
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
