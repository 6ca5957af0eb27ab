"""``verl-consistency postprocess | verify | extract``: typer commands with rich progress.

The work is done by :mod:`pipeline` and :mod:`bundle`; this module only draws progress bars,
prints the unpaired-reasons table and maps outcomes to the documented exit codes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from verl_consistency.postprocess import pipeline
from verl_consistency.postprocess.output import bundle as bundle_mod
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pipeline import Exit

err = Console(stderr=True)
out = Console()


def register(app: typer.Typer) -> None:
    app.command("postprocess")(postprocess_cmd)
    app.command("verify")(verify_cmd)
    app.command("extract")(extract_cmd)


def postprocess_cmd(
    run_dir: Annotated[Path, typer.Argument(help="The run folder: <dump root>/<run id>.")],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Where the bundle goes. Default: <dump root>/bundles.")
    ] = None,
    no_compare: Annotated[bool, typer.Option("--no-compare", help="Pair and bundle only.")] = False,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Compares run in parallel.")] = 2,
    rollout_dir: Annotated[
        Path | None, typer.Option("--rollout-dir", help="vLLM-side dump root, for dumps made by hand.")
    ] = None,
    actor_dir: Annotated[
        Path | None, typer.Option("--actor-dir", help="Training-side dump root, for dumps made by hand.")
    ] = None,
    level: Annotated[
        int, typer.Option("--level", min=1, max=22, help="zstd level.")
    ] = bundle_mod.DEFAULT_LEVEL,
) -> None:
    """Pair rollout and training dumps by request id, compare them, and write the bundle.

    Exit codes: 0 success, 3 bad input, 4 nothing paired, 5 some compares failed.
    """
    with _Bars() as bars:
        hooks = pipeline.Hooks(stage=bars.update, warn=lambda m: err.print(f"[yellow]warning:[/] {m}"))
        try:
            outcome = pipeline.postprocess(
                discover.Roots.open(run_dir, rollout_dir, actor_dir),
                out=out_dir,
                compare=not no_compare,
                jobs=jobs,
                level=level,
                hooks=hooks,
            )
        except discover.BadInput as exc:
            bars.stop()
            err.print(f"[red]bad input:[/] {exc}")
            raise typer.Exit(Exit.BAD_INPUT) from None
    r = outcome.result
    out.print(_reasons_table(r.counts) if r.counts else "Nothing left unpaired.")
    out.print(
        f"{len(r.pairs)} pair(s) from {r.dispatch_records} dispatch and {r.actor_records} training records"
        f" ({len(r.logs)} logs)."
    )
    out.print(f"bundle: {outcome.bundle}")
    messages = {
        Exit.NOTHING_PAIRED: "nothing paired: the table above says why (the bundle holds the details)",
        Exit.COMPARE_FAILED: "some compares failed: see the warnings above and the manifest",
    }
    if outcome.code in messages:
        err.print(f"[red]{messages[outcome.code]}[/]")
    raise typer.Exit(outcome.code)


def verify_cmd(bundle: Annotated[Path, typer.Argument(help="A bundle-<run>.tar.zst.")]) -> None:
    """Check every file of a bundle against its manifest's sizes and sha256.

    Exit codes: 0 intact, 3 not a readable bundle, 6 checksums or file list differ.
    """
    try:
        res = bundle_mod.verify(bundle)
    except bundle_mod.BundleError as exc:
        err.print(f"[red]bad bundle:[/] {exc}")
        raise typer.Exit(Exit.BAD_INPUT) from None
    _finish_check(res, f"{bundle}: {res.files} files, {res.bytes} bytes")


def extract_cmd(
    bundle: Annotated[Path, typer.Argument(help="A bundle-<run>.tar.zst.")],
    dest: Annotated[Path, typer.Argument(help="Target folder; must be absent or empty.")],
) -> None:
    """Extract a bundle into DEST, checking every checksum; nothing is written outside DEST.

    Exit codes: 0 extracted, 3 unreadable or unsafe bundle, or DEST not empty, 6 checksums differ
    (nothing is left in DEST).
    """
    try:
        res = bundle_mod.extract(bundle, dest)
    except bundle_mod.BundleError as exc:
        err.print(f"[red]bad bundle:[/] {exc}; nothing was extracted")
        raise typer.Exit(Exit.BAD_INPUT) from None
    _finish_check(res, f"extracted {res.files} files into {dest}")


def _finish_check(res: bundle_mod.CheckResult, ok_line: str) -> None:
    if not res.ok:
        for e in res.errors:
            err.print(f"[red]mismatch:[/] {e}")
        raise typer.Exit(Exit.CHECKSUM_MISMATCH)
    m = res.manifest
    extra = f" (run {m.run_id}, {len(m.pairs)} pairs)" if m else ""
    out.print(ok_line + extra + ": all checksums match")


def _reasons_table(counts: dict[str, dict[str, int]]) -> Table:
    table = Table(title="Not paired, and why")
    table.add_column("what")
    table.add_column("reason")
    table.add_column("count", justify="right")
    for subject, by in counts.items():
        for reason, n in sorted(by.items(), key=lambda kv: -kv[1]):
            table.add_row(subject, reason, str(n))
    return table


class _Bars:
    """One rich progress bar per stage, created when the stage first reports."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("{task.description:<14}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        )
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> _Bars:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def stop(self) -> None:
        self.progress.stop()

    def update(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=total)
        self.progress.update(self.tasks[stage], completed=done, total=total)
