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
from typing import Any, Literal

import orjson

from verl_consistency.contracts import check_run, layout, token_records
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
    if not path.is_file():
        return None
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        warnings.append(f"{path}: unreadable run manifest ({exc}); continuing without it")
        return None
    if not isinstance(obj, dict):
        warnings.append(f"{path}: run manifest is not a JSON object; continuing without it")
        return None
    return obj


def postprocess(
    run_dir: Path,
    *,
    out: Path | None = None,
    compare: bool = True,
    jobs: int = 2,
    rollout_dir: Path | None = None,
    actor_dir: Path | None = None,
    level: int = bundle_mod.DEFAULT_LEVEL,
    hooks: Hooks | None = None,
) -> Outcome:
    """Raises ``discover.BadInput`` when the inputs cannot be read at all."""
    hooks = hooks or Hooks()
    roots = discover.Roots.open(run_dir, rollout_dir, actor_dir)
    warnings: list[str] = []
    run_json_path = roots.run_dir / layout.RUN_MANIFEST
    run_json = read_run_json(run_json_path, warnings)
    run_id = run_id_for(roots.run_dir, run_json)
    backend = backend_of(run_json)
    try:
        check = check_run.read(roots.run_dir)  # a check run: the batch variance too
    except ValueError as exc:  # the message names the file and what to do
        raise discover.BadInput(str(exc)) from None

    out_dir = (out or roots.run_dir.parent / layout.BUNDLES_DIR).resolve()
    if any(_inside(out_dir, r) for r in (roots.run_dir, roots.rollout, roots.actor)):
        raise discover.BadInput(
            f"--out {out_dir} lies inside the run or a dump folder; choose a folder outside the inputs"
        )
    triage = bool(run_json and run_json.get("kind") == "token-level")
    try:
        result = pair_run(roots, default_backend=backend, progress=hooks.stage)
    except discover.TooDeep:
        raise
    except discover.BadInput:
        # a --token-level run dumps nothing with msprobe: bundle its token view alone
        if not _has_token_records(roots.run_dir):
            raise
        warnings.append("no msprobe logs: only the token-level view is bundled (a --token-level run)")
        result = PairingResult(
            roots=roots, pairs=[], unpaired=[], counts={}, logs=[], dispatch_records=0, actor_records=0
        )

    work = out_dir / f"work-{run_id}"
    if work.exists():
        shutil.rmtree(work)  # our own scratch from an earlier run: rebuilt every time
    results = work / RESULTS_DIR
    results.mkdir(parents=True)

    comparisons: list[Any] = []
    failed = False
    if compare and result.pairs:
        comparisons, failed = _compare(roots, work, results, result, jobs, hooks, warnings)
    token = _token_level(roots.run_dir, results, result, comparisons, warnings)
    if token is not None and compare:
        comparisons = token[1]
    variance: list[Any] = []
    check_summary = None
    if check is not None:
        variance, check_summary, bv_failed = _batch_variance(
            roots, work, results, result, check, comparisons, compare, jobs, hooks, warnings
        )
        failed |= bv_failed
    if compare:
        failed |= not _report(
            results,
            run_id,
            result,
            comparisons,
            warnings,
            token[0] if token is not None else None,
            check_summary,
        )

    for w in warnings:
        hooks.warn(w)

    def make_manifest(files: list[FileEntry]) -> BundleManifest:
        return BundleManifest(
            run_id=run_id,
            source=Source(
                run_dir=str(roots.run_dir),
                rollout_dir=str(roots.rollout),
                actor_dir=str(roots.actor),
                layout="run" if roots.standard else "custom",
            ),
            run_manifest=layout.RUN_MANIFEST if run_json is not None else None,
            pairing=PairingSummary.of(result),
            pairs=result.pairs,
            unpaired=result.unpaired,
            results_dir=RESULTS_DIR if compare else None,
            comparisons=[
                c.model_dump(mode="json") if hasattr(c, "model_dump") else dict(c) for c in comparisons
            ],
            warnings=warnings,
            files=files,
            check_manifest=check_run.CHECK_MANIFEST if check is not None else None,
            batch_variance=variance,
        )

    items = bundle_mod.collect(
        result,
        run_json=run_json_path if run_json is not None else None,
        results_dir=results if compare else None,
        check_json=roots.run_dir / check_run.CHECK_MANIFEST if check is not None else None,
        dump_dirs=[ref.dir for v in variance for ref in (v.batched, v.alone) if ref is not None],
    )
    dest = out_dir / layout.bundle_name(run_id)
    manifest = bundle_mod.write_bundle(
        dest, items, make_manifest, level=level, progress=lambda d, t: hooks.stage("bundle", d, t)
    )
    if not result.pairs and triage and token is not None and not token[0].empty:
        code = Exit.OK  # a triage run has nothing to pair by design
    elif not result.pairs:
        code = Exit.NOTHING_PAIRED
    elif failed:
        code = Exit.COMPARE_FAILED
    else:
        code = Exit.OK
    return Outcome(code, result, dest, manifest, warnings)


