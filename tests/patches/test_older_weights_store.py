"""``hooks/training/older_weights.py``'s store on a plain torch module: what it keeps, drops, swaps, refuses.

The FSDP engine's path (sharded parameters, verl's forward, the records) is
``test_older_weights.py``; these pin the store's own rules, fast.
"""

from __future__ import annotations

import pytest

from verl_consistency.patches.hooks.training import older_weights

torch = pytest.importorskip("torch")


def _module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2).to(torch.bfloat16))


def _bits(m: torch.nn.Module) -> list[bytes]:
    return [p.detach().view(torch.uint8).numpy().tobytes() for p in m.parameters()]


def test_a_kept_version_is_a_copy_that_the_optimizer_does_not_move() -> None:
    m = _module()
    store = older_weights.WeightStore(keep_n=2)
    store.keep(m, 0)
    kept = _bits(m)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)  # in place, as an optimizer step: a tensor.cpu() alias would follow it
    store.keep(m, 0)  # already kept: not taken again
    moved = _bits(m)
    with store.swapped(m, 0):
        assert _bits(m) == kept
    assert _bits(m) == moved, "the module's own weights come back, bit for bit (bf16 too)"


def test_the_oldest_version_is_dropped_beyond_keep() -> None:
    m = _module()
    store = older_weights.WeightStore(keep_n=2)
    for v in (3, 4, 5):
        store.keep(m, v)
    assert (store.has(3), store.has(4), store.has(5)) == (False, True, True)


def test_keep_zero_keeps_nothing() -> None:
    store = older_weights.WeightStore(keep_n=0)
    store.keep(_module(), 1)
    assert not store.has(1)


def test_versions_that_do_not_fit_the_host_are_refused_with_the_figures() -> None:
    with pytest.raises(older_weights.WeightsDoNotFit) as err:
        older_weights.check_fits(one_copy=2 * 1024**3, keep=8, ranks=8, available=100 * 1024**3)
    text = str(err.value)
    assert "144.0 GiB" in text
    assert "100.0 GiB is available" in text
    assert "VERL_CONSISTENCY_KEEP_VERSIONS" in text
    assert "max_off_policy_threshold" in text
    older_weights.check_fits(one_copy=2 * 1024**3, keep=8, ranks=1, available=100 * 1024**3)
    older_weights.check_fits(one_copy=2 * 1024**3, keep=8, ranks=8, available=None)


@pytest.mark.parametrize(("raw", "want"), [("", 8), ("0", 0), ("3", 3)])
def test_keep_versions_from_the_environment(raw: str, want: int) -> None:
    assert older_weights.keep_versions({"VERL_CONSISTENCY_KEEP_VERSIONS": raw}) == want


@pytest.mark.parametrize("raw", ["-1", "two", "1.5"])
def test_a_bad_keep_versions_is_a_clear_error(raw: str) -> None:
    with pytest.raises(ValueError, match="VERL_CONSISTENCY_KEEP_VERSIONS"):
        older_weights.keep_versions({"VERL_CONSISTENCY_KEEP_VERSIONS": raw})
