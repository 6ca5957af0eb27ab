"""Per-request lanes of verl's Megatron forward: which rows of its tensors are one request's prompt.

Why a module of its own: FSDP's layout (:class:`.prompt_rows.PackedLayout`) is batch-first and
padded to the micro batch's longest row. Megatron's is neither:

* its activations are **sequence-first**: the embedding's output, every layer's and the output
  layer's are ``[s, b, h]``, while ``input_ids``, the position ids and the logits verl reads back
  are ``[b, s, ...]``. A lane therefore cuts both orientations: its row on the batch dimension and
  its first ``p`` positions on the sequence dimension, each found by its size, as msprobe's own
  ``slice_info`` finds them (a cut applies where ``shape[dim] == size``). When the batch size equals
  the padded length the two cannot be told apart, and the micro batch is refused, not cut wrongly;
* verl pads the bshd layout to more than the longest row (``preprocess_bshd_engine``, the same in
  0.8.0 and 0.9.1): to a multiple of the tensor-parallel size, and in verl 0.9.1 first to the
  mini batch's longest row (``pad_bshd_to_minibatch_max``, passed to each micro batch as its
  ``forced_max_seqlen``). The sequence size here is that padded length, computed as verl computes it.

What is refused, each with its reason and what to do (:class:`MegatronLanesError`):

* the packed layout (``use_remove_padding=True``, THD): megatron-core's packed attention is
  Transformer Engine's, which no machine of this project has, so its lanes are not verified;
* sequence parallelism (the ``s`` dimension split across the tensor-parallel ranks inside each
  layer) and context parallelism (``s`` split across ranks, zigzag): a request's rows are not on
  one rank;
* FP8 padding (``fp8`` ``e4m3``/``hybrid``): verl pads the batch again, by a rule of the batch size.

With tensor parallelism and no sequence parallelism each rank holds every position of its shard
of the hidden dimension: its lanes are cut the same way, and each rank's dump is its shard's.

Nothing here imports torch, verl or megatron at import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl_consistency.patches.hooks.lanes import msprobe_lanes
from verl_consistency.patches.hooks.training.prompt_rows import PackedLayout, wanted_rows

FORCED_MAX_SEQLEN = "forced_max_seqlen"
"""verl 0.9.1's per-micro-batch padding target of the bshd layout (``transformer_impl.py``
``forward_backward_batch`` assigns it when ``pad_bshd_to_minibatch_max``; ``forward_step`` hands it
to ``preprocess_bshd_engine``). Absent in verl 0.8.0, which pads to the micro batch's longest row."""


MEGATRON = "actor_rollout_ref.actor.megatron"
"""Where verl's Hydra config keeps the Megatron engine's settings (``McoreEngineConfig``): the keys
the refusals name (``entrypoints/run/megatron.py`` refuses the same keys before a run starts)."""


class MegatronLanesError(RuntimeError):
    """A Megatron micro batch whose requests' rows cannot be cut; the message says what to change."""


@dataclass(frozen=True)
class MegatronGeometry:
    """What decides where a request's rows lie in the Megatron engine's tensors, read once a call."""

    remove_padding: bool
    tp: int
    cp: int
    sequence_parallel: bool
    fp8: str | None

    @classmethod
    def of(cls, engine: Any) -> MegatronGeometry:
        """The engine's own settings: its engine config (layout) and megatron-core's model config
        and parallel state (what the forward runs with)."""
        from megatron.core import parallel_state as mpu

        engine_config = getattr(engine, "engine_config", None)
        tf_config = getattr(engine, "tf_config", None)
        sequence_parallel = getattr(tf_config, "sequence_parallel", None)
        if sequence_parallel is None:
            sequence_parallel = getattr(engine_config, "sequence_parallel", False)
        fp8 = getattr(tf_config, "fp8", None)
        return cls(
            remove_padding=bool(getattr(engine_config, "use_remove_padding", True)),
            tp=int(mpu.get_tensor_model_parallel_world_size()),
            cp=int(mpu.get_context_parallel_world_size()),
            sequence_parallel=bool(sequence_parallel),
            fp8=str(fp8) if fp8 else None,
        )

    def refusal(self) -> str | None:
        """Why this engine's forward cannot be cut into lanes, or None."""
        if self.remove_padding:
            return (
                "the engine packs the micro batch (use_remove_padding=True, THD): megatron-core's "
                "packed attention is Transformer Engine's, and lanes of it are not verified. Set "
                f"{MEGATRON}.use_remove_padding=False (verl's bshd layout) for the "
                "collection run, or run with --prompts-only and micro batch 1 (each micro batch "
                "dumped whole)"
            )
        if self.cp > 1:
            return (
                f"context parallelism ({self.cp} ranks) splits each row's positions across ranks: "
                f"run the collection with {MEGATRON}.context_parallel_size=1"
            )
        if self.sequence_parallel and self.tp > 1:
            return (
                "sequence parallelism splits each layer's positions across the tensor-parallel "
                f"ranks: run the collection with {MEGATRON}.sequence_parallel=False"
            )
        if self.fp8 in ("e4m3", "hybrid"):
            return (
                f"fp8={self.fp8} pads the bshd batch by a rule of its batch size: run the "
                "collection without FP8"
            )
        return None

    def padded_length(self, micro_batch: Any, packed: PackedLayout) -> int:
        """The bshd sequence length verl's ``preprocess_bshd_engine`` pads this micro batch to."""
        from verl.utils import tensordict_utils as tu

        forced = tu.get_non_tensor_data(data=micro_batch, key=FORCED_MAX_SEQLEN, default=None)
        longest = int(forced) if forced is not None else max(packed.lengths)
        return longest + (-longest) % self.tp

    def lanes(
        self, micro_batch: Any, packed: PackedLayout, ids: list[str], wanted: list[str]
    ) -> tuple[list[msprobe_lanes.Lane], list[int]]:
        """One lane per wanted request and each row's last prompt position in the ``[b * s]``
        flattened logits. Raises :class:`MegatronLanesError` where the rows cannot be cut."""
        why = self.refusal()
        if why is None and not packed.names_each_row(ids):
            why = f"its request ids ({len(ids)}) do not name its {len(packed.lengths)} rows one to one"
        length, batch = self.padded_length(micro_batch, packed), len(packed.lengths)
        if why is None and batch == length and batch > 1:
            why = (
                f"its {batch} rows are padded to {length} positions, so its batch and sequence "
                "dimensions have the same size and a request's rows cannot be told apart in "
                "Megatron's sequence-first tensors: change the micro batch size"
            )
        if why is not None:
            raise MegatronLanesError(f"cannot cut this Megatron micro batch into per-request lanes: {why}")
        lanes = []
        for row in wanted_rows(ids, wanted):
            n = packed.prompt_rows[row]
            cuts = (
                # batch-first: input_ids, position ids, the logits verl reads ([b, s, ...])
                msprobe_lanes.Cut(0, batch, row, row + 1),
                msprobe_lanes.Cut(1, length, 0, n),
                # sequence-first: every activation of the model ([s, b, ...])
                msprobe_lanes.Cut(0, length, 0, n),
                msprobe_lanes.Cut(1, batch, row, row + 1),
            )
            lanes.append(msprobe_lanes.Lane(ids[row], cuts))
        return lanes, packed.last_positions(padded_to=length)
