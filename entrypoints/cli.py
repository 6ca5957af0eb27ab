"""The ``verl-consistency`` command: one typer app, one sub-command per stage.

Each stage owns its own module; this file only wires them together, so that adding a stage
never touches another stage's code.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from verl_consistency.contracts import __version__, pins
from verl_consistency.entrypoints.check import command as check
from verl_consistency.entrypoints.demo import command as demo
from verl_consistency.entrypoints.demo import weight_sync as demo_weight_sync
from verl_consistency.entrypoints.kuberay.rayjob_wait import wait_rayjob_cmd
from verl_consistency.entrypoints.load.command import load_cmd
from verl_consistency.entrypoints.msprobe import defaults as msprobe_defaults
from verl_consistency.entrypoints.preflight.command import preflight_cmd
from verl_consistency.entrypoints.run import command as run_cmd
from verl_consistency.patches.tooling.cli import app as patches_app
from verl_consistency.postprocess import cli as postprocess_cli


def _bare_flags(command: Any, ctx: Any) -> None:
    """Give each flag of ``command`` (and of its sub-commands) an empty value placeholder.

    Typed ``Any``: recent typer carries its own private copy of click's classes, older typer
    uses click's; this works on both.
    """
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False):
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        _bare_flags(sub, ctx)


class FlagHelpGroup(TyperGroup):
    """The root command: a flag's help row shows the flag alone (`--dry-run`, not `--dry-run <bool>`).

    typer's rich help prints a value type beside every option, flags too (`--json <bool>`, even
    `--help <bool>`), which reads as if the flag took a value; its plain help leaves flags bare.
    The rich panel prints a parameter's ``metavar`` in that column when it has one, so every flag
    of every command gets an empty one, here, where each command is looked up (sub-groups such as
    ``patches`` included): the stages keep declaring their options as typer does. Parsing is
    untouched: a flag still takes no value.
    """

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _bare_flags(command, ctx)
        return command

    def get_params(self, ctx: Any) -> Any:
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False):
                param.metavar = ""
        return params


app = typer.Typer(
    cls=FlagHelpGroup,
    name="verl-consistency",
    help="Collect, pair and compare vLLM-vs-training msprobe dumps for verl on Ascend NPUs.",
    no_args_is_help=True,
    add_completion=False,
)


app.add_typer(patches_app, name="patches")
app.command("msprobe-configs")(msprobe_defaults.cli)


@app.callback()
def _root() -> None:
    """Collect, pair and compare vLLM-vs-training msprobe dumps for verl on Ascend NPUs."""


@app.command("version")
def version_cmd() -> None:
    """Print the bundle version, the pin set in force and its upstream versions."""
    p = pins.load()
    typer.echo(f"verl-consistency {__version__}")
    typer.echo(f"  pin set {p.set.name} ({p.set.about})")
    for name, value in p.upstream.model_dump().items():
        typer.echo(f"  {name} {value}")


run_cmd.register(app)
postprocess_cli.register(app)
app.command("wait-rayjob")(wait_rayjob_cmd)
app.command("demo")(demo.demo_cmd)
app.command("demo-weight-sync")(demo_weight_sync.demo_weight_sync_cmd)
app.command("check")(check.check_cmd)
app.command("load")(load_cmd)
app.command("preflight")(preflight_cmd)


def main() -> int:
    app()
    return 0
