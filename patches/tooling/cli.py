"""``verl-consistency patches ...`` (also ``python -m verl_consistency.patches``)."""

from __future__ import annotations

import compileall
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from verl_consistency.contracts import pins
from verl_consistency.patches.tooling import apply, upstream

app = typer.Typer(
    help="Apply and check the upstream patch series.", no_args_is_help=True, add_completion=False
)
console = Console(stderr=True)

Component = Annotated[str, typer.Option("--component", "-c", help="verl, vllm-ascend or vllm")]
Root = Annotated[
    Path, typer.Option("--root", help="folder that holds the package (site-packages or a checkout)")
]
SetName = Annotated[
    str | None,
    typer.Option("--set", help="pin set (default: $VERL_CONSISTENCY_PIN_SET, else pins.toml's default)"),
]


def _fail(exc: Exception) -> typer.Exit:
    console.print(f"[red]error:[/red] {exc}")
    return typer.Exit(1)


def _sets(set_name: str | None) -> list[str]:
    try:
        return [pins.selected(environ={pins.env_name(): set_name})] if set_name else pins.set_names()
    except KeyError as exc:
        raise _fail(exc) from None


@app.command("list")
def list_cmd(set_name: SetName = None) -> None:
    """Print every patch of every series with its one-line summary (every set unless --set)."""
    for name in _sets(set_name):
        for component in apply.COMPONENTS:
            for p in apply.read_series(component, set_name=name):
                typer.echo(f"{name}: {component}/{p.name}: {p.summary}")


@app.command("apply")
def apply_cmd(
    component: Component,
    root: Root,
    dry_run: Annotated[bool, typer.Option(help="check only; write nothing")] = False,
    set_name: SetName = None,
) -> None:
    """Apply a series in place, all or nothing. Safe to rerun."""
    try:
        results = apply.apply_series(component, root, dry_run=dry_run, set_name=set_name)
    except apply.PatchError as exc:
        raise _fail(exc) from None
    for patch, status in results:
        typer.echo(f"{status:>16}  {component}/{patch.name}")


@app.command("verify")
def verify_cmd(component: Component, root: Root, set_name: SetName = None) -> None:
    """Exit non-zero unless every patch of the series is applied under ROOT."""
    try:
        series = apply.verify_series(component, root, set_name=set_name)
    except apply.PatchError as exc:
        raise _fail(exc) from None
    typer.echo(f"{component}: {len(series)} patch(es) applied under {root}")


@app.command("check")
def check_cmd(
    cache: Annotated[
        Path | None, typer.Option(help="download cache (default $VERL_CONSISTENCY_CACHE or ./.cache)")
    ] = None,
    keep: Annotated[
        Path | None, typer.Option(help="keep the patched trees here instead of a temp dir")
    ] = None,
    set_name: SetName = None,
) -> None:
    """Download the pinned releases, apply every series to fresh copies, byte-compile, verify.

    Every pin set is checked unless --set names one: a set's patches must keep applying to its
    pristine releases whichever set a user runs.
    """
    with tempfile.TemporaryDirectory(prefix="vc-check-") as tmp:
        for name in _sets(set_name):
            _check_set(name, cache, (keep or Path(tmp)) / name)
    typer.echo("check-patches: OK")


def _check_set(name: str, cache: Path | None, base: Path) -> None:
    p = pins.load(set_name=name)
    typer.echo(f"[{name}] {p.set.about}")
    typer.echo("pinned: " + ", ".join(f"{k} {v}" for k, v in p.upstream.model_dump().items()))
    for component in apply.COMPONENTS:
        dist = upstream.fetch_wheel(component, upstream.cache_dir(cache) if cache else None, set_name=name)
        tree = upstream.unpack(dist, base / component)
        try:
            results = apply.apply_series(component, tree, set_name=name)
            apply.verify_series(component, tree, set_name=name)
        except apply.PatchError as exc:
            raise _fail(exc) from None
        touched = sorted({t for patch, _ in results for t in patch.targets})
        for rel in touched:
            if rel.endswith(".py") and not compileall.compile_file(str(tree / rel), quiet=2):
                msg = f"{name}: {component}: {rel} does not byte-compile after patching"
                raise _fail(apply.PatchError(msg))
        typer.echo(f"  {component} ({dist.name}):")
        for patch, status in results:
            typer.echo(f"    {status}: {patch.name} — {patch.summary}")
        if not results:
            typer.echo("    (empty series)")
