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

The figures are defined exactly as the peers define them (``FIGURES``). Everything is computed
with a handful of whole-batch tensor ops and one ``tolist()`` per array: no per-token Python
loop, and no in-place op on the batch (training is never changed). The batch lives on the
driver's CPU in verl 0.8.0, so there is no device sync beyond verl's own ``.item()`` calls.

Nothing here imports torch or verl at import time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import IO, Any

import orjson

from verl_consistency.contracts import env, records
from verl_consistency.contracts.token_records import (
    DEFAULT_THRESHOLD,
    INLINE_MAX,
    NEXT_TOKEN,
    NEXT_TOKEN_LOG,
    NEXT_TOKEN_ROLLOUT_LOG_PROB,
    NEXT_TOKEN_TOPK,
    SIDE_FILE,
    STEP_LOG,
    TOKEN_LOG,
    VERL_KEYS,
    Figures,
    NextTokenRecord,
    StepRecord,
    TokenRecord,
    head_figures,
    threshold,
)


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    e = os.environ if environ is None else environ
    return env.flag(env.TOKEN_LEVEL, dict(e)) and bool(e.get(env.RUN_DIR, "").strip())


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def compute(
    old_log_probs: Any, rollout_log_probs: Any, mask: Any, *, thresh: float = DEFAULT_THRESHOLD
) -> tuple[Figures, list[Figures], list[int | None], Any]:
    """The batch figures, the per-response figures, the first position above ``thresh``, and
    the per-position ``|Δ log p|`` matrix (float32, NaN where masked). Pure: never writes to its inputs.

    Works on the valid tokens only, packed row-major: exactly the vector verl's
    ``torch.masked_select`` builds, so the batch figures are verl's own ops on verl's own values,
    and the per-response figures are segment reductions over the same vector.
    """
    import torch

    old = old_log_probs.detach().float()
    roll = rollout_log_probs.detach().float()
    m = mask.detach().bool()
    if not (old.shape == roll.shape == m.shape):
        raise ValueError(
            f"old_log_probs {tuple(old.shape)}, rollout_log_probs {tuple(roll.shape)} and the response "
            f"mask {tuple(m.shape)} must have one shape"
        )
    n_rows = int(m.shape[0])
    rows, cols = m.nonzero(as_tuple=True)
    counts = torch.bincount(rows, minlength=n_rows) if rows.numel() else torch.zeros(n_rows, dtype=torch.long)
    o, r = old[rows, cols], roll[rows, cols]
    po, pr = torch.exp(o), torch.exp(r)
    pd = torch.abs(po - pr)
    d = o - r
    ad = torch.abs(d)
    k3 = torch.exp(d) - d - 1
    mult = torch.exp(ad)
    n_all = int(o.numel())

    # -- the batch, with the very ops verl uses on the same masked_select vector
    batch = Figures(tokens=n_all)
    if n_all:
        stats = torch.stack(
            [
                pd.max(),
                pd.mean(),
                pd.std(),
                torch.corrcoef(torch.stack([po, pr], dim=0))[0][1],
                ad.max(),
                mult.mean(),
                (-d).mean(),
                k3.mean(),
            ]
        ).tolist()
        batch = Figures(
            tokens=n_all,
            probs_diff_max=_finite(stats[0]),
            probs_diff_mean=_finite(stats[1]),
            probs_diff_std=_finite(stats[2]),
            pearson_corr=_finite(stats[3]),
            max_abs_diff=_finite(stats[4]),
            token_mult_prob_error=_finite(stats[5]),
            kl=_finite(stats[6]),
            k3_kl=_finite(stats[7]),
        )

    # -- per response: segment reductions over the packed vector (rows are contiguous)
    def seg(x: Any, how: str = "sum") -> Any:
        if not n_all:
            return torch.zeros(n_rows)
        return torch.segment_reduce(x, how, lengths=counts)

    nr = counts.clamp(min=1).float()
    pd_mean = seg(pd) / nr
    mo, mr = seg(po) / nr, seg(pr) / nr
    xo, xr = po - mo[rows], pr - mr[rows]
    corr = seg(xo * xr) / torch.sqrt(seg(xo * xo) * seg(xr * xr))
    pd_var = seg((pd - pd_mean[rows]) ** 2) / (counts - 1).float()
    row_ad = seg(ad) / nr
    if n_all:
        batch.abs_diff = _finite(float(row_ad[counts > 0].mean().item()))
    per_rows = torch.stack(
        [
            counts.float(),
            seg(pd, "max"),
            pd_mean,
            torch.sqrt(pd_var),
            corr,
            row_ad,
            seg(mult) / nr,
            seg(-d) / nr,
            seg(k3) / nr,
            seg(ad, "max"),
        ],
        dim=1,
    ).tolist()
    above = ad > thresh
    first = torch.full((n_rows,), -1, dtype=torch.long)
    if bool(above.any()):
        big = torch.full((n_rows,), int(m.shape[1]), dtype=torch.long)
        big.scatter_reduce_(0, rows[above], cols[above], reduce="amin")
        first = torch.where(big < int(m.shape[1]), big, first)
    firsts = [None if f < 0 else int(f) for f in first.tolist()]
    per: list[Figures] = []
    for row in per_rows:
        n = int(row[0])
        if n == 0:
            per.append(Figures(tokens=0))
            continue
        per.append(
            Figures(
                tokens=n,
                probs_diff_max=_finite(row[1]),
                probs_diff_mean=_finite(row[2]),
                probs_diff_std=_finite(row[3]) if n > 1 else None,
                pearson_corr=_finite(row[4]) if n > 1 else None,
                abs_diff=_finite(row[5]),
                token_mult_prob_error=_finite(row[6]),
                kl=_finite(row[7]),
                k3_kl=_finite(row[8]),
                max_abs_diff=_finite(row[9]),
            )
        )
    per_pos = torch.full(tuple(m.shape), float("nan"))
    per_pos[rows, cols] = ad
    return batch, per, firsts, per_pos


