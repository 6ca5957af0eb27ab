"""README's "Map" is drawn from the code: every room, every module and every command is on it.

A room is a package folder of the bundle (or ``bench/support``); its row in the map's table
starts with the room's import name in backticks and names each of its modules in backticks. The
map's picture and table together name every ``verl-consistency`` command. A module or command
added without a line in the map fails here, so the map a newcomer reads is the tree as it is.
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


def map_section(readme: str) -> str:
    start = readme.index("### Map")
    end = readme.find("\n## ", start)
    return readme[start : end if end != -1 else None]


def map_rows(section: str) -> dict[str, str]:
    """Table rows of the map by their first cell's backticked name."""
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\|\s*`([\w.]+)`", line)
        if m:
            rows[m.group(1)] = line
    return rows


def missing_from_map(repo: Path, readme: str) -> list[str]:
    section = map_section(readme)
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


def test_the_map_names_every_room_module_and_command(repo):
    readme = (repo / "README.md").read_text(encoding="utf-8")
    missing = missing_from_map(repo, readme)
    assert not missing, "README.md's Map lacks:\n" + "\n".join(missing)


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
    readme = f"# x\n### Map\n{commands}\n{room_row or ''}\n## Next\n"
    assert missing_from_map(tmp_path, readme) == expected
