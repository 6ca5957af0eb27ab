"""The output row: both engines' prediction for the prompt's next token, next to the prompt's lanes.

The layer view compares each request's prompt rows (``prompt_rows``); its output row is the last
prompt position, whose logits vLLM sampled response token 0 from. A PROMPTS_ONLY run trains on
no response, so that is the one position both engines computed; a ride-along run (the training
forward covers the response too) has it at ``begin + prompt_len - 1`` of each row. Three steps,
in three places of verl:

* vLLM's token and log-prob there: a PROMPTS_ONLY trim (``prompts_only``) keeps them
  (:func:`stash_next_token`, :func:`stash_next_token_sample` for verl 0.9's V1 samples) before it
  drops the responses; ride-along reads them from the micro batch's ``responses[:, 0]`` and
  ``rollout_log_probs[:, 0]`` (:func:`rollout_next_tokens`);
* the training hook (``micro_batch_dump``) puts a read-only forward hook on the output head for each
  dumped micro batch (:class:`NextTokenProbe`): ``lm_head``, or Megatron's ``output_layer``
  (:func:`output_head`);
* the probe writes one :class:`NextTokenRecord` per wanted row to ``actor/<pid>/next_token.jsonl``.

On when ``token_mismatch.enabled()`` is. Nothing here imports torch or verl at import time.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from verl_consistency.contracts import records
from verl_consistency.contracts.batch_fields import PREFILL_ROWS
from verl_consistency.contracts.token_records import (
    NEXT_TOKEN,
    NEXT_TOKEN_LOG,
    NEXT_TOKEN_ROLLOUT_LOG_PROB,
    NEXT_TOKEN_TOPK,
    NextTokenRecord,
    head_figures,
)
from verl_consistency.patches.hooks.training.token_mismatch import enabled, warn


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


def _first_of_rows(value: Any) -> list[Any]:
    """Each row's first entry (None for an empty row) of a padded ``[b, n]`` or nested tensor."""
    if getattr(value, "is_nested", False):
        return [row[0].item() if row.numel() else None for row in value.unbind()]
    if value.dim() < 2 or value.shape[1] == 0:
        return [None] * int(value.shape[0])
    return value[:, 0].tolist()


def rollout_next_tokens(micro_batch: Any) -> tuple[list[int | None], list[float | None]] | None:
    """Ride-along: vLLM's response token 0 and its log-prob, per row, read from the micro batch.

    Without the PROMPTS_ONLY trim nothing is stashed: the micro batch still holds vLLM's
    ``responses`` and (with ``rollout.calculate_log_probs=true``) ``rollout_log_probs``, padded
    (``RayPPOTrainer``'s batch) or nested (verl 0.9's V1 path); position 0 of each is what vLLM
    sampled at the last prompt position. None for a trimmed batch (``batch_fields.PREFILL_ROWS``:
    its ``responses`` is the last prompt token) or without rollout log-probs. A row whose token 0
    is masked out, missing or without a finite log-prob gets None.
    """
    from verl.utils import tensordict_utils as tu

    if tu.get(micro_batch, key=PREFILL_ROWS, default=None) is not None:
        return None
    responses = micro_batch.get("responses", None)
    logps = micro_batch.get("rollout_log_probs", None)
    if responses is None or logps is None:
        return None
    tokens, firsts = _first_of_rows(responses), _first_of_rows(logps)
    mask = micro_batch.get("response_mask", None)
    valid = [1] * len(tokens) if mask is None else [v if v is None else int(v) for v in _first_of_rows(mask)]
    if not len(tokens) == len(firsts) == len(valid):
        return None
    ok = [
        bool(v) and t is not None and lp is not None and math.isfinite(float(lp))
        for t, lp, v in zip(tokens, firsts, valid, strict=True)
    ]
    return (
        [int(t) if good else None for t, good in zip(tokens, ok, strict=True)],
        [float(lp) if good else None for lp, good in zip(firsts, ok, strict=True)],
    )


@dataclass(frozen=True)
class WantedRow:
    """One row of a micro batch the probe records: where its logits are, and what vLLM said."""

    position: int
    """Its last prompt position in the logits flattened to ``[positions, vocab]``; -1: the last."""
    token: int
    """The token vLLM sampled there (response token 0)."""
    rollout_log_prob: float
    """vLLM's log-prob of it."""
    topk: list[tuple[int, float]] | None = None
    """vLLM's top-k ``(token, log p)`` there, when the rollout asked for it."""


@dataclass(frozen=True)
class DumpStep:
    """The msprobe step a record belongs to: ``update_actor_log.jsonl``'s step, dump_path and phase."""

    step: int
    dump_path: str | None
    phase: str