def spans(mask: Any) -> list[int]:
    """Per row, the last valid position + 1: the span of ``|Δ log p|`` a record keeps."""
    import torch

    m = mask.detach().bool()
    if not m.numel():
        return [0] * int(m.shape[0])
    rows, cols = m.nonzero(as_tuple=True)
    out = torch.zeros(int(m.shape[0]), dtype=torch.long)
    out.scatter_reduce_(0, rows, cols + 1, reduce="amax")
    return [int(x) for x in out.tolist()]


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
        _warn(f"token records of step {global_step} skipped: {type(exc).__name__}: {exc}")
        return 0


def _warn(message: str) -> None:
    import sys

    print(f"[verl-consistency] {message}", file=sys.stderr, flush=True)


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
    import numpy as np

    thresh = threshold(e)
    mask = _response_mask(batch)
    figs, per, firsts, per_pos = compute(td["old_log_probs"], td["rollout_log_probs"], mask, thresh=thresh)
    n = len(per)
    nt = batch.non_tensor_batch
    ids, idx, uids = _column(nt, "request_id", n), _column(nt, "index", n), _column(nt, "uid", n)

    run_dir = Path(e[env.RUN_DIR].strip())
    w = _writer(run_dir)
    now, pid = records.now(), os.getpid()
    import torch

    row_spans = spans(mask)
    f16 = per_pos.to(torch.float16).numpy()
    side_base = w.side.tell() // 2
    side_chunks: list[bytes] = []
    lines: list[bytes] = []
    for i in range(n):
        span = row_spans[i]
        rec: dict[str, Any] = {
            "timestamp": now,
            "pid": pid,
            "global_step": int(global_step),
            "sample": i,
            "request_id": None if ids[i] is None else str(ids[i]),
            "index": idx[i],
            "uid": None if uids[i] is None else str(uids[i]),
            "response_length": per[i].tokens,
            "threshold": thresh,
            "first_above": firsts[i],
        }
        rec.update(per[i].model_dump())
        if span <= INLINE_MAX:
            row = per_pos[i, :span].tolist()
            rec["abs_logp_diff"] = [None if math.isnan(x) else round(x, 6) for x in row]
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
    verl_values: dict[str, float | int | None] = {}
    for key in VERL_KEYS:
        if verl_metrics is not None and key in verl_metrics:
            v = verl_metrics[key]
            v = float(v) if not isinstance(v, int) else v
            verl_values[key] = v if not (isinstance(v, float) and math.isnan(v)) else None
    step = StepRecord(
        timestamp=now,
        pid=pid,
        global_step=int(global_step),
        responses=n,
        threshold=thresh,
        verl=verl_values,
        **figs.model_dump(),
    )
    w.steps.write(orjson.dumps(step.model_dump(mode="json", exclude_none=True)) + b"\n")
    w.steps.flush()
    return n


V1_FIELDS = ("request_id", "index", "uid")
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
                column = np.empty(n, dtype=object)
                column[:] = values
                data.non_tensor_batch[key] = column
        keep = [i for i, tag in enumerate(meta.tags) if not (tag or {}).get("is_padding", False)]
        if len(keep) != n:
            data = data.select_idxs(np.array(keep, dtype=np.int64))
    except Exception as exc:
        _warn(f"token records of step {global_step} skipped: {type(exc).__name__}: {exc}")
        return 0
    return record(data, global_step=global_step, verl_metrics=verl_metrics, environ=e)


# --------------------------------------------------------------------------------------------
# The output row: both engines' prediction for the prompt's next token (PROMPTS_ONLY runs)
# --------------------------------------------------------------------------------------------


