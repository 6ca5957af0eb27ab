"""The one reader of ``pins.toml``, the single source of every upstream version.

Every consumer goes through this file, so that a pin cannot be read two ways:

- Python: ``pins.get("upstream.verl")``, or ``pins.load()`` for the typed, validated view
  (:mod:`verl_consistency.patches.pins_schema`);
- the Makefile, before any venv exists: ``python3 patches/pins.py KEY``;
- the image build, before this bundle is installed: ``docker/helpers/image_build.py`` loads this
  file from beside itself (the Dockerfile copies it there).

That is why the reading part is standard-library only and runs as a plain script.
"""

from __future__ import annotations

import json
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl_consistency.patches.pins_schema import Pins

PINS_FILE = Path(__file__).with_name("pins.toml")


@cache
def read(path: Path = PINS_FILE) -> dict[str, Any]:
    """The parsed file, untyped (cached: each process reads it once)."""
    with path.open("rb") as fh:
        return tomllib.load(fh)


def get(key: str, path: Path = PINS_FILE) -> Any:
    """Look up a dotted key (``upstream.verl``); a missing key names the file."""
    node: Any = read(path)
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"{key!r} is not a key of {path}")
        node = node[part]
    return node


def load(path: Path = PINS_FILE) -> Pins:
    """The typed view; pydantic rejects a missing or unknown key."""
    from verl_consistency.patches.pins_schema import Pins

    return Pins.model_validate(read(path))


def show(value: Any) -> str:
    """How the shell sees a value: lists space-separated, to splice into ``pip install``."""
    return " ".join(value) if isinstance(value, list) else str(value)


USAGE = """usage: pins.py KEY [KEY...]   one value per line (lists space-separated)
       pins.py --lines KEY     a list one item per line (a pip requirements file)
       pins.py --json          the whole file as JSON"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if args == ["--json"]:
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
