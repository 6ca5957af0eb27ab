"""Compare each pair with mindstudio-probe's train/infer consistency check, and summarise it.

For every :class:`~verl_consistency.postprocess.model.Pair` this runs msprobe 26.2.0's compare
in-process (``msprobe.pytorch.compare.pt_compare.pt_compare``, the function behind
``msprobe compare -tp <training dump.json> -gp <vLLM dump.json> --consistent_check --backend
fsdp|megatron``) twice: once for the CSV, once with ``first_diff_analyze`` (``-da``) for msprobe's
own first-diff verdict. Pairs run in parallel in worker *processes*: msprobe keeps module-level
state (loggers, patched torch, its own multiprocessing pool in tensor mode), and paying its ~5 s
import once per worker instead of once per pair is most of the speed-up over the CLI.

msprobe's table is then read back and summarised our way, because read raw it misleads:

* **Unmatched rows** (a module only one side has: vLLM's ``attn`` and per-layer ``rotary_emb``,
  HF's model-level kwargs) show ``N/A`` on one side and often ``pass``. They are counted, never
  judged.
* **Statistics mode** marks nearly every row ``error`` because the shapes differ by design
  (training ``[1, T, H]`` against vLLM's packed ``[T, H]``; q/k/v against fused qkv). We ignore
  shape-only errors and judge the statistics themselves: the relative error of the L2 norm, with
  the norms of fused q/k/v (gate/up) parts combined as ``sqrt(Σ n_i²)``.
* **Tensor mode** gives real per-element metrics: Cosine, MaxAbsErr, and our relative error
  ``EucDist / ‖golden‖``.
* **FSDP2 training dumps** (verl ``strategy=fsdp2``) carry no FSDP1 wrapper in their names, which
  msprobe's mapping needs; msprobe is given an FSDP1-named copy (:mod:`.fsdp2_names`) and our
  tables name the rows as the dump does.
* **Structural rows** differ by construction, not by numerics (see :data:`STRUCTURAL`); they are
  shown grey and never called the first divergence. msprobe's ``-da`` has no such list, so on a
  real vLLM model it names ``act_fn`` first; both answers are reported.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict

from verl_consistency.atomic import atomic_path
from verl_consistency.postprocess import fsdp2_names
from verl_consistency.postprocess.model import Pair

COMPARE_DIR = "compare"
"""Per-pair results live in ``<out_dir>/compare/<pair_id>/``."""

HEALTHY_REL_ERR = 1e-2
"""At or below this relative error a row is healthy: a few bf16 roundings (bf16 ε = 7.8e-3)."""
DIVERGED_REL_ERR = 5e-2
"""Above this a row has diverged: more than accumulated rounding explains."""
HEALTHY_COSINE = 0.999
DIVERGED_COSINE = 0.99

STRUCTURAL: tuple[tuple[re.Pattern[str], frozenset[str], str], ...] = (
    (
        re.compile(r"(^|\.)act_fn$"),
        frozenset({"input", "output"}),
        "vLLM's SiluAndMul takes gate‖up and returns silu(gate)·up; HF's act_fn is silu(gate) alone",
    ),
    (
        re.compile(r"(^|\.)layers\.\d+$"),
        frozenset({"input", "output"}),
        "vLLM's decoder layer takes and returns (hidden, residual) and leaves the residual add to the "
        "next RMSNorm; HF's returns the sum",
    ),
    (
        # layer 0's input_layernorm is absent on purpose: vLLM's first decoder layer has no residual
        # yet (``residual is None``), so that norm gets the embedding output alone, as HF's does,
        # and its input compares directly (seen in real vLLM 0.18.0 dumps: no ``input.1`` there)
        re.compile(r"(^|\.)(layers\.[1-9]\d*\.input_layernorm|post_attention_layernorm|norm)$"),
        frozenset({"input"}),
        "vLLM's RMSNorm gets the sublayer output and the residual separately and adds them itself; "
        "HF's gets the sum (its output is comparable, its input is not; layer 0's input_layernorm "
        "has no residual and compares)",
    ),
)
"""(vLLM module path, row kinds, why): rows that differ between vLLM and Hugging Face by construction."""

_NAME_RE = re.compile(
    r"^(?:Module\.)?(?:(?P<path>.+)\.)?(?P<cls>[A-Za-z_][A-Za-z0-9_]*)\.(?P<dir>forward|backward)"
    r"\.(?P<call>\d+)\.(?P<kind>input|output|parameters|kwargs|parameters_grad)(?:\.(?P<idx>.+))?$"
)
_LAYER_RE = re.compile(r"layers\.(\d+)(?:\.|$)")
_SHAPE_ONLY = ("shape of", "dtype of", "required_grad")

Verdict = Literal["healthy", "suspicious", "diverged", "failed"]
RowStatus = Literal["unmatched", "structural", "no_metric", "ok", "warn", "diverged"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RowDiff(_Model):
    """One matched row of msprobe's table, as we judge it."""

    target: str
    """Training-side (msprobe "NPU") name; fused parts joined with ``;``."""
    golden: str
    """vLLM-side (msprobe "Bench") name."""
    module: str
    """vLLM module path, e.g. ``model.layers.1.mlp.down_proj``."""
    kind: str
    """``input``, ``output``, ``parameters``, ``kwargs``."""
    layer: int | None
    rel_err: float | None
    cosine: float | None = None
    max_abs_err: float | None = None
    msprobe_result: str
    status: RowStatus
    note: str = ""


