"""Apply, verify and list the patch series against an upstream tree.

GNU ``patch`` does the patching (``--fuzz=0``: a hunk either matches the pinned release exactly,
allowing only line offsets, or the run stops). We add what a collection run needs on top:

* all-or-nothing: the series is applied to a scratch copy of the touched files first, and the
  tree is only written once every hunk of every patch has applied;
* an error that names the patch, the file and the hunk, and says what to do next;
* idempotence: a tree that already carries a patch is reported as such, not patched twice;
* ``verify``: a patch is "applied" exactly when it reverse-applies cleanly.

The diffs use paths relative to the folder that holds the package (``verl/...``,
``vllm_ascend/...``), so one series applies both to site-packages and to a source checkout.

Each pin set has its own series folder (``pins.toml``'s ``sets.<name>.series``): the current
set's are ``patches/current/<component>/``, the next set's ``patches/next/<component>/``. Without
an explicit folder, the set in force (``VERL_CONSISTENCY_PIN_SET``) picks it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from verl_consistency.contracts import pins

PATCHES_DIR = Path(str(resources.files("verl_consistency.patches")))

COMPONENTS: dict[str, str] = {"verl": "verl", "vllm-ascend": "vllm_ascend", "vllm": "vllm"}
"""Series folder name → the top-level package the diffs patch (checked to exist under root)."""

_TARGET = re.compile(r"^\+\+\+ (?:b/)?(\S+)", re.MULTILINE)
_FAILED_HUNK = re.compile(r"Hunk #(\d+) FAILED at (\d+)")
_PATCHING = re.compile(r"^(?:patching|checking) file '?([^'\n]+)'?$", re.MULTILINE)


class PatchError(RuntimeError):
    """A patch did not apply, or a tree is not what a patch expects."""


@dataclass(frozen=True)
class PatchFile:
    component: str
    name: str
    path: Path

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def summary(self) -> str:
        """The patch's first header line: what it changes (the rest of the header says why)."""
        for line in self.text.splitlines():
            if line.startswith(("diff ", "--- ")):
                break
            if line.strip():
                return line.strip()
        return ""

    @property
    def targets(self) -> list[str]:
        return [t for t in _TARGET.findall(self.text) if t != "/dev/null"]


def series_root(set_name: str | None = None) -> Path:
    """The folder that holds a pin set's series folders (the set in force by default)."""
    return (PATCHES_DIR / pins.get("set.series", set_name=set_name)).resolve()


def read_series(
    component: str, patches_dir: Path | None = None, set_name: str | None = None
) -> list[PatchFile]:
    if component not in COMPONENTS:
        raise PatchError(f"unknown component {component!r}; expected one of {', '.join(COMPONENTS)}")
    folder = (patches_dir or series_root(set_name)) / component
    series = folder / "series"
    if not series.is_file():
        raise PatchError(f"{series} is missing: every component folder needs a series file")
    out = []
    for lineno, raw in enumerate(series.read_text(encoding="utf-8").splitlines(), 1):
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        path = folder / name
        if not path.is_file():
            raise PatchError(f"{series}:{lineno}: {name} is listed but {path} does not exist")
        out.append(PatchFile(component, name, path))
    return out


def _run_patch(patch: PatchFile, root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "patch",
            "-p1",
            "--batch",
            "--fuzz=0",
            "--no-backup-if-mismatch",
            "-r",
            "-",
            "-d",
            str(root),
            "-i",
            str(patch.path),
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
    )


def _copy_targets(series: list[PatchFile], root: Path, scratch: Path) -> list[str]:
    touched = sorted({t for p in series for t in p.targets})
    for rel in touched:
        src = root / rel
        if src.is_file():
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, scratch / rel)
    return touched


def applied(series: list[PatchFile], root: Path) -> list[bool]:
    """Which patches of the series ``root`` already holds, judged newest first.

    Two patches of a series may touch the same lines (0006 edits a line 0001 added), so a patch
    is checked on the tree with every later applied patch taken back out: on a scratch copy of
    the touched files, each applied patch is reversed for real, newest first. ``root`` is only read.
    """
    flags = [False] * len(series)
    with tempfile.TemporaryDirectory(prefix="vc-applied-") as tmp:
        scratch = Path(tmp)
        _copy_targets(series, Path(root), scratch)
        for i in reversed(range(len(series))):
            if _run_patch(series[i], scratch, "--reverse", "--force", "--dry-run").returncode == 0:
                _run_patch(series[i], scratch, "--reverse", "--force")
                flags[i] = True
    return flags


def _explain(patch: PatchFile, root: Path, res: subprocess.CompletedProcess[str]) -> PatchError:
    out = res.stdout + res.stderr
    current = None
    failures = []
    for line in out.splitlines():
        m = _PATCHING.match(line)
        if m:
            current = m.group(1)
        f = _FAILED_HUNK.search(line)
        if f:
            failures.append(f"{current}: hunk #{f.group(1)} (at line {f.group(2)})")
        if "can't find file" in line or "No such file" in line:
            failures.append(f"{current or '?'}: file not found under {root}")
    where = "; ".join(failures) or out.strip().splitlines()[-1:] or ["patch failed"]
    return PatchError(
        f"patch {patch.component}/{patch.name} does not apply to {root}: "
        f"{where if isinstance(where, str) else where[0]}. The upstream file differs from the pinned "
        f"release (patches/pins.toml): rebase the patch on the pinned file, or fix the pin."
    )


def apply_series(
    component: str,
    root: Path,
    *,
    dry_run: bool = False,
    patches_dir: Path | None = None,
    set_name: str | None = None,
) -> list[tuple[PatchFile, str]]:
    """Apply a component's series to ``root``; return (patch, "applied"|"already applied").

    Raises :class:`PatchError` before touching ``root`` when any hunk would not apply.
    """
    root = Path(root)
    package = COMPONENTS.get(component, "")
    if not (root / package).is_dir():
        raise PatchError(f"{root} does not hold the {package!r} package; --root must be the folder above it")
    series = read_series(component, patches_dir, set_name)
    done = applied(series, root)
    results: list[tuple[PatchFile, str]] = []
    with tempfile.TemporaryDirectory(prefix=f"vc-{component}-") as tmp:
        scratch = Path(tmp)
        touched = _copy_targets(series, root, scratch)
        for patch, already in zip(series, done, strict=True):
            if already:
                results.append((patch, "already applied"))
                continue
            res = _run_patch(patch, scratch, "--forward")
            if res.returncode != 0:
                raise _explain(patch, root, res)
            results.append((patch, "applied"))
        if not dry_run:
            for rel in touched:
                new = scratch / rel
                if not new.is_file():
                    continue
                dest = root / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                staged = dest.with_name(f".{dest.name}.vc-tmp")
                shutil.copy2(new, staged)
                os.replace(staged, dest)
    return results


def verify_series(
    component: str, root: Path, patches_dir: Path | None = None, set_name: str | None = None
) -> list[PatchFile]:
    """Raise unless every patch of the series is applied to ``root``."""
    series = read_series(component, patches_dir, set_name)
    missing = [p.name for p, ok in zip(series, applied(series, Path(root)), strict=True) if not ok]
    if missing:
        raise PatchError(f"{root}: not applied ({component}): {', '.join(missing)}")
    return series
