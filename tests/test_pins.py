"""The pins file is the single source of upstream versions, and readable from every consumer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from verl_consistency.contracts import pins


def test_pins_load_and_match_the_upstream_facts():
    p = pins.load()
    assert p.upstream.verl == "0.8.0"
    assert p.upstream.vllm_ascend == p.upstream.vllm == "0.18.0"
    assert p.upstream.mindstudio_probe == "26.2.0"
    assert p.image.base.a2.endswith(f":v{p.upstream.vllm_ascend}")
    assert p.image.base.a3 == p.image.base.a2 + "-a3"


def test_pins_cli_prints_values_and_lists():
    out = subprocess.run(
        [sys.executable, "-m", "verl_consistency.contracts.pins", "upstream.verl", "install.verl_extras"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert out[0] == "0.8.0"
    assert "pyarrow<=24" in out[1].split()


def test_pins_cli_rejects_unknown_key():
    res = subprocess.run(
        [sys.executable, "-m", "verl_consistency.contracts.pins", "upstream.nope"],
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
    with pytest.raises(ValueError, match="surprise"):
        pins.load(bad)


def test_one_reader_of_pins_toml(repo):
    """Only patches/contracts/pins.py opens pins.toml.

    The Makefile, the Dockerfile and Python go through it.
    """
    readers = []
    for path in repo.rglob("*"):
        if (
            any(part in {".git", ".venv", ".cache", "node_modules"} for part in path.parts)
            or not path.is_file()
        ):
            continue
        if path.suffix not in {".py", ".mk", ""} and path.name not in {"Makefile", "Dockerfile"}:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        if "tomllib" in code and "pins.toml" in code and path.name not in {"pins.py", "test_pins.py"}:
            readers.append(str(path.relative_to(repo)))
    assert readers == [], f"read pins.toml through patches/contracts/pins.py instead: {readers}"
    dockerfile = (repo / "docker/Dockerfile").read_text()
    assert "helpers/pins.py" in dockerfile
    assert "pins.py" in (repo / "Makefile").read_text()


def test_pins_script_runs_without_the_package(tmp_path, repo):
    """The Makefile runs patches/contracts/pins.py with the host's Python before any venv exists."""
    res = subprocess.run(
        [
            sys.executable,
            "-S",
            "-I",
            str(repo / "patches/contracts/pins.py"),
            "--lines",
            "install.verl_extras",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "pyarrow<=24" in res.stdout.splitlines()


def test_next_set_overlays_only_what_it_changes():
    cur, nxt = pins.load(set_name="current"), pins.load(set_name="next")
    assert (cur.set.name, cur.set.series) == ("current", "current")
    assert (nxt.set.name, nxt.set.series) == ("next", "next")
    assert nxt.upstream.verl == "0.9.1"
    assert nxt.upstream.vllm_ascend.startswith(nxt.upstream.vllm)
    assert nxt.image.base.a2 == f"quay.io/ascend/vllm-ascend:v{nxt.upstream.vllm}"
    assert nxt.image.base.a3 == nxt.image.base.a2 + "-a3"
    # not overridden by next: inherited from the current tables
    assert nxt.kuberay == cur.kuberay
    assert nxt.install.megatron_core == cur.install.megatron_core
    assert nxt.image.vllm_ascend_src == cur.image.vllm_ascend_src


def test_the_environment_picks_the_set_and_the_default_is_current(monkeypatch):
    from verl_consistency.contracts.env import PIN_SET

    assert pins.env_name() == PIN_SET
    monkeypatch.delenv(PIN_SET, raising=False)
    assert pins.selected() == "current"
    monkeypatch.setenv(PIN_SET, "next")
    assert pins.get("upstream.verl") == "0.9.1"
    monkeypatch.setenv(PIN_SET, "nope")
    with pytest.raises(KeyError, match=r"pin set 'nope'.*current, next"):
        pins.get("upstream.verl")


def test_pins_cli_takes_a_set_and_lists_the_sets():
    run = [sys.executable, "-m", "verl_consistency.contracts.pins"]
    out = subprocess.run([*run, "--set", "next", "upstream.verl"], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "0.9.1"
    listed = subprocess.run([*run, "--set", "next", "--sets"], check=True, capture_output=True, text=True)
    assert [line.split(":")[0] for line in listed.stdout.splitlines()] == ["  current", "* next"]
    bad = subprocess.run([*run, "--set", "later", "upstream.verl"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "pin set 'later'" in bad.stderr


def test_makefile_pins_follow_PINS(repo):
    out = subprocess.run(
        ["make", "-s", "pins", "PINS=next"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    assert '"verl": "0.9.1"' in out
    assert "* next" in out


def test_pins_script_beside_env_py_reads_the_set_variable(tmp_path, repo):
    """The image's layout: pins.py, pins.toml and contracts/env.py copied side by side."""
    from verl_consistency.contracts.env import PIN_SET

    for rel in ("patches/contracts/pins.py", "patches/pins.toml", "patches/contracts/env.py"):
        (tmp_path / rel.rsplit("/", 1)[1]).write_bytes((repo / rel).read_bytes())
    res = subprocess.run(
        [sys.executable, "-S", "-I", str(tmp_path / "pins.py"), "upstream.verl"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={PIN_SET: "next"},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0.9.1"


def test_the_set_variable_name_is_parsed_and_a_missing_one_named(tmp_path):
    env_py = tmp_path / "env.py"
    env_py.write_text('"""doc"""\nOTHER = "X"\nPIN_SET: str = "typed"\nPIN_SET = "THE_NAME"\n')
    assert pins.string_constant(env_py, "PIN_SET") == "THE_NAME"
    env_py.write_text('PIN_SET = f"{1}"\n')
    with pytest.raises(RuntimeError, match=r"env\.py: no module-level PIN_SET"):
        pins.string_constant(env_py, "PIN_SET")
