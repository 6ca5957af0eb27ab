"""Which rows of a training micro batch are a request's prompt: the rows vLLM's prefill computed.

Ride-along collection (issue 35) dumps the training forward that the user's job runs anyway, over
each request's prompt **and** response. vLLM's dump of the same request is its prefill, over the
prompt alone. Attention is causal: position ``i`` of a row depends only on tokens ``0..i`` of that
row (every layer's mask, and packing keeps rows apart), so the row's first ``prompt_len`` positions
are exactly what a forward of the prompt alone computes, and what vLLM's prefill computed. Each
request's lane is cut to those rows; the response rows, which vLLM computed one decode step at a
time (and never dumps), are left out.

Each row's prompt length is read the way verl reads it itself
(``verl/workers/utils/padding.py:no_padding_2_padding``, the same in 0.8.0 and 0.9.1): a nested
``prompts`` (verl 0.9's V1 TransferQueue path) gives ``offsets().diff()``; a left-padded one
(``RayPPOTrainer``'s batch) gives ``attention_mask[:, :prompts.shape[1]].sum(-1)``.

A PROMPTS_ONLY batch marks its rows (``batch_fields.PREFILL_ROWS``): its forward covers the
original prompt exactly, re-split into the trimmed ``prompts`` and a one-token response, so read
from ``prompts`` its last token would look like a response token. The mark wins; there the lanes
come out as before ride-along: the whole row.

Nothing here imports torch or verl at import time.
"""

from __future__ import annotations

import itertools
import numbers
from dataclasses import dataclass
from typing import Any

from verl_consistency.contracts.batch_fields import PREFILL_ROWS
from verl_consistency.patches.hooks.lanes import msprobe_lanes


class PromptRowsError(RuntimeError):
    """The micro batch does not say where each row's prompt ends; the message says what is missing."""


def _ints(value: Any) -> list[Any]:
    """A per-row column as a list, integral values as ``int`` (numpy's too), anything else as is."""
    if value is None:
        return []
    out = value.tolist() if hasattr(value, "tolist") else list(value)
    out = out if isinstance(out, list) else [out]
    return [int(x) if isinstance(x, numbers.Integral) and not isinstance(x, bool) else x for x in out]


def prompt_lengths(micro_batch: Any, lengths: tuple[int, ...]) -> tuple[int, ...]:
    """Each row's prompt token count (the rows vLLM prefilled), ``0 < p <= length`` per row.

    ``lengths`` are the rows' token counts in the forward (``input_ids`` offsets). Raises
    :class:`PromptRowsError` when the micro batch carries neither the PROMPTS_ONLY mark nor
    ``prompts`` with an ``attention_mask`` (verl's engines always carry them: its own log-prob
    slicing needs them), or when the counts do not fit the rows.
    """
    from verl.utils import tensordict_utils as tu

    marked = tu.get(micro_batch, key=PREFILL_ROWS, default=None)
    if marked is not None:
        got, source = _ints(marked), f"its {PREFILL_ROWS!r} column (the PROMPTS_ONLY trim)"
    else:
        prompts = micro_batch.get("prompts", None) if hasattr(micro_batch, "get") else None
        if prompts is None:
            raise PromptRowsError(
                "the training micro batch has no 'prompts': cannot tell each row's prompt rows from "
                "its response rows (verl's engines carry 'prompts' into every micro batch)"
            )
        if getattr(prompts, "is_nested", False):
            got, source = _ints(prompts.offsets().diff()), "its nested 'prompts' offsets"
        else:
            mask = micro_batch.get("attention_mask", None)
            if mask is None or getattr(mask, "is_nested", False):
                raise PromptRowsError(
                    "the training micro batch has padded 'prompts' but no padded 'attention_mask': "
                    "cannot count each row's prompt tokens (verl's no_padding_2_padding reads both)"
                )
            got = _ints(mask[:, : int(prompts.shape[1])].sum(dim=-1))
            source = "'attention_mask' over its 'prompts' columns"
    if len(got) != len(lengths) or any(
        not isinstance(p, int) or isinstance(p, bool) or not 0 < p <= n
        for p, n in zip(got, lengths, strict=False)
    ):
        raise PromptRowsError(
            f"the training micro batch's prompt lengths from {source} ({got}) do not fit its rows "
            f"of {list(lengths)} tokens: each must be a positive count no longer than its row"
        )
    return tuple(got)


