"""Per-request token records: where verl has vLLM's log-probs and its own for the same tokens.

Called from the patched ``RayPPOTrainer.fit`` (hybrid) and ``SeparateRayPPOTrainer.
_fit_compute_log_prob`` (which ``FullyAsyncTrainer`` inherits), right after verl's own
``calculate_debug_metrics(batch)``: the one place where the batch holds both
``rollout_log_probs`` (vLLM's, ``rollout.calculate_log_probs=true``) and ``old_log_probs`` (the
training engine's recomputation of the same tokens)::

    token_mismatch.record(batch, global_step=self.global_steps, verl_metrics=metrics)

It writes, when ``$VERL_CONSISTENCY_TOKEN_LEVEL=1`` and ``$VERL_CONSISTENCY_RUN_DIR`` is set:

* ``<run>/token_mismatch.jsonl``: one :class:`TokenRecord` per response (first vLLM request id,
  prompt index and uid, global step, response length, the peers' figures for that response, and
  its per-token ``|Δ log p|``: inline when short, else a slice of the float16 side file
  ``<run>/token_mismatch.f16``);
* ``<run>/token_mismatch_steps.jsonl``: one :class:`StepRecord` per batch, with the same figures
  over the whole batch next to the values verl itself logged for that batch.

The figures are defined exactly as the peers define them (``FIGURES``) and computed in
``token_figures`` (whole-batch tensor ops, no per-token Python loop, no in-place op on the batch:
training is never changed). The batch lives on the driver's CPU in verl 0.8.0, so there is no
device sync beyond verl's own ``.item()`` calls. This module reads the batch and writes the files;
the output row of a PROMPTS_ONLY run (``next_token.jsonl``) is ``next_token``'s.

Nothing here imports torch or verl at import time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from verl_consistency.contracts import env, records
from verl_consistency.contracts.token_records import (
    CALL_OFFSETS,
    CALL_VERSIONS,
    INLINE_MAX,
    SIDE_FILE,
    STEP_LOG,
    TOKEN_LOG,
    VERL_KEYS,
    StepRecord,
    TokenRecord,
    threshold,
)
from verl_consistency.patches.hooks.training.token_figures import TokenFigures, compute, spans


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """The records are on: asked for (``--token-level`` or a check run) and a run folder to write to."""
    e = os.environ if environ is None else environ
    return env.flag(env.TOKEN_LEVEL, dict(e)) and bool(e.get(env.RUN_DIR, "").strip())


class _Writer:
    """The run's three files, opened once per process, appended to, flushed per batch."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.tokens: IO[bytes] = (run_dir / TOKEN_LOG).open("ab")
        self.steps: IO[bytes] = (run_dir / STEP_LOG).open("ab")
        self.side: IO[bytes] = (run_dir / SIDE_FILE).open("ab")

    def close(self) -> None:
        for fh in (self.tokens, self.steps, self.side):
            fh.close()


_WRITER: tuple[int, str, _Writer] | None = None


def _writer(run_dir: Path) -> _Writer:
    global _WRITER
    key = (os.getpid(), str(run_dir))
    if _WRITER is None or (_WRITER[0], _WRITER[1]) != key:
        _WRITER = (key[0], key[1], _Writer(run_dir))
    return _WRITER[2]


def reset_for_tests() -> None:
    global _WRITER
    if _WRITER is not None:
        _WRITER[2].close()
    _WRITER = None


def _column(non_tensor: Mapping[str, Any], key: str, n: int) -> list[Any]:
    value = non_tensor.get(key)
    if value is None:
        return [None] * n
    out = value.tolist() if hasattr(value, "tolist") else list(value)
    return [x.item() if hasattr(x, "item") else x for x in out]


def _response_mask(batch: Any) -> Any:
    """The mask verl's ``calculate_debug_metrics`` uses, sliced the same way."""
    td = batch.batch
    resp_len = int(td["responses"].shape[1])
    # TensorDict refuses `key in td`; its keys() view answers membership
    if "response_mask" in td.keys():  # noqa: SIM118
        mask = td["response_mask"]
    elif "attention_mask" in td.keys():  # noqa: SIM118
        mask = td["attention_mask"]
    else:
        import torch

        mask = torch.ones_like(td["rollout_log_probs"])
    return mask[:, -resp_len:]


