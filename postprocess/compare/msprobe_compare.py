"""Compare each pair with mindstudio-probe's train/infer consistency check.

For every :class:`~verl_consistency.postprocess.pairing.pair_types.Pair` this runs msprobe 26.2.0's compare
in-process (``msprobe.pytorch.compare.pt_compare.pt_compare``, the function behind
``msprobe compare -tp <training dump.json> -gp <vLLM dump.json> --consistent_check --backend
fsdp|megatron``) twice: once for the CSV, once with ``first_diff_analyze`` (``-da``) for msprobe's
own first-diff verdict. Pairs run in parallel in worker *processes*: msprobe keeps module-level
state (loggers, patched torch, its own multiprocessing pool in tensor mode), and paying its ~5 s
import once per worker instead of once per pair is most of the speed-up over the CLI.

msprobe prints banners, INFO lines and progress bars; each pair's go to its own
``compare/<pair_id>/compare.log``, never to the terminal. What the rows mean (thresholds,
structural rows, the verdict) is :mod:`.verdict`'s.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import orjson

from verl_consistency.postprocess.compare import fsdp2_names
from verl_consistency.postprocess.compare.verdict import PairComparison, summarise, write_rows_csv
from verl_consistency.postprocess.pairing.pair_types import Pair

COMPARE_DIR = "compare"
"""Per-pair results live in ``<out_dir>/compare/<pair_id>/``."""


def compare_pairs(
    run_dir: Path,
    pairs: Sequence[Pair],
    out_dir: Path,
    *,
    jobs: int = 2,
    on_done: Callable[[PairComparison], None] | None = None,
    folder: str = COMPARE_DIR,
    consistent_check: bool = True,
) -> list[PairComparison]:
    """Compare every pair; results in the order of ``pairs``. A failing pair never stops the rest.

    ``folder`` and ``consistent_check``: see :func:`compare_one`."""
    run_dir, out_dir = Path(run_dir).resolve(), Path(out_dir).resolve()
    (out_dir / folder).mkdir(parents=True, exist_ok=True)
    results: dict[int, PairComparison] = {}

    def done(i: int, res: PairComparison) -> None:
        results[i] = res
        if on_done is not None:
            on_done(res)

    if jobs <= 1 or len(pairs) <= 1:
        for i, pair in enumerate(pairs):
            done(i, compare_one(run_dir, pair, out_dir, folder=folder, consistent_check=consistent_check))
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(pairs)), mp_context=ctx) as pool:
            futures = {
                pool.submit(_worker, str(run_dir), p.model_dump(), str(out_dir), folder, consistent_check): i
                for i, p in enumerate(pairs)
            }
            for fut in as_completed(futures):
                i = futures[fut]
                try:
                    res = PairComparison.model_validate(fut.result())
                except Exception as exc:  # a crashed worker: report, keep going
                    res = _failed(pairs[i], f"compare worker died: {type(exc).__name__}: {exc}")
                done(i, res)
    return [results[i] for i in range(len(pairs))]


def _worker(
    run_dir: str, pair: dict[str, Any], out_dir: str, folder: str, consistent_check: bool
) -> dict[str, Any]:
    return compare_one(
        Path(run_dir),
        Pair.model_validate(pair),
        Path(out_dir),
        fd_level=True,
        folder=folder,
        consistent_check=consistent_check,
    ).model_dump()


@contextlib.contextmanager
def _quiet_stdio(path: Path, *, fd_level: bool = False) -> Iterator[None]:
    """msprobe prints banners and tqdm bars; send them to a file so the CLI's progress stays clean.

    ``fd_level`` also redirects file descriptors 1 and 2 (worker processes only: msprobe's own
    pool children inherit them).
    """
    with path.open("w") as fh:
        if fd_level:
            saved = os.dup(1), os.dup(2)
            os.dup2(fh.fileno(), 1)
            os.dup2(fh.fileno(), 2)
        try:
            with contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
                yield
        finally:
            if fd_level:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])


def _failed(pair: Pair, error: str, **kw: Any) -> PairComparison:
    return PairComparison(
        pair_id=pair.pair_id,
        request_id=pair.request_id,
        backend=pair.backend,
        task=pair.task,
        scoped=pair.scoped,
        status="failed",
        error=error,
        **kw,
    )


def compare_one(
    run_dir: Path,
    pair: Pair,
    out_dir: Path,
    *,
    fd_level: bool = False,
    folder: str = COMPARE_DIR,
    consistent_check: bool = True,
) -> PairComparison:
    """Run msprobe on one pair into a temp folder, summarise, then swap it into place (rerun-safe).

    Results go to ``<out_dir>/<folder>/<pair_id>/``. ``consistent_check=False`` runs msprobe's
    plain compare, for two dumps of the *same* engine (a check run's batch variance: vLLM batched
    as target, vLLM alone as golden, ``postprocess/compare/batch_variance.py``): ``--consistent_check``
    maps training names onto vLLM's and matched 3 of 197 rows of two vLLM lanes of the same
    prompt (msprobe 26.2.0), where the plain compare matches every row by its identical name.
    Both sides' names are then vLLM's, so no FSDP renaming, and the result's ``backend`` is
    ``vllm``."""
    t0 = time.monotonic()
    final = out_dir / folder / pair.pair_id
    tmp = out_dir / folder / f".{pair.pair_id}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rel = f"{folder}/{pair.pair_id}"
    target = run_dir / pair.actor.dir / "dump.json"
    golden = run_dir / pair.rollout.dir / "dump.json"
    view = tmp / "fsdp1-view"
    renamed: dict[str, str] | None = None
    try:
        for path, side in ((target, "training"), (golden, "vLLM")):
            if not path.is_file():
                raise FileNotFoundError(f"{side} dump {path} is missing; re-run the postprocess pairing")
        if pair.backend == "fsdp" and consistent_check:
            renamed = fsdp2_names.write_fsdp1_view(target.parent, view)
        backend = pair.backend if consistent_check else None
        with _quiet_stdio(tmp / "compare.log", fd_level=fd_level):
            csv, da_json = _run_msprobe(view / "dump.json" if renamed else target, golden, tmp, backend)
        back = {v: k for k, v in renamed.items()} if renamed else None
        res = summarise(csv, pair, da_json=da_json, back=back)
        res = res.model_copy(
            update={
                "csv": f"{rel}/compare_result.csv",
                "rows_csv": f"{rel}/rows.csv",
                "first_diff_json": f"{rel}/first_diff.json" if da_json else None,
            }
        )
        write_rows_csv(tmp / "rows.csv", csv, back)
    except Exception as exc:
        res = _failed(pair, f"{type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(view, ignore_errors=True)  # a renamed copy and a link into the run: not results
    res = res.model_copy(update={"fsdp2_normalised": renamed is not None})
    if not consistent_check:
        res = res.model_copy(update={"backend": "vllm"})
    res = res.model_copy(update={"seconds": round(time.monotonic() - t0, 3), "log": f"{rel}/compare.log"})
    (tmp / "comparison.json").write_bytes(orjson.dumps(res.model_dump(), option=orjson.OPT_INDENT_2))
    _swap_into_place(tmp, final)
    return res


def _run_msprobe(target: Path, golden: Path, work: Path, backend: str | None) -> tuple[Path, Path | None]:
    """msprobe's compare, then its ``-da``; ``backend`` None: the plain compare (same names)."""
    from msprobe.pytorch.compare.pt_compare import pt_compare

    param = {"npu_path": str(target), "bench_path": str(golden), "is_print_compare_log": False}
    kw: dict[str, Any] = {"consistent_check": True, "backend": backend} if backend else {}
    out = work / "csv"
    pt_compare(dict(param), str(out), **kw)
    csvs = sorted(out.glob("compare_result_*.csv"))
    if not csvs:
        raise RuntimeError(
            "msprobe wrote no compare_result CSV: it found no rows to match. Check that both dump.json "
            "files hold forward module data (level L0 or mix) of the same model. "
            "See the pair's compare.log for msprobe's own messages."
        )
    csv = work / "compare_result.csv"
    csvs[-1].replace(csv)
    da_out = work / "da"
    pt_compare(dict(param), str(da_out), first_diff_analyze=True, **kw)
    jsons = sorted(da_out.glob("compare_result_*.json"))
    da_json: Path | None = None
    if jsons:
        da_json = work / "first_diff.json"
        jsons[-1].replace(da_json)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(da_out, ignore_errors=True)
    return csv, da_json


def _swap_into_place(tmp: Path, final: Path) -> None:
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        final.replace(old)
    tmp.replace(final)
    shutil.rmtree(old, ignore_errors=True)
