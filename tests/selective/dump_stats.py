"""Reading msprobe ``dump.json`` statistics in the selective tests: one home for both test modules."""

from __future__ import annotations

import math
from typing import Any


def tensors(entry: Any) -> list[dict[str, Any]]:
    """Every tensor record of one module call, inputs, outputs and parameters alike."""
    found: list[dict[str, Any]] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if x.get("type") == "torch.Tensor":
                found.append(x)
            else:
                for v in x.values():
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(entry)
    return found


def close(a: Any, b: Any) -> bool:
    """Two msprobe statistics agree (``None`` for what an integer tensor has no mean or norm of)."""
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=1e-4, abs_tol=1e-5)


def mismatches(got: dict[str, Any], want: dict[str, Any], skip: str | None = None) -> list[str]:
    """Module calls of ``got`` whose tensors differ from ``want``'s in shape or statistics."""
    bad = []
    for key, entry in got.items():
        if key == skip:
            continue
        for tg, tw in zip(tensors(entry), tensors(want[key]), strict=True):
            if tg["shape"] != tw["shape"]:
                bad.append(f"{key}: shape {tg['shape']} != {tw['shape']}")
            elif not all(close(tg[s], tw[s]) for s in ("Max", "Min", "Mean", "Norm")):
                bad.append(f"{key}: statistics differ")
    return bad