def _topk_pairs(value: Any) -> list[tuple[int, float]] | None:
    """One row of :data:`NEXT_TOKEN_TOPK` as ``(token, log p)`` pairs with a finite log p, or None.

    None too for a row of another shape: the probe runs inside training, which a malformed
    diagnostic column must not stop (the record then simply has no head figures).
    """
    if value is None:
        return None
    try:
        rows = value.tolist() if hasattr(value, "tolist") else list(value)
        out = [(int(t), float(v)) for t, v in rows if math.isfinite(float(v))]
    except (TypeError, ValueError):
        return None
    return out or None


def stash_next_token(batch: Any) -> bool:
    """PROMPTS_ONLY trim, before it drops the responses: keep vLLM's next-token prediction.

    vLLM's prefill of the prompt ends with the logits at the last prompt position, from which it
    sampled response token 0; with ``rollout.calculate_log_probs=true`` verl keeps its log-prob in
    ``rollout_log_probs[:, 0]``. That is the only thing vLLM tells verl about its output
    distribution (verl asks for the sampled token's log-prob only). Both go into two new
    ``non_tensor_batch`` keys, which verl's engines carry into every micro batch as they carry
    ``request_id``. A batch that carries vLLM's top-k (:data:`NEXT_TOKEN_TOPK`) keeps it, emptied on
    the rows without a valid response token 0. Returns False (nothing stashed) without rollout
    log-probs. Read-only on tensors.
    """
    if not enabled():
        return False
    td = batch.batch
    keys = td.keys()
    if "rollout_log_probs" not in keys or "responses" not in keys:
        return False
    import numpy as np

    tokens = td["responses"][:, 0].tolist()
    logps = td["rollout_log_probs"][:, 0].float().tolist()
    valid = td["response_mask"][:, 0].tolist() if "response_mask" in keys else [1] * len(tokens)
    tok = np.empty(len(tokens), dtype=object)
    lp = np.empty(len(tokens), dtype=object)
    tok[:] = [int(t) if v else None for t, v in zip(tokens, valid, strict=True)]
    lp[:] = [float(x) if v else None for x, v in zip(logps, valid, strict=True)]
    batch.non_tensor_batch[NEXT_TOKEN] = tok
    batch.non_tensor_batch[NEXT_TOKEN_ROLLOUT_LOG_PROB] = lp
    if batch.non_tensor_batch.get(NEXT_TOKEN_TOPK) is not None:
        pairs = [
            _topk_pairs(x) if v else None
            for x, v in zip(batch.non_tensor_batch[NEXT_TOKEN_TOPK], valid, strict=True)
        ]
        topk = np.empty(len(tokens), dtype=object)
        topk[:] = [None if x is None else [list(p) for p in x] for x in pairs]
        batch.non_tensor_batch[NEXT_TOKEN_TOPK] = topk
    return True


