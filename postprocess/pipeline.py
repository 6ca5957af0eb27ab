"""pair → compare → report → bundle, for one run folder. No terminal code here: the CLI passes
callbacks for progress, so tests and the Kubernetes Job run the very same function.

Exit codes: :class:`Exit`, whose meanings (and what each leaves behind) are documented once, in
``postprocess/README.md`` ("Exit codes"); the k8s Job's ``backoffLimit`` logic relies on them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from verl_consistency.contracts import check_run, layout, run_manifest, token_records
from verl_consistency.contracts.weight_records import WEIGHTS_DIR
from verl_consistency.postprocess.output import bundle as bundle_mod
from verl_consistency.postprocess.output.bundle_manifest import (
    RESULTS_DIR,
    BundleManifest,
    FileEntry,
    PairingSummary,
    Source,
)
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.pair import PairingResult, pair_run

if TYPE_CHECKING:  # the compare stages are imported when they run (msprobe is optional)
    from verl_consistency.postprocess.compare.batch_variance import CheckSummary, PromptVariance
    from verl_consistency.postprocess.compare.token_level import TokenSection
    from verl_consistency.postprocess.output.weight_rows import WeightSummary


class Exit(IntEnum):
    OK = 0
    BAD_INPUT = 3
    NOTHING_PAIRED = 4
    COMPARE_FAILED = 5
    CHECKSUM_MISMATCH = 6


@dataclass
class Hooks:
    """Callbacks the CLI turns into progress bars and messages."""

    stage: Callable[[str, int, int], None] = lambda _s, _d, _t: None
    compared: Callable[[Any], None] = lambda _c: None
    warn: Callable[[str], None] = lambda _m: None


@dataclass
class Outcome:
    code: Exit
    result: PairingResult
    bundle: Path
    manifest: BundleManifest
    warnings: list[str] = field(default_factory=list)


def run_id_for(run_dir: Path, run_json: dict[str, Any] | None) -> str:
    """The run manifest's id when it has a valid one, else the folder name made safe."""
    rid = run_json.get("run_id") if run_json else None
    if isinstance(rid, str) and layout.RUN_ID_RE.match(rid):
        return rid
    name = re.sub(r"[^a-z0-9._-]+", "-", run_dir.name.lower()).strip("-._") or "run"
    return name[:128]


def backend_of(run_json: dict[str, Any] | None) -> Literal["fsdp", "megatron"]:
    """For training records that do not say their backend (the recipe's): the run's actor
    strategy, from run.json's overrides; FSDP otherwise (verl's default)."""
    rj = run_json or {}
    words = [str(x) for key in ("overrides", "user_overrides", "command") for x in (rj.get(key) or [])]
    if rj.get("backend") == "megatron" or any(
        w.lstrip("+").startswith("actor_rollout_ref.actor.strategy=megatron") for w in words
    ):
        return "megatron"
    return "fsdp"


def read_run_json(path: Path, warnings: list[str]) -> dict[str, Any] | None:
    """``run.json`` through the contract's reader (``run_manifest.read_object``), unvalidated: the
    postprocess reads its fields one by one and pairs without it. None, with a warning, when it is
    unreadable or no JSON object; None when the run has none."""
    if not path.is_file():
        return None
    try:
        return run_manifest.read_object(path)
    except ValueError as exc:
        warnings.append(f"{exc}; continuing without it")
        return None


@dataclass(frozen=True)
class _Inputs:
    """What the run folder says before anything is paired: read once, used by every stage."""

    roots: discover.Roots
    run_json: dict[str, Any] | None
    run_id: str
    check: check_run.CheckRun | None
    """A check run's manifest: the batch variance is compared too."""
    out_dir: Path

    @property
    def run_json_path(self) -> Path | None:
        return self.roots.run_dir / layout.RUN_MANIFEST if self.run_json is not None else None

    @property
    def check_json_path(self) -> Path | None:
        return self.roots.run_dir / check_run.CHECK_MANIFEST if self.check is not None else None

    @property
    def triage(self) -> bool:
        """A ``--token-level`` run: nothing to pair by design, its token records are the result."""
        return bool(self.run_json and self.run_json.get("kind") == "token-level")