def record(
    batch: Any,
    *,
    global_step: int,
    verl_metrics: Mapping[str, Any] | MutableMapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """The trainers' entry point. Returns how many token records were written (0 when off).

    A failure here is reported on stderr and skipped, never raised: a diagnostic must not stop a
    training run (a bad ``VERL_CONSISTENCY_TOKEN_THRESHOLD`` is refused by ``verl-consistency run``).
    """
    e = os.environ if environ is None else environ
    if not enabled(e):
        return 0
    try:
        return _record(batch, global_step=global_step, verl_metrics=verl_metrics, e=e)
    except Exception as exc:
        warn(f"token records of step {global_step} skipped: {type(exc).__name__}: {exc}")
        return 0


def warn(message: str) -> None:
    """A skipped record, on stderr: the hooks never raise into training."""
    import sys

    print(f"[verl-consistency] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class _Batch:
    """What one batch's records are made of: its figures and the columns verl's batch carries."""

    figures: TokenFigures
    spans: list[int]
    """Per response, the positions of ``|Δ log p|`` its record keeps."""
    request_ids: list[Any]
    indices: list[Any]
    uids: list[Any]
    call_versions: list[Any]
    """Per response, the weights of each generate call that made it (``hooks/rollout/request_ids.py``)."""
    call_offsets: list[Any]


def _record(
    batch: Any,
    *,
    global_step: int,
    verl_metrics: Mapping[str, Any] | MutableMapping[str, Any] | None,
    e: Mapping[str, str],
) -> int:
    td = batch.batch
    keys = td.keys()
    if "rollout_log_probs" not in keys or "old_log_probs" not in keys:
        return 0
    thresh = threshold(e)
    mask = _response_mask(batch)
    figs = compute(td["old_log_probs"], td["rollout_log_probs"], mask, thresh=thresh)
    n = len(figs.per_response)
    nt = batch.non_tensor_batch
    b = _Batch(
        figs,
        spans(mask),
        _column(nt, "request_id", n),
        _column(nt, "index", n),
        _column(nt, "uid", n),
        _column(nt, CALL_VERSIONS, n),
        _column(nt, CALL_OFFSETS, n),
    )
    w = _writer(Path(e[env.RUN_DIR].strip()))
    header = {
        "timestamp": records.now(),
        "pid": os.getpid(),
        "global_step": int(global_step),
        "threshold": thresh,
    }
    _write_tokens(w, b, header)
    step = StepRecord(**header, responses=n, verl=_verl_values(verl_metrics), **figs.batch.model_dump())
    w.steps.write(orjson.dumps(step.model_dump(mode="json", exclude_none=True)) + b"\n")
    w.steps.flush()
    return n


def _write_tokens(w: _Writer, b: _Batch, header: dict[str, Any]) -> None:
    """One :class:`TokenRecord` per response; a response longer than ``INLINE_MAX`` positions keeps
    its ``|Δ log p|`` in the float16 side file (one write per batch), a shorter one inline."""
    import numpy as np
    import torch

    per_pos = b.figures.abs_diff
    f16 = per_pos.to(torch.float16).numpy()
    side_base = w.side.tell() // 2
    side_chunks: list[bytes] = []
    lines: list[bytes] = []
    for i, (fig, span) in enumerate(zip(b.figures.per_response, b.spans, strict=True)):
        rec: dict[str, Any] = {
            **header,
            "sample": i,
            "request_id": None if b.request_ids[i] is None else str(b.request_ids[i]),
            "index": b.indices[i],
            "uid": None if b.uids[i] is None else str(b.uids[i]),
            "response_length": fig.tokens,
            "first_above": b.figures.first_above[i],
            **_calls(b.call_versions[i], b.call_offsets[i]),
            **fig.model_dump(),
        }
        if span <= INLINE_MAX:
            rec["abs_logp_diff"] = [
                None if math.isnan(x) else round(x, 6) for x in per_pos[i, :span].tolist()
            ]
        else:
            rec["side_offset"] = side_base
            rec["side_length"] = span
            side_chunks.append(np.ascontiguousarray(f16[i, :span]).tobytes())
            side_base += span
        lines.append(orjson.dumps(TokenRecord.model_validate(rec).model_dump(mode="json", exclude_none=True)))
    if side_chunks:
        w.side.write(b"".join(side_chunks))
        w.side.flush()
    w.tokens.write(b"\n".join(lines) + b"\n" if lines else b"")
    w.tokens.flush()


def _calls(versions: Any, offsets: Any) -> dict[str, Any]:
    """The record's ``rollout_weight_versions`` and ``rollout_version_offsets`` (none when unknown)."""
    if versions is None or offsets is None:
        return {}
    vs = [
        None if v is None else int(v)
        for v in (versions.tolist() if hasattr(versions, "tolist") else versions)
    ]
    offs = [int(o) for o in (offsets.tolist() if hasattr(offsets, "tolist") else offsets)]
    if not vs or len(vs) != len(offs):
        return {}
    return {"rollout_weight_versions": vs, "rollout_version_offsets": offs}


def _verl_values(verl_metrics: Mapping[str, Any] | None) -> dict[str, float | int | None]:
    """What verl itself logged for the batch (``VERL_KEYS``), NaN as None."""
    values: dict[str, float | int | None] = {}
    for key in VERL_KEYS:
        if verl_metrics is not None and key in verl_metrics:
            v = verl_metrics[key]
            v = float(v) if not isinstance(v, int) else v
            values[key] = v if not (isinstance(v, float) and math.isnan(v)) else None
    return values


V1_FIELDS = ("request_id", "index", "uid", "extra_fields")
"""What :func:`record_v1` reads from TransferQueue beside the batch verl's metrics saw."""


def record_v1(
    data: Any,
    meta: Any,
    *,
    global_step: int,
    verl_metrics: Mapping[str, Any] | MutableMapping[str, Any] | None = None,
    fetch: Any = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """verl 0.9 V1 ``PPOTrainer._compute_old_log_prob``, right after ``calculate_debug_metrics(data)``.

    ``data`` is the padded ``DataProto`` verl's metrics saw (``old_log_probs``,
    ``rollout_log_probs``, ``response_mask``, ``responses``; no per-sample ids), ``meta`` the
    step's ``KVBatchMeta``. The ids are read from TransferQueue (``fetch``: ``tq.kv_batch_get``
    unless a test passes its own) only when the records are on, and verl's synthetic padding
    rows (``is_padding`` tags) are left out. A PROMPTS_ONLY batch has no vLLM log-prob to
    compare (the trim leaves NaN in ``rollout_log_probs``), so it writes nothing, as in 0.8.0
    where the trim drops that key. Never raises (see :func:`record`).
    """
    e = os.environ if environ is None else environ
    if not enabled(e) or env.flag(env.PROMPTS_ONLY, dict(e)):
        return 0
    try:
        import numpy as np

        if fetch is None:
            import transfer_queue as tq

            fetch = tq.kv_batch_get
        got = fetch(keys=list(meta.keys), partition_id=meta.partition_id, select_fields=list(V1_FIELDS))
        n = len(meta.keys)
        for key in V1_FIELDS:
            if key in got.keys():  # noqa: SIM118 (a TensorDict refuses `key in td`)
                values = list(got[key].tolist() if hasattr(got[key], "tolist") else got[key])
                if key == "extra_fields":  # one dict per sample: the calls' weights live in it
                    for sub in (CALL_VERSIONS, CALL_OFFSETS):
                        column = np.empty(n, dtype=object)
                        for i, x in enumerate(values):  # lists: one by one, never broadcast as a 2-D array
                            column[i] = x.get(sub) if isinstance(x, dict) else None
                        data.non_tensor_batch[sub] = column
                    continue
                column = np.empty(n, dtype=object)
                column[:] = values
                data.non_tensor_batch[key] = column
        keep = [i for i, tag in enumerate(meta.tags) if not (tag or {}).get("is_padding", False)]
        if len(keep) != n:
            data = data.select_idxs(np.array(keep, dtype=np.int64))
    except Exception as exc:
        warn(f"token records of step {global_step} skipped: {type(exc).__name__}: {exc}")
        return 0
    return record(data, global_step=global_step, verl_metrics=verl_metrics, environ=e)