@dataclass(frozen=True)
class PackedLayout:
    """How verl's FSDP engine lays a micro batch's rows out: read once per dumped micro batch.

    verl's FSDP engine keeps ``input_ids`` as a nested (jagged) tensor (``DatasetPadMode.NO_PADDING``,
    the only mode its ``prepare_model_inputs`` accepts); its offsets are the ``cu_seqlens`` that
    both layouts are built from (``verl/workers/engine/fsdp/transformer_impl.py``). With
    ``use_remove_padding`` (THD) the rows are concatenated into ``[1, total, ...]`` (and
    ``[total, ...]`` after a squeeze); otherwise ``torch.nested.to_padded_tensor`` pads each row
    on the right to ``[batch, longest, ...]``.
    """

    lengths: tuple[int, ...]
    """Each row's token count in the forward (prompt + response in ride-along)."""
    thd: bool
    prompts: tuple[int, ...] | None = None
    """Each row's prompt token count: its first ``p`` rows are what vLLM prefilled (None: the
    whole row, as for a PROMPTS_ONLY batch)."""

    @classmethod
    def of(cls, micro_batch: Any) -> PackedLayout | None:
        """The micro batch's layout, or None when its ``input_ids`` are not verl's nested tensor.

        Raises :class:`PromptRowsError` when the prompt lengths cannot be read (:func:`prompt_lengths`).
        """
        input_ids = micro_batch.get("input_ids", None) if hasattr(micro_batch, "get") else None
        offsets = getattr(input_ids, "offsets", None)
        if input_ids is None or not callable(offsets) or not getattr(input_ids, "is_nested", False):
            return None
        from verl.utils import tensordict_utils as tu

        thd = bool(tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True))
        lengths = tuple(int(n) for n in offsets().diff().tolist())
        return cls(lengths, thd, prompt_lengths(micro_batch, lengths))

    @property
    def prompt_rows(self) -> tuple[int, ...]:
        return self.lengths if self.prompts is None else self.prompts

    @property
    def prompt_only(self) -> bool:
        """True when the forward covers the prompts and nothing else (a PROMPTS_ONLY batch)."""
        return self.prompt_rows == self.lengths

    def lanes(self, ids: list[str], wanted: list[str]) -> list[msprobe_lanes.Lane] | None:
        """One lane per wanted request, cut to its prompt rows: THD, ``[begin, begin + p)`` of the
        cumulative lengths along dim 1 (and dim 0); padded, its row (dim 0) and its first ``p``
        positions (dim 1). None when the lengths do not match the ids (the micro batch is then
        dumped whole and logged as a multi-request micro batch).

        Not cut: the 4-D attention mask each layer is handed and eager attention's probabilities,
        ``[batch, 1|heads, t, t]`` over every token of the micro batch. They are not a request's
        rows, vLLM has no counterpart of them, and a ``t`` cut on dims 2 and 3 would also cut any
        activation whose width happens to equal ``t``. ``tests/patches/test_training_fsdp.py`` shows
        every other tensor of a lane equal to that request's prompt's forward alone, in both layouts.
        Parameters and gradients are not rows either; a tensor whose dimension equals the cut's
        size by coincidence is cut as msprobe's own one-request cut would cut it.
        """
        if not self.names_each_row(ids):
            return None
        begins = [0, *itertools.accumulate(self.lengths)]
        total, batch, longest = begins[-1], len(ids), max(self.lengths)
        lanes = []
        for row in wanted_rows(ids, wanted):
            rid = ids[row]
            begin, n = begins[row], self.prompt_rows[row]
            if self.thd:
                cuts = (
                    msprobe_lanes.Cut(1, total, begin, begin + n),
                    msprobe_lanes.Cut(0, total, begin, begin + n),
                )
            else:
                cuts = (msprobe_lanes.Cut(0, batch, row, row + 1), msprobe_lanes.Cut(1, longest, 0, n))
            lanes.append(msprobe_lanes.Lane(rid, cuts))
        return lanes

    def names_each_row(self, ids: list[str]) -> bool:
        """True when ``ids`` name the rows one to one (else a lane could not say whose rows it holds)."""
        return len(self.lengths) == len(ids) and len(set(ids)) == len(ids)

    def last_positions(self, padded_to: int | None = None) -> list[int]:
        """Each row's last prompt position in the logits flattened to ``[positions, vocab]``, where
        vLLM sampled response token 0: THD, ``cu_seqlens[i] + p_i - 1``; padded,
        ``i * longest + p_i - 1``, ``longest`` the longest row (FSDP's padding). ``padded_to``: the
        rows are padded to that length, whatever :attr:`thd` says (Megatron's bshd layout, which
        its engine config decides, not the micro batch)."""
        begins = [0, *itertools.accumulate(self.lengths)]
        if self.thd and padded_to is None:
            return [b + p - 1 for b, p in zip(begins, self.prompt_rows, strict=False)]
        longest = padded_to if padded_to is not None else max(self.lengths)
        return [i * longest + p - 1 for i, p in enumerate(self.prompt_rows)]


def wanted_rows(ids: list[str], wanted: list[str]) -> list[int]:
    """The row of each wanted request, in ``wanted``'s order; a request not in ``ids`` is an error."""
    missing = [rid for rid in wanted if rid not in ids]
    if missing:
        raise ValueError(f"requests {missing} are not in this micro batch")
    return [ids.index(rid) for rid in wanted]
