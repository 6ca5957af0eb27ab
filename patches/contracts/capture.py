"""Which requests a collection run captures: one rule, evaluated independently on both sides.

The vLLM workers and the trainer never talk to each other, so the capture set is a pure
function of the request id (the id verl sent, after ``records.base_request_id``). A hash
rule needs no coordination, survives restarts, and gives the same answer in every process.

Spelled in ``$VERL_CONSISTENCY_CAPTURE``:

``all``
    The recipe's behaviour: every step is dumped.
``fraction:F``
    A request is captured when ``blake2b(id) / 2**64 < F`` (0 < F <= 1).
``prompts:FILE``
    Exactly the prompts FILE lists (``capture-these.txt`` of a report: ``index:N`` or ``uid:U`` per
    line, ``#`` starts a comment; a bare integer is an index). Neither the vLLM worker nor the
    trainer knows a request's prompt index, but verl's agent loop does: the patched
    ``AgentLoopWorker._run_agent_loop`` calls :func:`enter_prompt` with the sample's fields, and
    the patched ``LLMServerClient.generate`` asks :func:`new_request_id` for the id it sends to
    vLLM, which starts with :data:`CAPTURED_PREFIX` when that prompt is listed. Both sides then
    decide on the id alone, as in the other modes (``patches/current/verl/0006-capture-prompts``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_consistency.contracts.env import CAPTURE

RUN_DEFAULT = "fraction:1"
"""``verl-consistency run``'s default: every request captured. Each prefill step that computes a
captured request's whole prompt is dumped, one lane per such request, and each training micro
batch one lane per request; decode steps and partial prefills are never dumped. So a run with no
options pairs nearly every comparable request of verl's real schedule (``all``, the recipe's
dump-every-step, pairs only the prefill steps that hold one request). The hooks' own default,
for a launch without ``run``, stays ``all``: the recipe's behaviour."""

CAPTURED_PREFIX = "vccap"
"""A vLLM request id that starts with this belongs to a listed prompt (``prompts:FILE`` mode)."""


class CaptureFileError(ValueError):
    """The prompts file cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class CaptureRule:
    fraction: float | None = None
    """None (and no ``prompts``) means 'all': the recipe's dump-everything behaviour."""
    prompts: frozenset[str] | None = None
    """``prompts:FILE`` mode: the listed keys (``index:N``, ``uid:U``)."""
    path: str | None = None

    @property
    def is_all(self) -> bool:
        return self.fraction is None and self.prompts is None

    @property
    def is_sample(self) -> bool:
        """A fraction below 1 or a prompt list: some requests, not every one."""
        return self.prompts is not None or (self.fraction is not None and self.fraction < 1.0)

    def describe(self) -> str:
        """What a run with this rule dumps on each side, and what it pairs (``run --dry-run``)."""
        if self.is_all:
            return (
                "all (the recipe): every vLLM step is dumped whole, decodes included, and every "
                "training micro batch; only prefill steps that hold one request pair"
            )
        if self.prompts is not None:
            which = f"the {len(self.prompts)} prompt(s) {self.path} lists"
        elif self.fraction == 1.0:
            which = "every request"
        else:
            which = f"about {self.fraction:.3g} of the requests (by a hash of the request id)"
        return (
            f"{self.spec()}: {which}; a vLLM prefill step is dumped when it computes a captured "
            "request's whole prompt, one lane (req{k}/) per such request; a training micro batch "
            "holding a captured request is dumped, one lane per captured request; decode steps, "
            "chunked prefills and prefix-cache hits are not dumped"
        )

    def spec(self) -> str:
        if self.prompts is not None:
            return f"prompts:{self.path}"
        return "all" if self.fraction is None else f"fraction:{self.fraction:g}"

    def captures(self, base_id: str) -> bool:
        if self.prompts is not None:
            return base_id.startswith(CAPTURED_PREFIX)
        if self.fraction is None:
            return True
        digest = hashlib.blake2b(base_id.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") < self.fraction * 2**64

    def lists(self, sample: Mapping[str, Any]) -> bool:
        """``prompts`` mode: is this sample's prompt (its ``index`` or ``uid``) in the file?"""
        if self.prompts is None:
            return False
        for key in ("index", "uid"):
            value = sample.get(key)
            if value is not None and f"{key}:{_plain(value)}" in self.prompts:
                return True
        return False


def _plain(value: Any) -> str:
    value = value.item() if hasattr(value, "item") else value
    return str(value)


def read_prompts(path: str | os.PathLike[str]) -> frozenset[str]:
    """Parse a prompts file; a bad line is an error naming ``file:line`` and what to write."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise CaptureFileError(f"{CAPTURE}=prompts:{p}: cannot read it ({exc.strerror})") from None
    keys: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        word = body.split()[0]
        if word.isdigit():
            word = f"index:{word}"
        kind, _, value = word.partition(":")
        if kind not in ("index", "uid") or not value:
            raise CaptureFileError(
                f"{p}:{n}: {word!r} is not a prompt key; write index:<dataset index> or uid:<verl uid> "
                "(as the report's capture-these.txt does)"
            )
        keys.add(f"{kind}:{value}")
    if not keys:
        raise CaptureFileError(f"{p}: lists no prompt; write one index:<N> or uid:<U> per line")
    return frozenset(keys)


def parse(spec: str) -> CaptureRule:
    text = spec.strip()
    if text in ("", "all"):
        return CaptureRule()
    kind, _, value = text.partition(":")
    if kind == "prompts" and value:
        return CaptureRule(prompts=read_prompts(value), path=value)
    if kind == "fraction":
        try:
            frac = float(value)
        except ValueError:
            frac = -1.0
        if 0.0 < frac <= 1.0:
            return CaptureRule(fraction=frac)
    raise ValueError(f"{CAPTURE}={spec!r}: expected 'all', 'fraction:F' with 0 < F <= 1, or 'prompts:FILE'")


def from_env(environ: dict[str, str] | None = None) -> CaptureRule:
    env = os.environ if environ is None else environ
    return parse(env.get(CAPTURE, "all"))
