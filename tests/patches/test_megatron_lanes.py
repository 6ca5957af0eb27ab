"""Megatron's lane geometry (patches/hooks/training/megatron_lanes.py), checked against verl's own
padding and msprobe's cut rule.

The padded length is compared with verl's ``preprocess_bshd_engine`` itself (the pin set's verl,
megatron-core's parallel state stood in by its two sizes), and each lane's box on every tensor
orientation of a Megatron forward (``[b, s]`` ids, ``[s, b, h]`` activations, ``[b, s, v]`` logits,
``[s, 1, 1, d]`` rotary) is the one msprobe's ``slice_info`` rule gives (``lane_stats.lane_boxes``).
The forward itself, lane by lane against each prompt alone, is ``test_megatron_forward_lanes.py``.
"""

from __future__ import annotations

import pytest
import torch

from tests.patches.test_training_hooks import _ride_along_td
from verl_consistency.patches.hooks.lanes.lane_stats import lane_boxes
from verl_consistency.patches.hooks.training import micro_batch_dump
from verl_consistency.patches.hooks.training.megatron_lanes import (
    FORCED_MAX_SEQLEN,
    MEGATRON,
    MegatronGeometry,
    MegatronLanesError,
)
from verl_consistency.patches.hooks.training.prompt_rows import PackedLayout

pytestmark = pytest.mark.pinset

BSHD = MegatronGeometry(remove_padding=False, tp=1, cp=1, sequence_parallel=False, fp8=None)


def _boxes(shape: tuple[int, ...], lanes: list) -> list[tuple]:  # type: ignore[type-arg]
    dims, boxes = lane_boxes(shape, [lane.cuts for lane in lanes])
    return [dict(zip(dims, box, strict=True)) for box in boxes]


def test_every_orientation_of_a_megatron_forward_is_cut_to_the_row_and_its_prompt() -> None:
    """Rows of 4 and 5 tokens, prompts of 2 and 4: padded to 5 positions, batch 2."""
    td = _ride_along_td(nested=False)
    packed = PackedLayout.of(td)
    assert packed is not None
    lanes, last = BSHD.lanes(td, packed, ["a", "b"], ["b", "a"])
    assert [lane.request_id for lane in lanes] == ["b", "a"]
    b, a = (0, 1), (1, 2)  # row spans
    assert _boxes((2, 5), lanes) == [{0: a, 1: (0, 4)}, {0: b, 1: (0, 2)}], "input ids [b, s]"
    assert _boxes((5, 2, 8), lanes) == [{0: (0, 4), 1: a}, {0: (0, 2), 1: b}], "activations [s, b, h]"
    assert _boxes((2, 5, 16), lanes) == [{0: a, 1: (0, 4)}, {0: b, 1: (0, 2)}], "logits [b, s, v]"
    assert _boxes((5, 1, 1, 4), lanes) == [{0: (0, 4)}, {0: (0, 2)}], "rotary [s, 1, 1, d]"
    assert last == [0 * 5 + 2 - 1, 1 * 5 + 4 - 1]


@pytest.mark.parametrize(("tp", "forced"), [(1, None), (2, None), (4, None), (1, 9), (4, 9)])
def test_the_padded_length_is_verls_own(monkeypatch: pytest.MonkeyPatch, tp: int, forced: int | None) -> None:
    """verl pads the bshd layout to the micro batch's longest row (or the mini batch's, passed as
    ``forced_max_seqlen``), then to a multiple of the TP size: the lanes' sequence size must be that."""
    from tensordict import NonTensorData

    util = pytest.importorskip("verl.models.mcore.util")
    td = _ride_along_td(nested=False)
    packed = PackedLayout.of(td)
    assert packed is not None
    kwargs = {}
    if forced is not None:
        if "forced_max_seqlen" not in util.preprocess_bshd_engine.__code__.co_varnames:
            pytest.skip("this verl pads to the micro batch's longest row only")
        td[FORCED_MAX_SEQLEN] = NonTensorData(forced)
        kwargs["forced_max_seqlen"] = forced
    for name, value in (
        ("get_context_parallel_world_size", 1),
        ("get_context_parallel_rank", 0),
        ("get_tensor_model_parallel_world_size", tp),
    ):
        monkeypatch.setattr(util.mpu, name, lambda value=value: value)
    _, mask, _ = util.preprocess_bshd_engine(td["input_ids"], **kwargs)
    geometry = MegatronGeometry(remove_padding=False, tp=tp, cp=1, sequence_parallel=False, fp8=None)
    assert geometry.padded_length(td, packed) == mask.shape[1]


