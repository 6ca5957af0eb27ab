"""The pins file is the single source of upstream versions, and readable from every consumer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from verl_consistency.patches import pins


def test_pins_load_and_match_the_upstream_facts():
    p = pins.load()
    assert p.upstream.verl == "0.8.0"
    assert p.upstream.vllm_ascend == p.upstream.vllm == "0.18.0"
    assert p.upstream.mindstudio_probe == "26.2.0"
    assert p.image.base.a2.endswith(f":v{p.upstream.vllm_ascend}")
    assert p.image.base.a3 == p.image.base.a2 + "-a3"


def test_pins_cli_prints_values_and_lists():
    out = subprocess.run(
        [sys.executable, "-m", "verl_consistency.patches.pins", "upstream.verl", "install.verl_extras"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert out[0] == "0.8.0"
    assert "pyarrow<=24" in out[1].split()


def test_pins_cli_rejects_unknown_key():
    res = subprocess.run(
        [sys.executable, "-m", "verl_consistency.patches.pins", "upstream.nope"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert "upstream.nope" in res.stderr


def test_makefile_reads_the_same_pins(repo):
    out = subprocess.run(["make", "-s", "pins"], cwd=repo, check=True, capture_output=True, text=True).stdout
    assert '"verl": "0.8.0"' in out


@pytest.mark.parametrize("key", ["upstream", "image", "install", "kuberay"])
def test_unknown_fields_are_refused(tmp_path, key):
    src = pins.PINS_FILE.read_text()
    bad = tmp_path / "pins.toml"
    bad.write_text(src.replace(f"[{key}]\n", f"[{key}]\nsurprise = 1\n", 1))
    pins.load.cache_clear()
    try:
        with pytest.raises(ValueError, match="surprise"):
            pins.load(bad)
    finally:
        pins.load.cache_clear()
