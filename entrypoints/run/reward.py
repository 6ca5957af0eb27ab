"""Rule-based reward for the generated prompt set (``verl_consistency.entrypoints.run.dataset``).

It lives beside the prompt set it scores: it reads the ``reward_model.ground_truth`` that
``dataset`` writes, and ``dataset.write_reward_fn`` copies this file by its path, so the
contracts never reach up into the hooks for it.

``verl-consistency run`` copies this file into the run folder and points verl's
``reward.custom_reward_function.path`` at the copy (``.name``: :func:`compute_score`), so it
must stay standard-library only: the reward workers import it by path, outside this package.

Why a shaped score and not right/wrong: GRPO's advantage is each response's reward minus its
group's mean. A right/wrong score never pays a random model (the demo's, or a fresh one on a
cluster), so every group scores 0, every advantage is 0 and ``actor/grad_norm`` is 0 at every
step: the weights never move, and a collection run compares step 0's weights over and over
(measured on an H200, verl 0.9.1, issue 35). With a score that varies across responses
("distinct characters / 16" there), grad_norm was 2.7-3.9 at every step. So the right answer
still earns the most (1.0), and every other response earns a partial credit below
:data:`PARTIAL_MAX` that a random model's responses differ in, and that a real model climbs.
How much they differ matters little: verl's GRPO divides each group's advantages by the group's
standard deviation (``algorithm.norm_adv_by_std_in_grpo``, on by default), so any difference
within a group is an advantage of full size; a tie is what must be rare.
"""

from __future__ import annotations

import math
import re
from typing import Any

_NUMBER = re.compile(r"-?\d+")

RIGHT = 1.0
"""The score of a response whose last integer is the answer."""
PARTIAL_MAX = 0.5
"""Every wrong response scores below this, so no partial credit reaches a right answer."""
VARIETY_CHARS = 512
"""Distinct characters at which the variety term is full. On a log scale, so that it still varies
for long responses: a random model's 128 tokens of a 150k-token vocabulary (Qwen2's) decode to
a few hundred characters, mostly distinct; a cap of a few dozen would give them all the same."""

# The weights of the partial credit's terms; they add up to 1, and PARTIAL_MAX scales the sum.
_W_VARIETY = 0.4
_W_NUMBER = 0.2
_W_LAST_LINE = 0.1
_W_CLOSE = 0.3


def _same_integer(guess: str, truth: str) -> bool:
    """``guess`` is the answer: as integers ("042" is 42), or as text when the truth is no integer."""
    try:
        return int(guess) == int(truth)
    except ValueError:
        return guess == truth


def _closeness(guess: str, truth: str) -> float:
    """1 for the answer, falling towards 0 with the relative distance: a near miss earns more."""
    try:
        want = int(truth)
        got = int(guess)
    except ValueError:
        return 0.0
    return 1.0 / (1.0 + abs(got - want) / max(abs(want), 1))


def _variety(text: str) -> float:
    """In [0, 1]: half the distinct characters on a log scale, half their share of the characters.

    Two random responses almost never tie on both, short or long: the count grows with the
    length until :data:`VARIETY_CHARS`, the share keeps varying after it."""
    if not text:
        return 0.0
    distinct = len(set(text))
    count = min(1.0, math.log1p(distinct) / math.log1p(VARIETY_CHARS))
    return 0.5 * count + 0.5 * distinct / len(text)


def partial_credit(solution_str: str, ground_truth: str) -> float:
    """A wrong response's score, in [0, PARTIAL_MAX): variety, a number, an integer last line, closeness.

    * variety: distinct characters, on a log scale up to :data:`VARIETY_CHARS`. The term that a
      random model's responses differ in (they rarely hold a number), so that GRPO's advantages
      are not all 0; a real model's sentences all earn much the same of it;
    * a number anywhere, and a last line that is a single integer (the asked-for format);
    * closeness of the last integer to the answer.
    """
    text = solution_str or ""
    numbers = _NUMBER.findall(text)
    lines = [line.strip() for line in text.strip().splitlines()]
    last_line_integer = bool(lines) and re.fullmatch(r"-?\d+", lines[-1]) is not None
    terms = (
        _W_VARIETY * _variety(text)
        + _W_NUMBER * bool(numbers)
        + _W_LAST_LINE * last_line_integer
        + _W_CLOSE * (_closeness(numbers[-1], ground_truth) if numbers else 0.0)
    )
    # closeness is 1 only for the answer, which compute_score pays RIGHT instead: below 1 here
    return PARTIAL_MAX * terms


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    **_: Any,
) -> float:
    """:data:`RIGHT` when the last integer in the response is the answer, else :func:`partial_credit`.

    verl's reward managers call it with these keyword arguments (``naive``: ``data_source``,
    ``solution_str``, ``ground_truth``, ``extra_info``, and more keywords in some managers).
    """
    truth = str(ground_truth).strip()
    numbers = _NUMBER.findall(solution_str or "")
    if numbers and _same_integer(numbers[-1], truth):
        return RIGHT
    return partial_credit(solution_str, truth)
