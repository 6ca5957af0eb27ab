"""The weight-check bench's stand-in for a model on a machine without transformers (the device's bare
image) lists the same names and shapes as the real Qwen2's ``state_dict``: a cheaper shape table
would measure another model."""

from __future__ import annotations

import pytest

from bench.bench_weight_check import _model_tensors, _qwen2_shapes


@pytest.mark.parametrize(
    "sizes",
    [
        {"layers": 2, "hidden": 128, "vocab": 256},
        {"layers": 3, "hidden": 192, "vocab": 300, "intermediate": 200, "kv_heads": 1},
    ],
)
def test_the_shape_table_is_qwen2s_own_state_dict(sizes: dict[str, int]) -> None:
    real = {n: tuple(t.shape) for n, t in _model_tensors(**sizes).items()}
    assert _qwen2_shapes(**sizes) == real
