"""The one reader of ``pins.toml``, the single source of every upstream version.

Every consumer goes through this file, so that a pin cannot be read two ways:

- Python: ``pins.get("upstream.verl")``, or ``pins.load()`` for the typed, validated view
  (:mod:`verl_consistency.contracts.pins_schema`);
- the Makefile, before any venv exists: ``python3 patches/contracts/pins.py KEY``;
- the image build, before this bundle is installed: ``docker/helpers/image_build.py`` loads this
  file from beside itself (the Dockerfile copies it there).

That is why the reading part is standard-library only and runs as a plain script.

The file holds pin *sets* (``[sets]``): the top-level tables are the default set, and a named
set lists only what it changes. Every reader gets the chosen set already laid over the
defaults, plus a ``set`` table (``name``, ``about``, ``series``), so no consumer ever needs to
know that sets exist. The set comes from ``VERL_CONSISTENCY_PIN_SET`` (its name is parsed from
``contracts/env.py``, the one home of such names), or ``--set NAME`` on the command line.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl_consistency.contracts.pins_schema import Pins


def _pins_file() -> Path:
    """``pins.toml``: beside this file (the image's helpers), or in ``patches/`` above ``contracts/``.

    The file stays in ``patches/`` (it pins what the diffs there are against); the reader lives
    with the contracts. In the source tree and an editable install that is ``../pins.toml``; in an
    installed wheel ``verl_consistency/contracts/`` sits beside ``verl_consistency/patches/``.
    """
    here = Path(__file__).resolve().parent
    candidates = (here / "pins.toml", here.parent / "pins.toml", here.parent / "patches" / "pins.toml")
    return next((c for c in candidates if c.is_file()), candidates[1])


PINS_FILE = _pins_file()


@cache
def env_name() -> str:
    """``contracts.env.PIN_SET``, from the source tree or from beside this file (the image).

    Parsed, not imported: this file runs as a plain script before the package is installed (the
    Makefile, the image build), where ``verl_consistency`` cannot be imported, and ``env.py`` stays
    the one place that spells the name.
    """
    candidate = Path(__file__).resolve().with_name("env.py")
    if candidate.is_file():
        return string_constant(candidate, "PIN_SET")
    raise RuntimeError(f"env.py is not beside {Path(__file__).resolve()}")


def string_constant(path: Path, name: str) -> str:
    """The value of a module-level ``NAME = "..."`` in ``path``, read with :mod:`ast`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise RuntimeError(f'{path}: no module-level {name} = "..." string; it names the pin-set variable')


@cache
def raw(path: Path = PINS_FILE) -> dict[str, Any]:
    """The parsed file as written, every set included (cached: each process reads it once)."""
    with path.open("rb") as fh:
        return tomllib.load(fh)


def set_names(path: Path = PINS_FILE) -> list[str]:
    return [k for k, v in raw(path).get("sets", {}).items() if isinstance(v, dict)]


def selected(path: Path = PINS_FILE, environ: dict[str, str] | None = None) -> str:
    """The set in force: ``$VERL_CONSISTENCY_PIN_SET``, else the file's ``sets.default``."""
    env = os.environ if environ is None else environ
    name = env.get(env_name(), "").strip() or raw(path).get("sets", {}).get("default", "")
    names = set_names(path)
    if name not in names:
        raise KeyError(
            f"pin set {name!r} is not in {path} (sets: {', '.join(names) or 'none'}); "
            f"set {env_name()} (or make PINS=…) to one of them"
        )
    return name


def _overlay(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _overlay(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


@cache
def _resolved(path: Path, name: str) -> dict[str, Any]:
    doc = raw(path)
    merged = {k: copy.deepcopy(v) for k, v in doc.items() if k != "sets"}
    spec = doc["sets"][name]
    _overlay(merged, {k: v for k, v in spec.items() if isinstance(v, dict)})
    merged["set"] = {"name": name, **{k: v for k, v in spec.items() if not isinstance(v, dict)}}
    return merged


def read(path: Path = PINS_FILE, set_name: str | None = None) -> dict[str, Any]:
    """The chosen set laid over the defaults, untyped. Do not mutate: it is cached."""
    return _resolved(path, set_name or selected(path))


def get(key: str, path: Path = PINS_FILE, set_name: str | None = None) -> Any:
    """Look up a dotted key (``upstream.verl``) in the set in force; a missing key names the file."""
    node: Any = read(path, set_name)
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"{key!r} is not a key of {path}")
        node = node[part]
    return node


def load(path: Path = PINS_FILE, set_name: str | None = None) -> Pins:
    """The typed view of the set in force; pydantic rejects a missing or unknown key."""
    from verl_consistency.contracts.pins_schema import Pins

    return Pins.model_validate(read(path, set_name))


def show(value: Any) -> str:
    """How the shell sees a value: lists space-separated, to splice into ``pip install``."""
    return " ".join(value) if isinstance(value, list) else str(value)


USAGE = """usage: pins.py [--set NAME] KEY [KEY...]   one value per line (lists space-separated)
       pins.py [--set NAME] --lines KEY     a list one item per line (a pip requirements file)
       pins.py [--set NAME] --json          the set in force as JSON
       pins.py --sets                       the set names, the one in force marked with *
Without --set, the set is $VERL_CONSISTENCY_PIN_SET, else the file's sets.default."""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(args) >= 2 and args[0] == "--set":
            os.environ[env_name()] = args[1]
            args = args[2:]
        if args == ["--sets"]:
            chosen = selected()
            for name in set_names():
                print(f"{'*' if name == chosen else ' '} {name}: {raw()['sets'][name].get('about', '')}")
        elif args == ["--json"]:
            print(json.dumps(read(), indent=2))
        elif len(args) == 2 and args[0] == "--lines":
            value = get(args[1])
            print("\n".join(value if isinstance(value, list) else [str(value)]))
        elif args and not args[0].startswith("-"):
            for key in args:
                print(show(get(key)))
        else:
            print(USAGE, file=sys.stderr)
            return 2
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