@dataclass(frozen=True)
class _Work:
    """What every stage after the pairing shares: the inputs, the scratch folder and its results/,
    the options, and the one list of warnings (shown once, then kept in the manifest)."""

    roots: discover.Roots
    folder: Path
    results: Path
    compare: bool
    jobs: int
    hooks: Hooks
    warnings: list[str]

    @classmethod
    def fresh(cls, inputs: _Inputs, *, compare: bool, jobs: int, hooks: Hooks, warnings: list[str]) -> _Work:
        """``work-<run id>`` under the output folder, emptied: our own scratch, rebuilt every time."""
        folder = inputs.out_dir / f"work-{inputs.run_id}"
        if folder.exists():
            shutil.rmtree(folder)
        results = folder / RESULTS_DIR
        results.mkdir(parents=True)
        return cls(inputs.roots, folder, results, compare, jobs, hooks, warnings)


@dataclass(frozen=True)
class _Comparisons:
    """The layer comparisons of the pairs, and whether any of them (or compare itself) failed."""

    comparisons: list[Any] = field(default_factory=list)
    failed: bool = False


@dataclass(frozen=True)
class _TokenView:
    """The token-level view: the report's section, and the comparisons with their output rows."""

    section: TokenSection
    comparisons: list[Any]


@dataclass(frozen=True)
class _Variance:
    """A check run's batch variance: the per-prompt entries, the summary written to
    ``results/check.json`` (None when not compared), and whether a compare failed."""

    entries: list[PromptVariance] = field(default_factory=list)
    summary: CheckSummary | None = None
    failed: bool = False


@dataclass
class _Findings:
    """What the stages found, filled in one after the other; the report and the bundle read it."""

    comparisons: _Comparisons = field(default_factory=_Comparisons)
    token: _TokenView | None = None
    variance: _Variance = field(default_factory=_Variance)
    weights: WeightSummary | None = None
    report_failed: bool = False

    @property
    def failed(self) -> bool:
        return self.comparisons.failed or self.variance.failed or self.report_failed


def postprocess(
    run: Path | discover.Roots,
    *,
    out: Path | None = None,
    compare: bool = True,
    jobs: int = 2,
    level: int = bundle_mod.DEFAULT_LEVEL,
    hooks: Hooks | None = None,
) -> Outcome:
    """Pair, compare, report and bundle one run. ``run`` is the run folder, or the
    :class:`discover.Roots` of dumps made by hand (the CLI's ``--rollout-dir``/``--actor-dir``).

    Raises ``discover.BadInput`` when the inputs cannot be read at all."""
    hooks = hooks or Hooks()
    warnings: list[str] = []
    inputs = _read_inputs(run, out, warnings)
    result = _pair(inputs, hooks, warnings)
    work = _Work.fresh(inputs, compare=compare, jobs=jobs, hooks=hooks, warnings=warnings)
    found = _Findings()
    if compare and result.pairs:
        found.comparisons = _compare(work, result)
    found.token = _token_level(work, result, found.comparisons.comparisons)
    if found.token is not None and compare:
        found.comparisons = _Comparisons(found.token.comparisons, found.comparisons.failed)
    if inputs.check is not None:
        found.variance = _batch_variance(work, result, inputs.check, found.comparisons.comparisons)
    found.weights = _weights(work, result, found.comparisons.comparisons)
    if compare:
        found.report_failed = not _report(work, inputs, result, found)
    for w in warnings:
        hooks.warn(w)
    dest, manifest = _bundle(work, inputs, result, found, level)
    return Outcome(_exit_code(inputs, result, found), result, dest, manifest, warnings)


def _read_inputs(run: Path | discover.Roots, out: Path | None, warnings: list[str]) -> _Inputs:
    """The roots, the run and check manifests, and where the bundle goes (never inside the inputs)."""
    roots = run if isinstance(run, discover.Roots) else discover.Roots.open(run)
    run_json = read_run_json(roots.run_dir / layout.RUN_MANIFEST, warnings)
    try:
        check = check_run.read(roots.run_dir)
    except ValueError as exc:  # the message names the file and what to do
        raise discover.BadInput(str(exc)) from None
    out_dir = (out or roots.run_dir.parent / layout.BUNDLES_DIR).resolve()
    if any(_inside(out_dir, r) for r in (roots.run_dir, roots.rollout, roots.actor)):
        raise discover.BadInput(
            f"--out {out_dir} lies inside the run or a dump folder; choose a folder outside the inputs"
        )
    return _Inputs(roots, run_json, run_id_for(roots.run_dir, run_json), check, out_dir)


