"""``verl-consistency patches ...`` (also ``python -m verl_consistency.patches``)."""

from __future__ import annotations

import compileall
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from verl_consistency.patches import apply, pins, upstream

app = typer.Typer(
    help="Apply and check the upstream patch series.", no_args_is_help=True, add_completion=False
)
console = Console(stderr=True)

Component = Annotated[str, typer.Option("--component", "-c", help="verl, vllm-ascend or vllm")]
Root = Annotated[
    Path, typer.Option("--root", help="folder that holds the package (site-packages or a checkout)")
]


def _fail(exc: Exception) -> typer.Exit:
    console.print(f"[red]error:[/red] {exc}")
    return typer.Exit(1)


@app.command("list")
def list_cmd() -> None:
    """Print every patch of every series with its one-line summary."""
    for component in apply.COMPONENTS:
        for p in apply.read_series(component):
            typer.echo(f"{component}/{p.name}: {p.summary}")


@app.command("apply")
def apply_cmd(
    component: Component,
    root: Root,
    dry_run: Annotated[bool, typer.Option(help="check only; write nothing")] = False,
) -> None:
    """Apply a series in place, all or nothing. Safe to rerun."""
    try:
        results = apply.apply_series(component, root, dry_run=dry_run)
    except apply.PatchError as exc:
        raise _fail(exc) from None
    for patch, status in results:
        typer.echo(f"{status:>16}  {component}/{patch.name}")


@app.command("verify")
def verify_cmd(component: Component, root: Root) -> None:
    """Exit non-zero unless every patch of the series is applied under ROOT."""
    try:
        series = apply.verify_series(component, root)
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
) -> None:
    """Download the pinned releases, apply every series to fresh copies, byte-compile, verify."""
    p = pins.load()
    typer.echo("pinned: " + ", ".join(f"{k} {v}" for k, v in p.upstream.model_dump().items()))
    with tempfile.TemporaryDirectory(prefix="vc-check-") as tmp:
        base = keep or Path(tmp)
        for component in apply.COMPONENTS:
            wheel = upstream.fetch_wheel(component, upstream.cache_dir(cache) if cache else None)
            tree = upstream.unpack(wheel, base / component)
            try:
                results = apply.apply_series(component, tree)
                apply.verify_series(component, tree)
            except apply.PatchError as exc:
                raise _fail(exc) from None
            touched = sorted({t for patch, _ in results for t in patch.targets})
            for rel in touched:
                if rel.endswith(".py") and not compileall.compile_file(str(tree / rel), quiet=2):
                    raise _fail(apply.PatchError(f"{component}: {rel} does not byte-compile after patching"))
            typer.echo(f"{component} ({wheel.name}):")
            for patch, status in results:
                typer.echo(f"  {status}: {patch.name} — {patch.summary}")
            if not results:
                typer.echo("  (empty series)")
    typer.echo("check-patches: OK")
