"""Every command's ``--help`` reads right: a flag shows no value, and ``--phase`` says what each phase is.

typer's rich help prints a value type beside each option, and did so for flags too
(``--dry-run <bool>``), as if they took a value; ``entrypoints/cli.FlagHelpGroup`` leaves them
bare. These tests read the help as a user sees it (rich panels, a terminal wide enough that no
row wraps) for every command and sub-command the app registers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer
from typer.testing import CliRunner

from verl_consistency.contracts.env import DumpPhase
from verl_consistency.entrypoints.cli import app

WIDE = {"COLUMNS": "300", "NO_COLOR": "1", "TERM": "dumb"}
_ROW = re.compile(r"^\W*(--[a-z0-9][a-z0-9-]*)(?:\s+(--no-[a-z0-9-]+|-[a-zA-Z]))?\s+(<[^>]*>)?")


def command_paths() -> Iterator[tuple[str, ...]]:
    """The root, every command and every sub-command of a group, as argv prefixes."""
    yield ()
    root = typer.main.get_command(app)
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        yield (name,)
        for sub in getattr(cmd, "commands", {}):
            yield (name, sub)


def help_rows(path: tuple[str, ...]) -> dict[str, str | None]:
    """Each option's row in ``<path> --help``: its value placeholder, or None for none."""
    res = CliRunner().invoke(app, [*path, "--help"], env=WIDE)
    assert res.exit_code == 0, res.output
    rows = {}
    for line in res.output.splitlines():
        m = _ROW.match(line)
        if m:
            rows[m.group(1)] = m.group(3)
    return rows


def flags(path: tuple[str, ...]) -> set[str]:
    """The options of ``path`` that take no value, from the command itself, and ``--help``."""
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return {
        "--help",
        *(o for p in cmd.params if getattr(p, "is_flag", False) for o in p.opts if o.startswith("--")),
    }


@pytest.mark.parametrize("path", list(command_paths()), ids=lambda p: " ".join(p) or "root")
def test_a_flag_shows_no_value(path):
    rows = help_rows(path)
    names = flags(path)
    missing = names - rows.keys()
    assert not missing, f"`{' '.join(path)} --help` shows no row for {missing}"
    valued = {o: rows[o] for o in names if rows[o] is not None}
    assert not valued, f"`verl-consistency {' '.join(path)} --help` shows a value for the flags {valued}"


def test_an_option_with_a_value_still_shows_it():
    rows = help_rows(("run",))
    assert rows["--phase"] == "<auto|log_prob|update_actor|all>"
    assert rows["--dry-run"] is None
    assert rows["--json"] is None


def test_run_help_says_what_each_phase_dumps():
    text = " ".join(CliRunner().invoke(app, ["run", "--help"], env=WIDE).output.split())
    for phase, words in {
        DumpPhase.LOG_PROB: "old log-probs",
        DumpPhase.UPDATE_ACTOR: "forward and backward",
        DumpPhase.ALL: "both",
    }.items():
        assert re.search(rf"{phase.value}: [^.]*{words}", text), (
            f"`run --help` does not say what {phase} dumps"
        )


def test_a_flag_still_takes_no_value(tmp_path):
    """Only the help changed: `--dry-run --json` still parse as two flags."""
    ok = CliRunner().invoke(app, ["run", "fully-async", "--dry-run", "--json", f"--dump-root={tmp_path}"])
    assert ok.exit_code == 0, ok.output
    assert '"argv"' in ok.output