def _pair(inputs: _Inputs, hooks: Hooks, warnings: list[str]) -> PairingResult:
    """The pairing; an empty one for a ``--token-level`` run, which dumps nothing with msprobe."""
    try:
        return pair_run(inputs.roots, default_backend=backend_of(inputs.run_json), progress=hooks.stage)
    except discover.TooDeep:
        raise
    except discover.BadInput:
        if not _has_token_records(inputs.roots.run_dir):
            raise
    warnings.append("no msprobe logs: only the token-level view is bundled (a --token-level run)")
    return PairingResult(
        roots=inputs.roots, pairs=[], unpaired=[], counts={}, logs=[], dispatch_records=0, actor_records=0
    )


def _bundle(
    work: _Work, inputs: _Inputs, result: PairingResult, found: _Findings, level: int
) -> tuple[Path, BundleManifest]:
    """Stream the bundle (``bundle-<run id>.tar.zst``); returns where it went and its manifest."""
    variance = found.variance.entries
    comparisons = found.comparisons.comparisons

    def make_manifest(files: list[FileEntry]) -> BundleManifest:
        return BundleManifest(
            run_id=inputs.run_id,
            source=Source(
                run_dir=str(inputs.roots.run_dir),
                rollout_dir=str(inputs.roots.rollout),
                actor_dir=str(inputs.roots.actor),
                layout="run" if inputs.roots.standard else "custom",
            ),
            run_manifest=layout.RUN_MANIFEST if inputs.run_json is not None else None,
            pairing=PairingSummary.of(result),
            pairs=result.pairs,
            unpaired=result.unpaired,
            results_dir=RESULTS_DIR if work.compare else None,
            comparisons=[
                c.model_dump(mode="json") if hasattr(c, "model_dump") else dict(c) for c in comparisons
            ],
            warnings=work.warnings,
            files=files,
            check_manifest=check_run.CHECK_MANIFEST if inputs.check is not None else None,
            batch_variance=variance,
        )

    items = bundle_mod.collect(
        result,
        run_json=inputs.run_json_path,
        results_dir=work.results if work.compare else None,
        check_json=inputs.check_json_path,
        dump_dirs=[ref.dir for v in variance for ref in (v.batched, v.alone) if ref is not None],
        weight_logs=sorted((inputs.roots.run_dir / WEIGHTS_DIR).glob("*.jsonl")),
    )
    dest = inputs.out_dir / layout.bundle_name(inputs.run_id)

    def progress(done: int, total: int) -> None:
        work.hooks.stage("bundle", done, total)

    return dest, bundle_mod.write_bundle(dest, items, make_manifest, level=level, progress=progress)


def _exit_code(inputs: _Inputs, result: PairingResult, found: _Findings) -> Exit:
    if not result.pairs and inputs.triage and found.token is not None and not found.token.section.empty:
        return Exit.OK  # a triage run has nothing to pair by design
    if not result.pairs:
        return Exit.NOTHING_PAIRED
    return Exit.COMPARE_FAILED if found.failed else Exit.OK


def _has_token_records(run_dir: Path) -> bool:
    return any((run_dir / n).is_file() for n in (token_records.TOKEN_LOG, token_records.STEP_LOG))


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _compare(work: _Work, result: PairingResult) -> _Comparisons:
    """The layer comparison of every pair (postprocess/compare/msprobe_compare.py)."""
    warnings = work.warnings
    try:
        from verl_consistency.postprocess.compare.msprobe_compare import compare_pairs
    except ImportError as exc:
        warnings.append(f"compare is not available ({exc}); rerun with --no-compare to silence this")
        return _Comparisons(failed=True)
    try:
        with _run_view(work) as view:
            on_done = _counting(work.hooks, "compare", len(result.pairs), work.hooks.compared)
            comparisons = list(
                compare_pairs(view, result.pairs, work.results, jobs=work.jobs, on_done=on_done)
            )
    except Exception as exc:  # a crash in compare must not lose the pairing work
        warnings.append(f"compare failed: {type(exc).__name__}: {exc}")
        return _Comparisons(failed=True)
    failed = [c for c in comparisons if getattr(c, "error", None)]
    if failed:
        warnings.append(
            f"{len(failed)} of {len(comparisons)} compares failed; see the manifest's comparisons"
        )
    return _Comparisons(comparisons, bool(failed))


def _counting(
    hooks: Hooks, stage: str, total: int, each: Callable[[Any], None] | None = None
) -> Callable[[Any], None]:
    """compare's ``on_done``: the stage's progress (done of ``total``), then ``each`` comparison."""
    done = 0

    def on_done(c: Any) -> None:
        nonlocal done
        done += 1
        hooks.stage(stage, done, total)
        if each is not None:
            each(c)

    return on_done


