"""The ``verl-consistency`` command: one typer app, one sub-command per stage.

Each stage owns its own module; this file only wires them together, so that adding a stage
never touches another stage's code.
"""

from __future__ import annotations

import typer

from verl_consistency.contracts import __version__, pins
from verl_consistency.entrypoints.check import command as check
from verl_consistency.entrypoints.demo import command as demo
from verl_consistency.entrypoints.kuberay.rayjob_wait import wait_rayjob_cmd
from verl_consistency.entrypoints.msprobe import defaults as msprobe_defaults
from verl_consistency.entrypoints.preflight.command import preflight_cmd
from verl_consistency.entrypoints.run import command as run_cmd
from verl_consistency.patches.cli import app as patches_app
from verl_consistency.postprocess import cli as postprocess_cli

app = typer.Typer(
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
app.command("check")(check.check_cmd)
app.command("preflight")(preflight_cmd)


def main() -> int:
    app()
    return 0
