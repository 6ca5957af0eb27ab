"""Which requests a collection run captures: one rule, evaluated independently on both sides.

The vLLM workers and the trainer never talk to each other, so the capture set is a pure
function of the request id (the id verl sent, after ``records.base_request_id``). A hash
rule needs no coordination, survives restarts, and gives the same answer in every process.

Spelled in ``$VERL_CONSISTENCY_CAPTURE``:

``all``
    The recipe's behaviour: every step is dumped.
``fraction:F``
    A request is captured when ``blake2b(id) / 2**64 < F`` (0 < F <= 1).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from verl_consistency.patches.contracts.env import CAPTURE


@dataclass(frozen=True)
class CaptureRule:
    fraction: float | None = None
    """None means 'all': the recipe's dump-everything behaviour."""

    @property
    def is_all(self) -> bool:
        return self.fraction is None

    def spec(self) -> str:
        return "all" if self.fraction is None else f"fraction:{self.fraction:g}"

    def captures(self, base_id: str) -> bool:
        if self.fraction is None:
            return True
        digest = hashlib.blake2b(base_id.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") < self.fraction * 2**64


def parse(spec: str) -> CaptureRule:
    text = spec.strip()
    if text in ("", "all"):
        return CaptureRule()
    kind, _, value = text.partition(":")
    if kind == "fraction":
        try:
            frac = float(value)
        except ValueError:
            frac = -1.0
        if 0.0 < frac <= 1.0:
            return CaptureRule(fraction=frac)
    raise ValueError(f"{CAPTURE}={spec!r}: expected 'all' or 'fraction:F' with 0 < F <= 1")


def from_env(environ: dict[str, str] | None = None) -> CaptureRule:
    env = os.environ if environ is None else environ
    return parse(env.get(CAPTURE, "all"))
