"""The maps are drawn from the code: every room, every module and every command is on them.

Two maps, at two scales. README.md's "Map" (a page a newcomer reads) lists every **room**: a
package folder of the bundle (or ``bench/support``), as a table row that starts with the room's
import name in backticks. entrypoints/README.md's "Map: every module, room by room" lists, in
the room's row, each of its **modules** in backticks, and, in its picture and table, every
``verl-consistency`` **command**. A room, module or command added without a line in its map
fails here, so the maps are the tree as it is.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from verl_consistency.entrypoints.cli import app

PACKAGE_DIRS = {
    "contracts": "patches/contracts",
    "patches": "patches",
    "entrypoints": "entrypoints",
    "postprocess": "postprocess",
}
"""Import name (under ``verl_consistency``) → folder, as pyproject's ``package-dir`` maps them."""
EXTRA_ROOMS = {"bench.support": "bench/support"}
SKIP = {"__init__", "__main__"}


def rooms(repo: Path) -> dict[str, list[str]]:
    """Room name → its module names, from the folders themselves."""
    found: dict[str, list[str]] = {}
    taken = {(repo / d).resolve() for d in PACKAGE_DIRS.values()}
    for name, folder in {**PACKAGE_DIRS, **EXTRA_ROOMS}.items():
        for init in sorted((repo / folder).rglob("__init__.py")):
            pkg = init.parent
            if pkg != (repo / folder) and pkg.resolve() in taken:
                continue  # patches/contracts is its own room, not patches.contracts
            rel = pkg.relative_to(repo / folder).parts
            room = ".".join((name, *rel))
            found[room] = sorted(p.stem for p in pkg.glob("*.py") if p.stem not in SKIP)
    return {room: mods for room, mods in found.items() if mods}


ROOM_MAP = ("README.md", "## Map")
"""Where the rooms are listed: the file and its section's heading (up to the next ``## ``)."""
MODULE_MAP = ("entrypoints/README.md", "## Map: every module")
"""Where the modules and commands are listed."""


def map_section(text: str, heading: str) -> str:
    """From the line that starts with ``heading`` to the next second-level heading."""
    found = re.search(rf"^{re.escape(heading)}", text, re.M)
    if found is None:
        raise AssertionError(f"no heading {heading!r}")
    start = found.start()
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else None]


def map_rows(section: str) -> dict[str, str]:
    """Table rows of the map by their first cell's backticked name."""
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\|\s*`([\w.]+)`", line)
        if m:
            rows[m.group(1)] = line
    return rows


def rooms_missing(repo: Path, section: str) -> list[str]:
    """The rooms that have no row in ``section``."""
    rows = map_rows(section)
    return [f"room `{room}` (a table row starting with `{room}`)" for room in rooms(repo) if room not in rows]


def modules_missing(repo: Path, section: str) -> list[str]:
    """The rooms without a row, the modules missing from their room's row, and the commands
    that ``section`` does not name."""
    rows = map_rows(section)
    missing = []
    for room, modules in rooms(repo).items():
        row = rows.get(room)
        if row is None:
            missing.append(f"room `{room}` (a table row starting with `{room}`)")
            continue
        missing += [f"module `{room}.{m}`" for m in modules if f"`{m}`" not in row]
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    missing += [
        f"command `{c}`" for c in commands if not re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", section)
    ]
    return missing


def _section(repo: Path, where: tuple[str, str]) -> str:
    return map_section((repo / where[0]).read_text(encoding="utf-8"), where[1])


def test_the_readme_map_names_every_room(repo):
    missing = rooms_missing(repo, _section(repo, ROOM_MAP))
    assert not missing, f"{ROOM_MAP[0]}'s Map lacks:\n" + "\n".join(missing)


def test_the_module_map_names_every_module_and_command(repo):
    missing = modules_missing(repo, _section(repo, MODULE_MAP))
    assert not missing, f"{MODULE_MAP[0]}'s Map lacks:\n" + "\n".join(missing)


PAIRING = "postprocess.pairing"


@pytest.mark.parametrize(
    ("room_row", "modules", "expected"),
    [
        ("| `postprocess.pairing` | `discover`, `pair` | x |", ["discover", "pair"], []),
        (
            "| `postprocess.pairing` | `discover` | x |",
            ["discover", "pair"],
            ["module `postprocess.pairing.pair`"],
        ),
        (
            None,
            ["discover"],
            ["room `postprocess.pairing` (a table row starting with `postprocess.pairing`)"],
        ),
    ],
)
def test_a_module_missing_from_the_map_is_named(tmp_path, room_row, modules, expected):
    pkg = tmp_path / "postprocess" / "pairing"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "postprocess", pkg):
        (d / "__init__.py").write_text("")
    for m in modules:
        (pkg / f"{m}.py").write_text("")
    commands = " ".join(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    text = f"# x\n## Map: every module\n{commands}\n{room_row or ''}\n## Next\n"
    assert modules_missing(tmp_path, map_section(text, MODULE_MAP[1])) == expected


def test_a_room_or_command_missing_from_a_map_is_named(tmp_path):
    """The README's map fails on a missing room (not on modules: they are the module map's);
    the module map fails on a missing command."""
    pkg = tmp_path / "postprocess" / "pairing"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "postprocess", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "discover.py").write_text("")
    (tmp_path / "postprocess" / "cli.py").write_text("")
    readme = "# x\n## Map\n| `postprocess` | `postprocess/` | x |\n## Where\n| `postprocess.pairing` | y |\n"
    assert rooms_missing(tmp_path, map_section(readme, ROOM_MAP[1])) == [
        "room `postprocess.pairing` (a table row starting with `postprocess.pairing`)"
    ]
    assert rooms_missing(tmp_path, "## Map\n| `postprocess` | x |\n| `postprocess.pairing` | y |\n") == []
    commands = [c for c in typer.main.get_command(app).commands if c != "extract"]  # type: ignore[attr-defined]
    rows = "| `postprocess` | `cli` |\n| `postprocess.pairing` | `discover` |\n"
    section = f"## Map: every module\n{' '.join(commands)}\n{rows}"
    assert modules_missing(tmp_path, section) == ["command `extract`"]
