"""The default msprobe configs that the image bakes in (``verl-consistency msprobe-configs``).

They come from the same option set as every run's configs (``msprobe_config.DumpOptions``,
defaults: the recipe's statistics dump at ``L0``), so the baked-in files and a run's files
cannot drift. Only the ``dump_path`` differs: a ``default`` run folder under the dump root, in
the ``rollout/``/``actor/`` folders of ``verl_consistency.contracts.layout``. ``verl-consistency run``
writes per-run copies into the run folder; these defaults are for launching the recipe by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from verl_consistency.contracts.atomic import write_json_atomic
from verl_consistency.contracts.layout import DEFAULT_DUMP_ROOT, RunLayout
from verl_consistency.entrypoints.msprobe.config import DumpOptions, build

DEFAULT_RUN = "default"
"""Run folder under the dump root that the baked-in configs dump into."""


def default_configs(dump_root: Path = DEFAULT_DUMP_ROOT) -> dict[Path, dict[str, Any]]:
    """File name (as in a run folder's ``config/``) → config, for both sides."""
    layout = RunLayout(dump_root, DEFAULT_RUN)
    configs = build(layout, DumpOptions())
    return {
        layout.rollout_config.relative_to(layout.run_dir): configs.rollout.to_json(),
        layout.actor_config.relative_to(layout.run_dir): configs.actor.to_json(),
    }


def write_defaults(out_dir: Path, dump_root: Path = DEFAULT_DUMP_ROOT) -> list[Path]:
    """Write both configs into ``out_dir`` atomically; return their paths."""
    written = []
    for rel, cfg in default_configs(dump_root).items():
        target = out_dir / rel.name
        write_json_atomic(target, cfg)
        written.append(target)
    return written


def cli(
    out: Annotated[Path, typer.Option(help="folder to write both configs into")],
) -> None:
    """Write the default rollout and actor msprobe configs (what the image bakes in)."""
    for path in write_defaults(out):
        typer.echo(path)