@pytest.mark.parametrize(
    ("geometry", "named"),
    [
        (MegatronGeometry(True, 1, 1, False, None), f"{MEGATRON}.use_remove_padding=False"),
        (MegatronGeometry(False, 2, 2, False, None), f"{MEGATRON}.context_parallel_size=1"),
        (MegatronGeometry(False, 2, 1, True, None), f"{MEGATRON}.sequence_parallel=False"),
        (MegatronGeometry(False, 1, 1, False, "e4m3"), "without FP8"),
    ],
    ids=["thd", "context-parallel", "sequence-parallel", "fp8"],
)
def test_what_cannot_be_cut_is_refused_by_name(geometry: MegatronGeometry, named: str) -> None:
    td = _ride_along_td(nested=False)
    packed = PackedLayout.of(td)
    assert packed is not None
    with pytest.raises(MegatronLanesError, match=named):
        geometry.lanes(td, packed, ["a", "b"], ["a"])
    assert MegatronGeometry(False, 1, 1, True, None).refusal() is None, "verl turns SP off at TP 1"


def test_a_batch_as_wide_as_its_padded_length_is_refused() -> None:
    """Two rows padded to two positions: ``[2, 2, h]`` could be either orientation."""
    packed = PackedLayout((2, 2), thd=False, prompts=(1, 2))
    with pytest.raises(MegatronLanesError, match="change the micro batch size"):
        BSHD.lanes(_ride_along_td(nested=False), packed, ["a", "b"], ["a"])
    one = PackedLayout((1,), thd=False, prompts=(1,))
    lanes, last = BSHD.lanes(_ride_along_td(nested=False), one, ["a"], ["a"])
    assert last == [0], "one row of one token: nothing to confuse"
    assert len(lanes) == 1


def test_the_dumper_turns_a_refusal_into_a_training_dump_error() -> None:
    """The engine's dumper raises the hook's own error (the one the run's log names), and keeps
    dumping a prompt-only micro batch of one row whole in any layout."""
    thd = MegatronGeometry(True, 1, 1, False, None)
    dumper = micro_batch_dump.BatchDumper(None, "megatron", "log_prob", 0, megatron=thd)  # type: ignore[arg-type]
    td = _ride_along_td(nested=True)
    with pytest.raises(micro_batch_dump.TrainingDumpError, match="use_remove_padding=False"):
        dumper._lanes(td, ["a", "b"], ["a", "b"])
    one = _one_row(marked=False)
    packed, lanes, _ = dumper._lanes(_one_row(marked=True), ["a"], ["a"])
    assert packed is not None
    assert packed.prompt_only
    assert lanes is None, "PROMPTS_ONLY, one row: whole"
    with pytest.raises(micro_batch_dump.TrainingDumpError, match="use_remove_padding=False"):
        dumper._lanes(one, ["a"], ["a"])  # one ride-along row: its prompt rows need a lane


def _one_row(marked: bool):  # type: ignore[no-untyped-def]
    """One row of 4 tokens whose prompt is 2 (verl 0.9's nested layout)."""
    from tensordict import NonTensorStack, TensorDict

    from verl_consistency.patches.hooks.training import prompts_only

    fields: dict[str, object] = {
        "input_ids": torch.nested.as_nested_tensor([torch.tensor([5, 6, 11, 12])], layout=torch.jagged),
        "prompts": torch.nested.as_nested_tensor([torch.tensor([5, 6])], layout=torch.jagged),
        "request_id": NonTensorStack("a"),
    }
    if marked:
        fields[prompts_only.PREFILL_ROWS] = NonTensorStack(4)
    return TensorDict(fields, batch_size=[1])