def _has_token_records(run_dir: Path) -> bool:
    return any((run_dir / n).is_file() for n in (token_records.TOKEN_LOG, token_records.STEP_LOG))


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _compare(
    roots: discover.Roots,
    work: Path,
    results: Path,
    result: PairingResult,
    jobs: int,
    hooks: Hooks,
    warnings: list[str],
) -> tuple[list[Any], bool]:
    try:
        from verl_consistency.postprocess.compare.msprobe_compare import compare_pairs
    except ImportError as exc:
        warnings.append(f"compare is not available ({exc}); rerun with --no-compare to silence this")
        return [], True
    try:
        with _run_view(roots, work) as view:
            on_done = _counting(hooks, "compare", len(result.pairs), hooks.compared)
            comparisons = list(compare_pairs(view, result.pairs, results, jobs=jobs, on_done=on_done))
    except Exception as exc:  # a crash in compare must not lose the pairing work
        warnings.append(f"compare failed: {type(exc).__name__}: {exc}")
        return [], True
    failed = [c for c in comparisons if getattr(c, "error", None)]
    if failed:
        warnings.append(
            f"{len(failed)} of {len(comparisons)} compares failed; see the manifest's comparisons"
        )
    return comparisons, bool(failed)


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
def _run_view(roots: discover.Roots, work: Path) -> Iterator[Path]:
    """compare reads pair paths relative to a run folder; when the sides were given separately,
    a folder of two symlinks stands in for it (read-only use, inside our scratch folder)."""
    if roots.standard:
        yield roots.run_dir
        return
    view = work / "view"
    view.mkdir()
    os.symlink(roots.rollout, view / layout.ROLLOUT_DIR)
    os.symlink(roots.actor, view / layout.ACTOR_DIR)
    try:
        yield view
    finally:
        shutil.rmtree(view, ignore_errors=True)


def _batch_variance(
    roots: discover.Roots,
    work: Path,
    results: Path,
    result: PairingResult,
    check: check_run.CheckRun,
    comparisons: list[Any],
    compare: bool,
    jobs: int,
    hooks: Hooks,
    warnings: list[str],
) -> tuple[list[Any], Any, bool]:
    """A check run's batch variance (postprocess/compare/batch_variance.py): (per-prompt entries, the
    summary written to results/check.json or None, whether a compare failed)."""
    from verl_consistency.postprocess.compare import batch_variance as bv

    entries, pairs = bv.plan(result, check)
    for e in entries:
        if e.reason is not None:
            warnings.append(f"batch variance of prompt {e.index} not compared: {e.reason.value} ({e.detail})")
    if not compare:
        return entries, None, False
    try:
        with _run_view(roots, work) as view:
            on_done = _counting(hooks, "batch variance", len(pairs))
            entries = bv.compare(view, entries, pairs, results, jobs=jobs, on_done=on_done)
        summary = bv.summarise(check, result, comparisons, entries, results)
        bv.write_summary(results, summary)
    except Exception as exc:  # the engine gap is still worth bundling without it
        warnings.append(f"batch variance failed: {type(exc).__name__}: {exc}")
        return entries, None, True
    bad = [e for e in entries if e.comparison is not None and e.comparison.status == "failed"]
    if bad:
        warnings.append(f"{len(bad)} of {len(pairs)} batch-variance compares failed; see batch_variance")
    return entries, summary, bool(bad)


def _token_level(
    run_dir: Path, results: Path, result: PairingResult, comparisons: list[Any], warnings: list[str]
) -> tuple[Any, list[Any]] | None:
    """The token-level view (postprocess/compare/token_level.py): output rows of the pairs, the section."""
    try:
        from verl_consistency.postprocess.compare import token_level

        compared = token_level.attach_output_rows(run_dir, result.pairs, comparisons)
        section = token_level.build_section(run_dir, results, result.pairs)
    except Exception as exc:  # the layer view is still worth writing without it
        warnings.append(f"token-level view failed: {type(exc).__name__}: {exc}")
        return None
    for bad in section.bad_lines:
        warnings.append(f"{bad.file}:{bad.line}: unreadable token record, skipped ({bad.error})")
    return section, compared


def _report(
    results: Path,
    run_id: str,
    result: PairingResult,
    comparisons: list[Any],
    warnings: list[str],
    token: Any = None,
    check: Any = None,
) -> bool:
    try:
        from verl_consistency.postprocess.output.report import write_report
    except ImportError as exc:
        warnings.append(f"report is not available ({exc})")
        return False
    try:
        write_report(
            results,
            run_id=run_id,
            pairs=result.pairs,
            unpaired=result.unpaired,
            comparisons=comparisons,
            unpaired_counts=result.counts,
            token=token,
            check=check,
        )
    except Exception as exc:  # the bundle is still worth writing without its report
        warnings.append(f"report failed: {type(exc).__name__}: {exc}")
        return False
    return True
