"""Which rows are structural (grey, never a divergence): checked against real vLLM 0.18.0 behaviour."""

from __future__ import annotations

import pytest

from verl_consistency.postprocess.compare.verdict import structural_reason


def test_layer0_input_layernorm_input_is_comparable():
    """vLLM's first decoder layer has no residual yet: its input_layernorm sees the embedding alone.

    Seen in real vLLM 0.18.0 dumps (``make demo``): layer 0's ``input_layernorm`` has only
    ``input.0``, every later norm also ``input.1`` (the residual).
    """
    assert structural_reason("model.layers.0.input_layernorm", "input") is None


@pytest.mark.parametrize(
    "module",
    [
        "model.layers.1.input_layernorm",
        "model.layers.12.input_layernorm",
        "model.layers.0.post_attention_layernorm",
        "model.norm",
    ],
)
def test_norms_fed_a_residual_stay_structural_on_input(module):
    assert structural_reason(module, "input") is not None
    assert structural_reason(module, "output") is None


def test_other_structural_rows_unchanged():
    assert structural_reason("model.layers.0.mlp.act_fn", "output") is not None
    assert structural_reason("model.layers.3", "output") is not None
    assert structural_reason("model.layers.0.self_attn.qkv_proj", "output") is None