class LayerError(_Model):
    """The worst matched, non-structural row of one layer."""

    label: str
    """``embed``, ``0`` … ``N-1``, ``head``."""
    order: int
    rel_err: float | None
    cosine: float | None = None
    module: str | None = None


class PairComparison(_Model):
    pair_id: str
    request_id: str = ""
    backend: str = ""
    task: str = "statistics"
    scoped: bool = False
    fsdp2_normalised: bool = False
    """The training dump is FSDP2 (``fully_shard``): msprobe compared a copy renamed to FSDP1 names
    (its ``compare_result.csv`` and ``first_diff.json`` show those); our rows and fields show the
    dump's own names."""
    status: Literal["ok", "failed"]
    error: str | None = None
    verdict: Verdict = "failed"
    csv: str | None = None
    """msprobe's CSV, kept as written (relative to out_dir)."""
    rows_csv: str | None = None
    """Our judged table: matched rows only, with rel_err and status."""
    first_diff_json: str | None = None
    """msprobe's ``-da`` result."""
    log: str | None = None
    rows_total: int = 0
    rows_matched: int = 0
    rows_unmatched: int = 0
    rows_structural: int = 0
    rows_shape_only_error: int = 0
    """Rows msprobe marks ``error`` only for shape/dtype differences (statistics mode)."""
    first_divergence: str | None = None
    """vLLM module path of the first output or parameter row that diverged, in forward order."""
    first_divergence_target: str | None = None
    first_divergence_row: RowDiff | None = None
    msprobe_first_diff: str | None = None
    """msprobe's ``-da`` answer: the first module it marks ``is_same: false`` (training name)."""
    worst_rows: list[RowDiff] = []
    layer_profile: list[LayerError] = []
    max_rel_err: float | None = None
    min_cosine: float | None = None
    max_abs_err: float | None = None
    seconds: float = 0.0


