"""The default msprobe configs that the image bakes in (``verl-consistency msprobe-configs``).

They start from the config that mindstudio-probe itself ships (``msprobe/config.json``), so
that a new msprobe release brings its own keys and defaults, and change only what the
consistency check needs: the recipe's statistics dump at ``L0`` (module level: what the
postprocess pairs and compares), and a ``dump_path`` under the dump root in the
``rollout/``/``actor/`` folders of ``verl_consistency.layout``. ``verl-consistency run`` writes
per-run copies into the run folder; these defaults are for launching the recipe by hand.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from verl_consistency.layout import ACTOR_CONFIG, ACTOR_DIR, DEFAULT_DUMP_ROOT, ROLLOUT_CONFIG, ROLLOUT_DIR

Side = Literal["rollout", "actor"]

FILES: dict[Side, str] = {"rollout": Path(ROLLOUT_CONFIG).name, "actor": Path(ACTOR_CONFIG).name}
"""File names, the same as in a run folder's ``config/``."""

DEFAULT_RUN = "default"
"""Run folder under the dump root that the baked-in configs dump into."""


def shipped_config() -> dict[str, Any]:
    """msprobe's own default config, read from the installed mindstudio-probe.

    Found with ``find_spec`` rather than imported: msprobe's ``__init__`` installs a
    tensorflow stub into ``sys.modules``, a side effect this command does not need.
    """
    spec = importlib.util.find_spec("msprobe")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("mindstudio-probe is not installed: pip install mindstudio-probe (see pins.toml)")
    text = (Path(spec.submodule_search_locations[0]) / "config.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def default_config(side: Side, dump_root: Path = DEFAULT_DUMP_ROOT) -> dict[str, Any]:
    cfg = shipped_config()
    cfg["task"] = "statistics"
    cfg["level"] = "L0"
    cfg["dump_path"] = str(dump_root / DEFAULT_RUN / (ROLLOUT_DIR if side == "rollout" else ACTOR_DIR))
    return cfg


def write_defaults(out_dir: Path, dump_root: Path = DEFAULT_DUMP_ROOT) -> list[Path]:
    """Write both configs into ``out_dir`` atomically; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for side, name in FILES.items():
        target = out_dir / name
        tmp = target.with_name(f".{name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(default_config(side, dump_root), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, target)
        written.append(target)
    return written


def cli(
    out: Annotated[Path, typer.Option(help="folder to write both configs into")],
) -> None:
    """Write the default rollout and actor msprobe configs (what the image bakes in)."""
    for path in write_defaults(out):
        typer.echo(path)
