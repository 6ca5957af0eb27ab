"""``verl-consistency load SOURCE DEST``: what the model loader Job runs (k8s/model-loader-job.yaml).

Every shipped pod mounts the models volume read-only; the loader Job is the one writer, and this
command is all it does, so that the copy is tested here on CPU rather than as shell in a manifest.

Exit codes, which the Job's ``podFailurePolicy`` reads: 0 loaded, or already there from the same
source; 2 bad input (a retry cannot help: the Job fails at once); 1 anything else, such as the
network breaking off (the Job retries; the half-done load is cleaned up first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from verl_consistency.entrypoints.load.fetch import FetchError, LoadError
from verl_consistency.entrypoints.load.place import load

EXIT_BAD_INPUT = 2
EXIT_RETRY = 1

console = Console(stderr=True, highlight=False, soft_wrap=True)


def load_cmd(
    source: Annotated[
        str,
        typer.Argument(
            help="An http(s):// URL or an absolute path: a folder (copied), a tar, tar.gz or tar.zst "
            "archive (unpacked; a single top folder in it is dropped), or any other file (copied as "
            "it is). Append #sha256=<hex> to refuse other bytes."
        ),
    ],
    dest: Annotated[
        Path,
        typer.Argument(
            help="The absolute path to create: the folder (for a folder or an archive) or the file. "
            "It must not exist, unless an earlier load from the same source made it (then nothing "
            "is done)."
        ),
    ],
    root: Annotated[
        Path | None,
        typer.Option(help="Refuse a DEST outside this folder (the loader Job: /models)."),
    ] = None,
) -> None:
    """Put a model folder, a dataset or a reward file onto a volume, atomically and once."""
    try:
        outcome = load(source, dest, root, lambda line: console.print(escape(line)))
    except LoadError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except (FetchError, OSError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))} (exit {EXIT_RETRY}: a retry may help)")
        raise typer.Exit(EXIT_RETRY) from None
    rec = outcome.record
    what = f"{rec.kind}, {rec.files} file(s), {rec.bytes / (1 << 20):.1f} MiB"
    if outcome.already:
        console.print(f"{outcome.dest}: already loaded from {rec.source} ({what}); nothing to do")
    else:
        console.print(f"[green]loaded {outcome.dest}[/green] from {escape(rec.source)} ({what})")
    typer.echo(str(outcome.dest))