def compare_pairs(
    run_dir: Path,
    pairs: Sequence[Pair],
    out_dir: Path,
    *,
    jobs: int = 2,
    on_done: Callable[[PairComparison], None] | None = None,
) -> list[PairComparison]:
    """Compare every pair; results in the order of ``pairs``. A failing pair never stops the rest."""
    run_dir, out_dir = Path(run_dir).resolve(), Path(out_dir).resolve()
    (out_dir / COMPARE_DIR).mkdir(parents=True, exist_ok=True)
    results: dict[int, PairComparison] = {}

    def done(i: int, res: PairComparison) -> None:
        results[i] = res
        if on_done is not None:
            on_done(res)

    if jobs <= 1 or len(pairs) <= 1:
        for i, pair in enumerate(pairs):
            done(i, compare_one(run_dir, pair, out_dir))
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(pairs)), mp_context=ctx) as pool:
            futures = {
                pool.submit(_worker, str(run_dir), p.model_dump(), str(out_dir)): i
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


def _worker(run_dir: str, pair: dict[str, Any], out_dir: str) -> dict[str, Any]:
    return compare_one(Path(run_dir), Pair.model_validate(pair), Path(out_dir), fd_level=True).model_dump()


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


def compare_one(run_dir: Path, pair: Pair, out_dir: Path, *, fd_level: bool = False) -> PairComparison:
    """Run msprobe on one pair into a temp folder, summarise, then swap it into place (rerun-safe)."""
    t0 = time.monotonic()
    final = out_dir / COMPARE_DIR / pair.pair_id
    tmp = out_dir / COMPARE_DIR / f".{pair.pair_id}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rel = f"{COMPARE_DIR}/{pair.pair_id}"
    target = run_dir / pair.actor.dir / "dump.json"
    golden = run_dir / pair.rollout.dir / "dump.json"
    view = tmp / "fsdp1-view"
    renamed: dict[str, str] | None = None
    try:
        for path, side in ((target, "training"), (golden, "vLLM")):
            if not path.is_file():
                raise FileNotFoundError(f"{side} dump {path} is missing; re-run the postprocess pairing")
        if pair.backend == "fsdp":
            renamed = fsdp2_names.write_fsdp1_view(target.parent, view)
        with _quiet_stdio(tmp / "compare.log", fd_level=fd_level):
            csv, da_json = _run_msprobe(view / "dump.json" if renamed else target, golden, tmp, pair.backend)
        back = {v: k for k, v in renamed.items()} if renamed else None
        res = summarise(csv, pair, da_json=da_json, back=back)
        res = res.model_copy(
            update={
                "csv": f"{rel}/compare_result.csv",
                "rows_csv": f"{rel}/rows.csv",
                "first_diff_json": f"{rel}/first_diff.json" if da_json else None,
            }
        )
        _write_rows_csv(tmp / "rows.csv", csv, back)
    except Exception as exc:
        res = _failed(pair, f"{type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(view, ignore_errors=True)  # a renamed copy and a link into the run: not results
    res = res.model_copy(update={"fsdp2_normalised": renamed is not None})
    res = res.model_copy(update={"seconds": round(time.monotonic() - t0, 3), "log": f"{rel}/compare.log"})
    (tmp / "comparison.json").write_bytes(orjson.dumps(res.model_dump(), option=orjson.OPT_INDENT_2))
    _swap_into_place(tmp, final)
    return res


def _run_msprobe(target: Path, golden: Path, work: Path, backend: str) -> tuple[Path, Path | None]:
    from msprobe.pytorch.compare.pt_compare import pt_compare

    param = {"npu_path": str(target), "bench_path": str(golden), "is_print_compare_log": False}
    kw: dict[str, Any] = {"consistent_check": True, "backend": backend}
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


# ----------------------------------------------------------------------------- reading msprobe


def _num(s: Any) -> float | None:
    if s is None:
        return None
    text = str(s).strip()
    if not text or text in ("N/A", "NaN", "nan", "None", "unsupported", "Diff", "shape unmatched"):
        return None
    pct = text.endswith("%")
    try:
        v = float(text[:-1] if pct else text)
    except ValueError:
        return None
    return v / 100 if pct else v


def _combined_norm(cell: str, kind: str) -> float | None:
    """Norm of a fused row: parts concatenated → sqrt(Σ n²); fused *inputs* are one tensor → first."""
    parts = [_num(p) for p in str(cell).split(";")]
    if not parts or any(p is None for p in parts):
        return None
    vals = [p for p in parts if p is not None]
    if kind == "input":
        return vals[0]
    return math.sqrt(sum(v * v for v in vals))


def parse_name(name: str) -> tuple[str, str, int | None]:
    """msprobe row name → (module path, kind, layer). Fused names: the first part."""
    first = name.split(";")[0].strip()
    m = _NAME_RE.match(first)
    if not m:
        return first, "", None
    path = m.group("path") or m.group("cls")
    layer = _LAYER_RE.search(path)
    return path, m.group("kind"), int(layer.group(1)) if layer else None


def structural_reason(module: str, kind: str) -> str | None:
    for pattern, kinds, why in STRUCTURAL:
        if kind in kinds and pattern.search(module):
            return why
    return None


def _judge(rel: float | None, cos: float | None) -> RowStatus:
    if rel is None and cos is None:
        return "no_metric"
    if (rel is not None and rel > DIVERGED_REL_ERR) or (cos is not None and cos < DIVERGED_COSINE):
        return "diverged"
    if (rel is not None and rel > HEALTHY_REL_ERR) or (cos is not None and cos < HEALTHY_COSINE):
        return "warn"
    return "ok"


def read_rows(csv: Path, back: Mapping[str, str] | None = None) -> tuple[list[RowDiff], int, int, bool]:
    """msprobe CSV → (matched judged rows in forward order, total rows, shape-only errors, tensor?).

    ``back`` maps FSDP1 names msprobe saw to the dump's own FSDP2 names (:mod:`.fsdp2_names`).
    """
    import pandas as pd

    df = pd.read_csv(csv, dtype=str, keep_default_na=False)
    tensor = "Cosine" in df.columns
    rows: list[RowDiff] = []
    shape_only = 0
    for rec in df.to_dict("records"):
        target, golden = str(rec.get("NPU Name", "")), str(rec.get("Bench Name", ""))
        if back:
            target = fsdp2_names.restore(target, back)
        result = str(rec.get("Result", ""))
        module, kind, layer = parse_name(golden if golden not in ("", "N/A") else target)
        if target in ("", "N/A") or golden in ("", "N/A"):
            rows.append(
                RowDiff(
                    target=target,
                    golden=golden,
                    module=module,
                    kind=kind,
                    layer=layer,
                    rel_err=None,
                    msprobe_result=result,
                    status="unmatched",
                )
            )
            continue
        msgs = str(rec.get("Err_message", "")).lower()
        if not tensor and result == "error":
            errs = [e for e in re.findall(r"error:[^\"\]]*", msgs)]
            if errs and all(any(s in e for s in _SHAPE_ONLY) for e in errs):
                shape_only += 1
        cos = mae = None
        if tensor:
            cos, mae = _num(rec.get("Cosine")), _num(rec.get("MaxAbsErr"))
            dist, gnorm = _num(rec.get("EucDist")), _num(rec.get("Bench l2norm"))
            rel = dist / gnorm if dist is not None and gnorm else (0.0 if dist == 0 else None)
        else:
            tn = _combined_norm(str(rec.get("NPU l2norm", "")), kind)
            gn = _combined_norm(str(rec.get("Bench l2norm", "")), kind)
            rel = abs(tn - gn) / max(abs(gn), 1e-12) if tn is not None and gn is not None else None
        why = structural_reason(module, kind)
        rows.append(
            RowDiff(
                target=target,
                golden=golden,
                module=module,
                kind=kind,
                layer=layer,
                rel_err=rel,
                cosine=cos,
                max_abs_err=mae,
                msprobe_result=result,
                status="structural" if why else _judge(rel, cos),
                note=why or "",
            )
        )
    return rows, len(df), shape_only, tensor


def _msprobe_first_diff(path: Path | None, back: Mapping[str, str] | None = None) -> str | None:
    if path is None or not path.exists():
        return None
    data = json.loads(path.read_text())  # msprobe writes bare NaN/Infinity: not for orjson
    for api, info in data.items():
        if isinstance(info, dict) and info.get("is_same") is False:
            return fsdp2_names.restore(str(api), back) if back else str(api)
    return None


def layer_profile(rows: Sequence[RowDiff]) -> list[LayerError]:
    """Worst matched, non-structural row per layer; modules outside layers are ``embed``/``head``."""
    judged = [
        r for r in rows if r.status in ("ok", "warn", "diverged") and r.kind in ("output", "parameters")
    ]
    seen_layer = False
    buckets: dict[tuple[int, str], list[RowDiff]] = {}
    for r in judged:
        if r.layer is None:
            key = (10**9, "head") if seen_layer else (-1, "embed")
        else:
            seen_layer = True
            key = (r.layer, str(r.layer))
        buckets.setdefault(key, []).append(r)
    out = []
    for (order, label), rs in sorted(buckets.items()):
        worst = max(rs, key=lambda r: r.rel_err if r.rel_err is not None else -1.0)
        cos = [r.cosine for r in rs if r.cosine is not None]
        out.append(
            LayerError(
                label=label,
                order=order,
                rel_err=worst.rel_err,
                cosine=min(cos) if cos else None,
                module=worst.module,
            )
        )
    return out


def summarise(
    csv: Path, pair: Pair, *, da_json: Path | None = None, back: Mapping[str, str] | None = None
) -> PairComparison:
    rows, total, shape_only, tensor = read_rows(csv, back)
    matched = [r for r in rows if r.status != "unmatched"]
    judged = [r for r in matched if r.status in ("ok", "warn", "diverged")]
    base = {
        "pair_id": pair.pair_id,
        "request_id": pair.request_id,
        "backend": pair.backend,
        "task": "tensor" if tensor else "statistics",
        "scoped": pair.scoped,
        "rows_total": total,
        "rows_matched": len(matched),
        "rows_unmatched": total - len(matched),
        "rows_structural": sum(r.status == "structural" for r in matched),
        "rows_shape_only_error": shape_only,
        "msprobe_first_diff": _msprobe_first_diff(da_json, back),
    }
    if not judged:
        return PairComparison(
            status="failed",
            error=(
                f"msprobe matched {len(matched)} of {total} rows and none carries a metric; the two dumps "
                "do not line up (a different model or dump level on the two sides)"
            ),
            **base,
        )
    first = next((r for r in judged if r.status == "diverged" and r.kind in ("output", "parameters")), None)
    worst = sorted(judged, key=lambda r: -(r.rel_err if r.rel_err is not None else (1 - (r.cosine or 1))))[:5]
    rels = [r.rel_err for r in judged if r.rel_err is not None and r.kind == "output"]
    coss = [r.cosine for r in judged if r.cosine is not None and r.kind == "output"]
    maes = [r.max_abs_err for r in judged if r.max_abs_err is not None and r.kind == "output"]
    statuses = {r.status for r in judged}
    verdict: Verdict = (
        "diverged" if "diverged" in statuses else "suspicious" if "warn" in statuses else "healthy"
    )
    return PairComparison(
        status="ok",
        verdict=verdict,
        first_divergence=first.module if first else None,
        first_divergence_target=first.target if first else None,
        first_divergence_row=first,
        worst_rows=worst,
        layer_profile=layer_profile(rows),
        max_rel_err=max(rels) if rels else None,
        min_cosine=min(coss) if coss else None,
        max_abs_err=max(maes) if maes else None,
        **base,
    )


def _write_rows_csv(path: Path, csv: Path, back: Mapping[str, str] | None = None) -> None:
    import csv as csvmod

    rows, _, _, _ = read_rows(csv, back)
    fields = [
        "module",
        "kind",
        "layer",
        "status",
        "rel_err",
        "cosine",
        "max_abs_err",
        "msprobe_result",
        "target",
        "golden",
        "note",
    ]
    with atomic_path(path) as tmp, tmp.open("w", newline="") as fh:
        w = csvmod.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in rows:
            if r.status != "unmatched":
                w.writerow({k: getattr(r, k) for k in fields})