class NextTokenProbe:
    """A read-only forward hook on ``lm_head`` for one micro batch: each wanted row's last-position logits.

    The hook copies one ``[vocab]`` row per wanted request at hook time, before verl divides the
    logits by the temperature in place, and returns None, so the forward is unchanged. One row
    (a micro batch of one) is the logits' last position; a packed micro batch names each
    request's last position in the logits flattened to ``[positions, vocab]`` (``last_positions``,
    which the training hook derives from verl's layout: ``training.last_positions``).
    """

    def __init__(
        self,
        handle: Any,
        rows: list[tuple[int, int, float, list[tuple[int, float]] | None]],
        temperature: float,
    ) -> None:
        self.handle = handle
        self.rows = rows
        """(position in the flattened logits, or -1; sampled token; vLLM's log-prob; vLLM's top-k
        or None), per wanted row."""
        self.temperature = temperature
        self.last: list[Any] = []

    @classmethod
    def attach(
        cls,
        micro_batch: Any,
        model: Any,
        *,
        wanted: list[int] | None = None,
        last_positions: list[int] | None = None,
    ) -> NextTokenProbe | None:
        """Hook ``lm_head`` for the ``wanted`` row indices (default: the only row) of this micro batch.

        None when the records are off, the micro batch carries no rollout token, or several rows
        come without ``last_positions`` (their positions in the logits would be a guess).
        """
        if not enabled():
            return None
        from verl.utils import tensordict_utils as tu

        tokens = tu.get(micro_batch, key=NEXT_TOKEN, default=None)
        logps = tu.get(micro_batch, key=NEXT_TOKEN_ROLLOUT_LOG_PROB, default=None)
        if tokens is None or logps is None:
            return None
        tokens = list(tokens.tolist() if hasattr(tokens, "tolist") else tokens)
        logps = list(logps.tolist() if hasattr(logps, "tolist") else logps)
        topks = tu.get(micro_batch, key=NEXT_TOKEN_TOPK, default=None)
        topks = (
            [None] * len(tokens)
            if topks is None
            else list(topks.tolist() if hasattr(topks, "tolist") else topks)
        )
        if wanted is None:
            if len(tokens) != 1:
                return None
            wanted, last_positions = [0], [-1]
        if last_positions is None or len(last_positions) != len(tokens):
            if len(tokens) != 1:
                return None
            last_positions = [-1]
        rows = [
            (int(last_positions[i]), int(tokens[i]), float(logps[i]), _topk_pairs(topks[i]))
            for i in wanted
            if tokens[i] is not None and logps[i] is not None
        ]
        if not rows:
            return None
        head = getattr(model, "lm_head", None)
        if head is None and hasattr(model, "get_output_embeddings"):
            head = model.get_output_embeddings()
        if head is None:
            return None
        temp = tu.get(micro_batch, key="temperature", default=1.0)
        temp = float(temp.flatten()[0]) if hasattr(temp, "flatten") else float(temp)
        probe = cls(None, rows, temp or 1.0)

        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            try:
                logits = output[0] if isinstance(output, tuple) else output
                flat = logits.reshape(-1, logits.shape[-1])
                probe.last = [flat[pos].detach().float().clone() for pos, *_ in probe.rows]
            except Exception as exc:  # never break the forward
                _warn(f"next-token probe skipped: {type(exc).__name__}: {exc}")

        probe.handle = head.register_forward_hook(hook)
        return probe

    def detach(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def write(
        self, dump_dir: Path, *, step: int, dump_path: str | None, phase: str, request_ids: list[str | None]
    ) -> None:
        """One record per wanted row, named by ``request_ids`` (the same order as ``wanted``)."""
        if not self.last:
            return
        try:
            for logits, (_, token, rollout_log_prob, topk), request_id in zip(
                self.last, self.rows, request_ids, strict=True
            ):
                self._write(
                    dump_dir,
                    logits,
                    token,
                    rollout_log_prob,
                    topk,
                    step=step,
                    dump_path=dump_path,
                    phase=phase,
                    request_id=request_id,
                )
        except Exception as exc:
            _warn(f"next-token record of step {step} skipped: {type(exc).__name__}: {exc}")

    def _write(
        self,
        dump_dir: Path,
        logits: Any,
        token: int,
        rollout_log_prob: float,
        topk: list[tuple[int, float]] | None = None,
        *,
        step: int,
        dump_path: str | None,
        phase: str,
        request_id: str | None,
    ) -> None:
        import torch

        logp = torch.log_softmax(logits / self.temperature, dim=-1)
        top = int(torch.argmax(logp).item())
        train = float(logp[token].item())
        head: dict[str, Any] = {}
        if topk:
            train_topk = logp[torch.tensor([t for t, _ in topk])].tolist()
            head = {"rollout_topk": topk, **head_figures(topk, train_topk, top).model_dump()}
        rec = NextTokenRecord(
            timestamp=records.now(),
            pid=os.getpid(),
            step=step,
            dump_path=dump_path,
            phase=phase,
            request_id=request_id,
            token=token,
            rollout_log_prob=rollout_log_prob,
            train_log_prob=train,
            abs_diff=abs(train - rollout_log_prob),
            train_argmax=top,
            train_argmax_log_prob=float(logp[top].item()),
            temperature=self.temperature,
            **head,
        )
        with (dump_dir / NEXT_TOKEN_LOG).open("ab") as fh:
            fh.write(orjson.dumps(rec.model_dump(mode="json", exclude_none=True)) + b"\n")


def stash_next_token_sample(field: dict[str, Any]) -> bool:
    """verl 0.9 V1: :func:`stash_next_token` for one TransferQueue sample (1-D tensors).

    The V1 trim runs per sample in the agent loop, before TransferQueue; the two keys become
    fields of their own, which the engines see in every micro batch as they see ``request_id``.
    Always sets both keys when the records are on and the sample has rollout log-probs, so that
    every sample of a partition has the same fields.
    """
    if not enabled():
        return False
    logps, responses = field.get("rollout_log_probs"), field.get("responses")
    if logps is None or responses is None:
        return False
    mask = field.get("response_mask")
    valid = len(responses) > 0 and len(logps) > 0 and (mask is None or int(mask[0]) != 0)
    field[NEXT_TOKEN] = int(responses[0]) if valid else None
    field[NEXT_TOKEN_ROLLOUT_LOG_PROB] = float(logps[0]) if valid else None
    if NEXT_TOKEN_TOPK in field:  # only where the rollout filled it (see NEXT_TOKEN_TOPK)
        pairs = _topk_pairs(field[NEXT_TOKEN_TOPK]) if valid else None
        field[NEXT_TOKEN_TOPK] = None if pairs is None else [list(p) for p in pairs]
    return True
