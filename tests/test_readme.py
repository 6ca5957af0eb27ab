"""The README documents every command option, every required override and every refusal.

The tables it shows are written by hand for readers; this test keeps them from drifting
from the code that enforces them (``entrypoints/run/overrides.py`` and the typer commands).
"""

from __future__ import annotations

import re

import pytest
import typer

from verl_consistency.entrypoints.cli import app
from verl_consistency.entrypoints.run import overrides

COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def readme(repo) -> str:
    return (repo / "README.md").read_text(encoding="utf-8")


def _options(name: str) -> list[str]:
    return [o for p in COMMANDS[name].params for o in getattr(p, "opts", []) if o.startswith("--")]


@pytest.mark.parametrize("command", ["run", "postprocess", "wait-rayjob", "msprobe-configs", "demo"])
def test_every_option_is_documented(readme, command):
    missing = [o for o in _options(command) if f"`{o}" not in readme]
    assert not missing, f"README.md does not document `verl-consistency {command}` options {missing}"


def test_every_required_override_and_refusal_is_documented(readme, repo):
    """The default (current) set's rows are in README.md; rows only another pin set has (verl 0.9's
    V1 trainer) are in entrypoints/README.md, which documents the sets side by side."""
    rows = [*overrides.REQUIRED, *overrides.REFUSALS]
    keys = [r.key for r in rows if overrides.CURRENT in r.sets]
    missing = [k for k in keys if k.lstrip("+") not in readme]
    assert not missing, f"README.md does not mention {missing} (entrypoints/run/overrides.py)"
    entry = (repo / "entrypoints" / "README.md").read_text(encoding="utf-8")
    other = [r.key for r in rows if overrides.CURRENT not in r.sets]
    missing = [k for k in other if f"`{k.lstrip('+')}" not in entry]
    assert not missing, f"entrypoints/README.md does not mention {missing} (entrypoints/run/overrides.py)"


def test_every_environment_variable_is_documented(readme):
    missing = [v.name for v in overrides.ENV if f"`{v.name}`" not in readme]
    assert not missing, f"README.md does not document {missing}"


def test_the_first_lines_give_the_build_and_test_commands(readme):
    head = readme.splitlines()[:8]
    starts = [line.split()[1] for line in head if line.startswith("make ")]
    assert starts[:3] == ["demo", "test", "image"], "the first commands are make demo, make test, make image"


def test_key_make_targets_are_in_help_and_readme(repo, readme):
    import subprocess

    out = subprocess.run(["make", "-s", "help"], cwd=repo, check=True, capture_output=True, text=True).stdout
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    targets = [line.split()[0] for line in plain.splitlines() if line.strip()]
    for needed in (
        "image",
        "image-a3",
        "test",
        "check-patches",
        "download-bundle",
        "bench",
        "demo",
        "demo-venv",
        "check-model",
    ):
        assert needed in targets, f"`make help` does not list {needed}"
        assert f"make {needed}" in readme, f"README.md does not show `make {needed}`"


def test_every_command_is_in_the_commands_table(readme):
    missing = [name for name in COMMANDS if f"`verl-consistency {name}" not in readme]
    assert not missing, f"README.md's Commands table lacks {missing}"
