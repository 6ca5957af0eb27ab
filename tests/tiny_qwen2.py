"""Tiny random transformers Qwen2 models, built from a config (no download).

Every test that needs a real Qwen2 builds it here: 2 layers, 4 query heads over 2 KV heads (so
grouped-query attention is exercised), seeded random weights. Callers choose the widths, which
some pick on purpose (see ``tests/selective/scenario.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2_config(
    *,
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    **extra: Any,
) -> Qwen2Config:
    """A small ``Qwen2Config``; ``extra`` passes any other field through (e.g. ``tie_word_embeddings``)."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        **extra,
    )


def tiny_qwen2(config: Qwen2Config, seed: int = 0) -> Qwen2ForCausalLM:
    """The transformers model of ``config`` with weights from ``torch.manual_seed(seed)``, in eval mode."""
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()