class NextTokenProbe:
    """A read-only forward hook on ``lm_head`` for one micro batch: each wanted row's last-position logits.

    The hook copies one ``[vocab]`` row per wanted request at hook time, before verl divides the
    logits by the temperature in place, and returns None, so the forward is unchanged. One row
    (a micro batch of one) is the logits' last position; a packed micro batch names each
    request's last position in the logits flattened to ``[positions, vocab]`` (``last_positions``,
    which the training hook derives from verl's layout: ``micro_batch_dump.last_positions``).
    """

    def __init__(self, handle: Any, rows: list[WantedRow], temperature: float) -> None:
        self.handle = handle
        self.rows = rows
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
        come without ``last_positions`` (their positions in the logits would be a guess). vLLM's
        token comes from the PROMPTS_ONLY stash, else (ride-along, and only with ``last_positions``
        from the layout: a response follows the prompt there) from the micro batch's responses
        (:func:`rollout_next_tokens`).
        """
        if not enabled():
            return None
        from verl.utils import tensordict_utils as tu

        tokens = tu.get(micro_batch, key=NEXT_TOKEN, default=None)
        logps = tu.get(micro_batch, key=NEXT_TOKEN_ROLLOUT_LOG_PROB, default=None)
        if tokens is None or logps is None:
            # ride-along: vLLM's token is still the response's first (only with known positions)
            found = rollout_next_tokens(micro_batch) if last_positions is not None else None
            if found is None:
                return None
            tokens, logps = found
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
            WantedRow(int(last_positions[i]), int(tokens[i]), float(logps[i]), _topk_pairs(topks[i]))
            for i in wanted
            if tokens[i] is not None and logps[i] is not None
        ]
        if not rows:
            return None
        found = output_head(model)
        if found is None:
            return None
        head, sequence_first = found
        temp = tu.get(micro_batch, key="temperature", default=1.0)
        temp = float(temp.flatten()[0]) if hasattr(temp, "flatten") else float(temp)
        probe = cls(None, rows, temp or 1.0)

        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            try:
                logits = output[0] if isinstance(output, tuple) else output
                if sequence_first:  # Megatron's [s, b, vocab]: the positions as [b, s] flattens them
                    logits = logits.transpose(0, 1)
                flat = logits.reshape(-1, logits.shape[-1])
                probe.last = [flat[row.position].detach().float().clone() for row in probe.rows]
            except Exception as exc:  # never break the forward
                warn(f"next-token probe skipped: {type(exc).__name__}: {exc}")

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
        where = DumpStep(step, dump_path, phase)
        try:
            for logits, row, request_id in zip(self.last, self.rows, request_ids, strict=True):
                self._write(dump_dir, logits, row, where, request_id)
        except Exception as exc:
            warn(f"next-token record of step {step} skipped: {type(exc).__name__}: {exc}")

    def _write(
        self, dump_dir: Path, logits: Any, row: WantedRow, where: DumpStep, request_id: str | None
    ) -> None:
        """Append one row's record to ``dump_dir/next_token.jsonl``."""
        rec = self.record(logits, row, where, request_id)
        with (dump_dir / NEXT_TOKEN_LOG).open("ab") as fh:
            fh.write(orjson.dumps(rec.model_dump(mode="json", exclude_none=True)) + b"\n")

    def record(self, logits: Any, row: WantedRow, where: DumpStep, request_id: str | None) -> NextTokenRecord:
        """Both engines on ``row.token``: the training forward's log-softmax of its copied logits
        (at the batch's temperature, as verl's log-prob), next to vLLM's; with the head figures
        when vLLM's top-k came along."""
        import torch

        logp = torch.log_softmax(logits / self.temperature, dim=-1)
        top = int(torch.argmax(logp).item())
        train = float(logp[row.token].item())
        head: dict[str, Any] = {}
        if row.topk:
            train_topk = logp[torch.tensor([t for t, _ in row.topk])].tolist()
            head = {"rollout_topk": row.topk, **head_figures(row.topk, train_topk, top).model_dump()}
        return NextTokenRecord(
            timestamp=records.now(),
            pid=os.getpid(),
            step=where.step,
            dump_path=where.dump_path,
            phase=where.phase,
            request_id=request_id,
            token=row.token,
            rollout_log_prob=row.rollout_log_prob,
            train_log_prob=train,
            abs_diff=abs(train - row.rollout_log_prob),
            train_argmax=top,
            train_argmax_log_prob=float(logp[top].item()),
            temperature=self.temperature,
            **head,
        )


def output_head(model: Any) -> tuple[Any, bool] | None:
    """The module whose forward output is the logits, and whether they are sequence-first.

    A transformers model's ``lm_head`` (``[b, s, vocab]``, or ``[1, t, vocab]`` packed); otherwise
    megatron-core's ``GPTModel.output_layer`` under whatever wrappers the engine put around it
    (DDP, ``Float16Module``), whose logits are ``[s, b, vocab]`` before the model turns them
    batch-first. None when neither is there (the probe is then not attached).
    """
    head = getattr(model, "lm_head", None)
    if head is None and hasattr(model, "get_output_embeddings"):
        head = model.get_output_embeddings()
    if head is not None:
        return head, False
    named = getattr(model, "named_modules", None)
    if callable(named):
        for name, module in named():
            if name == "output_layer" or name.endswith(".output_layer"):
                return module, True
    return None


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
