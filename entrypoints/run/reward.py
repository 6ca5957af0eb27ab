"""Rule-based reward for the generated prompt set (``verl_consistency.entrypoints.run.dataset``).

It lives beside the prompt set it scores: it reads the ``reward_model.ground_truth`` that
``dataset`` writes, and ``dataset.write_reward_fn`` copies this file by its path, so the
contracts never reach up into the hooks for it.

``verl-consistency run`` copies this file into the run folder and points verl's
``reward.custom_reward_function.path`` at the copy, so it must stay standard-library only:
the reward workers import it by path, outside this package.

The reward value does not matter for a consistency run (the dumps are of the prompt
forward), but a training step needs one, and a right/wrong score keeps the run honest.
"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d+")


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    **_: Any,
) -> float:
    """1.0 when the last integer in the response equals the ground truth, else 0.0."""
    numbers = _NUMBER.findall(solution_str or "")
    return 1.0 if numbers and numbers[-1] == str(ground_truth).strip() else 0.0
