"""Judge msprobe's compare table: which rows count, each row's status, and a pair's verdict.

:mod:`.compare` runs msprobe on each pair; this module reads msprobe's table back and
summarises it our way, because read raw it misleads:

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

The healthy/diverged thresholds are defined here once: :func:`judge` applies them to a row, and
the report colours a cell by what :func:`judge` says.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from verl_consistency.contracts.atomic import atomic_path
from verl_consistency.postprocess.compare import fsdp2_names
from verl_consistency.postprocess.pairing.pair_types import Pair

HEALTHY_REL_ERR = 1e-2
"""Statistics rows: at or below this relative error a row is healthy (a few bf16 roundings,
bf16 ε = 7.8e-3, on a module's max/min/mean/norm)."""
DIVERGED_REL_ERR = 5e-2
"""Statistics rows: above this a row has diverged, more than accumulated rounding explains."""
HEALTHY_COSINE = 0.999
DIVERGED_COSINE = 0.99
HEALTHY_REL_ERR_TENSOR = 4.5e-2
"""Tensor rows (they carry a cosine): the relative L2 error that matches :data:`HEALTHY_COSINE`,
sqrt(2 (1 - 0.999)). Measured on an H200 (vLLM's FlashAttention 3 against the training
engine's SDPA, bf16, 4 layers, ``bench/results/verl-main-ppo-h200-next.log``): 0.010-0.012 at
cosine >= 0.99993 on healthy engines. The statistics bound (1e-2) is 20x stricter than the
cosine bound in tensor mode and called all 71 of those real pairs suspicious."""
DIVERGED_REL_ERR_TENSOR = 1.4e-1
"""Tensor rows: the relative L2 error that matches :data:`DIVERGED_COSINE`, sqrt(2 (1 - 0.99))."""


def rel_bounds(cos: float | None) -> tuple[float, float]:
    """(healthy, diverged) relative-error bounds of a row: the tensor ones when it has a cosine."""
    if cos is not None:
        return HEALTHY_REL_ERR_TENSOR, DIVERGED_REL_ERR_TENSOR
    return HEALTHY_REL_ERR, DIVERGED_REL_ERR


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

STRUCTURAL_TARGET: tuple[tuple[re.Pattern[str], frozenset[str], str], ...] = (
    (
        re.compile(r"(^|\.)GPTModel\.forward\.\d+\.output"),
        frozenset({"output"}),
        "Megatron's GPTModel returns logits (its output_layer runs inside it); msprobe pairs it with "
        "vLLM's model, which returns hidden states (vLLM applies lm_head later, in logits_processor)",
    ),
)
"""(training-side row name, row kinds, why): the same, where only the training name tells (Megatron)."""

_NAME_RE = re.compile(
    r"^(?:Module\.)?(?:(?P<path>.+)\.)?(?P<cls>[A-Za-z_][A-Za-z0-9_]*)\.(?P<dir>forward|backward)"
    r"\.(?P<call>\d+)\.(?P<kind>input|output|parameters|kwargs|parameters_grad)(?:\.(?P<idx>.+))?$"
)
_LAYER_RE = re.compile(r"layers\.(\d+)(?:\.|$)")
_SHAPE_ONLY = ("shape of", "dtype of", "required_grad")

Verdict = Literal["healthy", "suspicious", "diverged", "failed"]
RowStatus = Literal["unmatched", "structural", "no_metric", "ok", "warn", "diverged"]
JUDGED_RANK: dict[str, int] = {"ok": 0, "warn": 1, "diverged": 2}
"""The statuses of a judged row (a metric against the thresholds), least to most severe."""


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


class OutputRow(_Model):
    """The last row of a pair: both engines' prediction for the prompt's next token.

    msprobe never compares logits (vLLM's ``logits_processor`` sees the last position only, HF's
    ``lm_head`` every position, and neither name matches), and RMSNorm hides a scale upstream, so a
    change can stay green in every module row and still change the output. vLLM reports the
    log-prob of the token it sampled after the prompt (``rollout_log_probs[:, 0]``); the training
    forward of the same prompt gives its log-prob of that token at the same position
    (``hooks/next_token.NextTokenProbe``). See ``postprocess/compare/token_level.py``.

    When vLLM also gave its top-k at that position, the head figures compare the distribution,
    not just the one sampled token (``contracts.token_records.HEAD_FIGURES``); None otherwise
    (and in bundles written before they existed).
    """

    token: int
    rollout_log_prob: float
    train_log_prob: float
    abs_diff: float
    train_argmax: int
    status: RowStatus
    note: str = ""
    topk: int | None = None
    """How many of vLLM's top-k tokens the head figures cover."""
    topk_max_abs_diff: float | None = None
    topk_tv: float | None = None
    top1_same: bool | None = None


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
    output: OutputRow | None = None
    """The output row (next-token prediction), when the run recorded one for this pair."""


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


def structural_reason(module: str, kind: str, target: str = "") -> str | None:
    for pattern, kinds, why in STRUCTURAL:
        if kind in kinds and pattern.search(module):
            return why
    for pattern, kinds, why in STRUCTURAL_TARGET:
        if kind in kinds and pattern.search(target):
            return why
    return None


def judge(rel: float | None, cos: float | None) -> RowStatus:
    """A judged row's status from its metrics: the one place the thresholds are applied (the
    report colours a cell by it)."""
    if rel is None and cos is None:
        return "no_metric"
    healthy, diverged = rel_bounds(cos)
    if (rel is not None and rel > diverged) or (cos is not None and cos < DIVERGED_COSINE):
        return "diverged"
    if (rel is not None and rel > healthy) or (cos is not None and cos < HEALTHY_COSINE):
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
        row = functools.partial(RowDiff, target=target, golden=golden, module=module, kind=kind, layer=layer)
        if target in ("", "N/A") or golden in ("", "N/A"):
            rows.append(row(rel_err=None, msprobe_result=result, status="unmatched"))
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
        why = structural_reason(module, kind, target)
        rows.append(
            row(
                rel_err=rel,
                cosine=cos,
                max_abs_err=mae,
                msprobe_result=result,
                status="structural" if why else judge(rel, cos),
                note=why or "",
            )
        )
    return rows, len(df), shape_only, tensor


def msprobe_first_diff(path: Path | None, back: Mapping[str, str] | None = None) -> str | None:
    if path is None or not path.exists():
        return None
    data = json.loads(path.read_text())  # msprobe writes bare NaN/Infinity: not for orjson
    for api, info in data.items():
        if isinstance(info, dict) and info.get("is_same") is False:
            return fsdp2_names.restore(str(api), back) if back else str(api)
    return None


def layer_profile(rows: Sequence[RowDiff]) -> list[LayerError]:
    """Worst matched, non-structural row per layer; modules outside layers are ``embed``/``head``."""
    judged = [r for r in rows if r.status in JUDGED_RANK and r.kind in ("output", "parameters")]
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
    judged = [r for r in matched if r.status in JUDGED_RANK]
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
        "msprobe_first_diff": msprobe_first_diff(da_json, back),
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


def write_rows_csv(path: Path, csv: Path, back: Mapping[str, str] | None = None) -> None:
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
