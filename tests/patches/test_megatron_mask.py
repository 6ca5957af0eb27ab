"""The Transformer Engine stand-in's attention-mask conversion (bench/gpu/no_te/megatron_local_spec.py).

verl's bshd path hands the model a ``[b, s]`` mask that is True on real tokens; megatron-core's
local attention masks where the mask is True and drops its own causal mask when given one. The
first H200 run without the conversion attended uniformly to every token (found by the Megatron
compare); the converted mask must be exactly megatron-core's default causal mask plus padding.
"""

from __future__ import annotations

import pytest
import torch

from bench.gpu.no_te.megatron_local_spec import megatron_mask

pytestmark = pytest.mark.pinset


def test_all_valid_is_megatron_default_causal_mask() -> None:
    mask = megatron_mask(torch.ones(2, 5, dtype=torch.bool))
    assert mask.shape == (2, 1, 5, 5)
    causal = torch.triu(torch.ones(5, 5), diagonal=1).bool()  # megatron.core.transformer.utils
    assert torch.equal(mask[0, 0], causal)
    assert torch.equal(mask[1, 0], causal)


def test_padding_keys_are_masked_and_other_masks_pass_through() -> None:
    valid = torch.tensor([[True, True, True, False]])
    mask = megatron_mask(valid)[0, 0]
    assert mask[:, 3].all(), "no query attends to the padding key"
    assert not mask[2, :3].any(), "the last real token sees every real token"
    ready = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    assert megatron_mask(ready) is ready
    assert megatron_mask(None) is None
