"""`make check-patches` applies every set's series to that set's pristine releases and prints them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from verl_consistency.contracts import pins
from verl_consistency.patches.tooling import apply

pytestmark = [pytest.mark.upstream, pytest.mark.timeout(900)]


def test_check_applies_and_prints_both_sets(repo):
    res = subprocess.run(
        [sys.executable, "-m", "verl_consistency.patches", "check"],
        cwd=repo,
        env={**os.environ, "COLUMNS": "1000"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert out.rstrip().endswith("check-patches: OK")
    sections = {}
    for name in pins.set_names():
        header = f"[{name}] {pins.load(set_name=name).set.about}"
        assert header in out, f"no section for set {name!r}"
        sections[name] = out.index(header)
    assert sorted(sections, key=sections.get) == pins.set_names()
    for name in pins.set_names():
        start = sections[name]
        later = [i for i in sections.values() if i > start]
        body = out[start : min(later) if later else len(out)]
        p = pins.load(set_name=name)
        assert f"verl {p.upstream.verl}, vllm {p.upstream.vllm}, vllm_ascend {p.upstream.vllm_ascend}" in body
        for component in apply.COMPONENTS:
            for patch in apply.read_series(component, set_name=name):
                assert f"applied: {patch.name} — {patch.summary}" in body, (name, component, patch.name)


def test_check_one_set_and_refuse_an_unknown_one(repo):
    one = subprocess.run(
        [sys.executable, "-m", "verl_consistency.patches", "list", "--set", "next"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert one.returncode == 0, one.stderr
    assert all(line.startswith("next: ") for line in one.stdout.splitlines())
    bad = subprocess.run(
        [sys.executable, "-m", "verl_consistency.patches", "check", "--set", "later"],
        cwd=repo,
        env={**os.environ, "COLUMNS": "1000"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1
    assert "pin set 'later'" in bad.stderr