@contextlib.contextmanager
def _run_view(work: _Work) -> Iterator[Path]:
    """compare reads pair paths relative to a run folder; when the sides were given separately,
    a folder of two symlinks stands in for it (read-only use, inside our scratch folder)."""
    roots = work.roots
    if roots.standard:
        yield roots.run_dir
        return
    view = work.folder / "view"
    view.mkdir()
    os.symlink(roots.rollout, view / layout.ROLLOUT_DIR)
    os.symlink(roots.actor, view / layout.ACTOR_DIR)
    try:
        yield view
    finally:
        shutil.rmtree(view, ignore_errors=True)


def _batch_variance(
    work: _Work, result: PairingResult, check: check_run.CheckRun, comparisons: list[Any]
) -> _Variance:
    """A check run's batch variance (postprocess/compare/batch_variance.py): planned always,
    compared and summarised (``results/check.json``) when the run is compared."""
    from verl_consistency.postprocess.compare import batch_variance as bv

    warnings = work.warnings
    entries, pairs = bv.plan(result, check)
    for e in entries:
        if e.reason is not None:
            warnings.append(f"batch variance of prompt {e.index} not compared: {e.reason.value} ({e.detail})")
    if not work.compare:
        return _Variance(entries)
    try:
        with _run_view(work) as view:
            on_done = _counting(work.hooks, "batch variance", len(pairs))
            entries = bv.compare(view, entries, pairs, work.results, jobs=work.jobs, on_done=on_done)
        summary = bv.summarise(check, result, comparisons, entries, work.results)
        bv.write_summary(work.results, summary)
    except Exception as exc:  # the engine gap is still worth bundling without it
        warnings.append(f"batch variance failed: {type(exc).__name__}: {exc}")
        return _Variance(entries, failed=True)
    bad = [e for e in entries if e.comparison is not None and e.comparison.status == "failed"]
    if bad:
        warnings.append(f"{len(bad)} of {len(pairs)} batch-variance compares failed; see batch_variance")
    return _Variance(entries, summary, bool(bad))


def _token_level(work: _Work, result: PairingResult, comparisons: list[Any]) -> _TokenView | None:
    """The token-level view (postprocess/compare/token_level.py); None when it could not be built."""
    run_dir = work.roots.run_dir
    try:
        from verl_consistency.postprocess.compare import token_level

        compared = token_level.attach_output_rows(run_dir, result.pairs, comparisons)
        section = token_level.build_section(run_dir, work.results, result.pairs)
    except Exception as exc:  # the layer view is still worth writing without it
        work.warnings.append(f"token-level view failed: {type(exc).__name__}: {exc}")
        return None
    for bad in section.bad_lines:
        work.warnings.append(f"{bad.file}:{bad.line}: unreadable token record, skipped ({bad.error})")
    return _TokenView(section, compared)


def _weights(work: _Work, result: PairingResult, comparisons: list[Any]) -> WeightSummary | None:
    """The per-tensor weight check (``compare/weight_check.py``) beside the layer view; its CSV
    in results/. None when the run wrote no weight records."""
    from verl_consistency.postprocess.compare import weight_check
    from verl_consistency.postprocess.output import weight_section

    checked = weight_check.check(work.roots.run_dir)
    work.warnings.extend(checked.warnings)
    summary = weight_section.build(checked, result.pairs, comparisons)
    if summary is not None:
        weight_section.write(work.results, summary)
    return summary


def _report(work: _Work, inputs: _Inputs, result: PairingResult, found: _Findings) -> bool:
    """``report.html``, ``summary.md`` and ``summary.json`` in results/; False (and a warning)
    when not written."""
    try:
        from verl_consistency.postprocess.output.per_step import read_steps
        from verl_consistency.postprocess.output.report import Sections, write_report
    except ImportError as exc:
        work.warnings.append(f"report is not available ({exc})")
        return False
    try:
        write_report(
            work.results,
            run_id=inputs.run_id,
            pairs=result.pairs,
            unpaired=result.unpaired,
            comparisons=found.comparisons.comparisons,
            unpaired_counts=result.counts,
            sections=Sections(
                token=found.token.section if found.token is not None else None,
                check=found.variance.summary,
                run_steps=read_steps(inputs.run_json, work.warnings),
                weights=found.weights,
            ),
        )
    except Exception as exc:  # the bundle is still worth writing without its report
        work.warnings.append(f"report failed: {type(exc).__name__}: {exc}")
        return False
    return True
