"""The preflight's answer: one row per check, as a rich table or as JSON, and the exit code.

Why a model: the table is for a person at a terminal and ``--json`` for a script or CI gate;
both are drawn from the same :class:`Report`, so they cannot disagree.
"""

from __future__ import annotations

from enum import StrEnum

import orjson
from pydantic import BaseModel, computed_field
from rich.console import Console
from rich.table import Table

EXIT_READY = 0
EXIT_WILL_FAIL = 1
EXIT_UNREACHABLE = 2
"""Also typer's exit code for a usage error."""


class Status(StrEnum):
    ok = "ok"
    warn = "warn"
    fail = "fail"


STYLE = {Status.ok: "green", Status.warn: "yellow", Status.fail: "bold red"}


class CheckResult(BaseModel):
    check: str
    """Short id: kuberay, rayjob-fields, accelerators, node-label, storage, quota, image."""
    status: Status
    found: str
    """What the cluster and the manifest showed."""
    next: str = ""
    """What to do about it (empty when nothing)."""


def worst(statuses: list[Status]) -> Status:
    order = [Status.ok, Status.warn, Status.fail]
    return max(statuses, key=order.index, default=Status.ok)


Row = tuple[Status, str, str]
"""(status, what was found, what to do next): one finding of a check."""


def result(check: str, rows: list[Row]) -> CheckResult:
    """One check's row from its findings: the worst status, every finding, each next step once."""
    return CheckResult(
        check=check,
        status=worst([r[0] for r in rows]),
        found="; ".join(r[1] for r in rows),
        next="; ".join(dict.fromkeys(r[2] for r in rows if r[2])),
    )


def unread(check: str, what: str, why: str) -> CheckResult:
    """A check whose input RBAC refused: a warning, since it cannot say the run will fail."""
    return CheckResult(
        check=check,
        status=Status.warn,
        found=f"could not read {what} ({why}): not checked",
        next=f"rerun as a user allowed to get/list {what}, or ask a cluster admin",
    )


class Report(BaseModel):
    context: str
    server: str
    server_version: str
    namespace: str
    manifest: str
    checks: list[CheckResult]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ready(self) -> bool:
        """Nothing will fail (warnings allowed)."""
        return all(c.status != Status.fail for c in self.checks)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exit_code(self) -> int:
        return EXIT_READY if self.ready else EXIT_WILL_FAIL

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_INDENT_2)

    def print_table(self, console: Console) -> None:
        title = (
            f"preflight: {self.manifest} → namespace {self.namespace} of {self.context} "
            f"({self.server}, Kubernetes {self.server_version or '?'})"
        )
        table = Table(title=title, show_lines=True, title_justify="left")
        for col in ("check", "status", "found", "next"):
            table.add_column(col, overflow="fold")
        for c in self.checks:
            table.add_row(c.check, f"[{STYLE[c.status]}]{c.status}[/]", c.found, c.next)
        console.print(table)
        failed = [c.check for c in self.checks if c.status == Status.fail]
        if failed:
            console.print(f"[bold red]NOT READY[/]: {', '.join(failed)} will fail; exit {EXIT_WILL_FAIL}")
        else:
            console.print(f"[green]READY[/]: nothing found that will fail; exit {EXIT_READY}")
