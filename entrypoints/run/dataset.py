"""A small prompt set in verl's parquet schema, generated in code, so a run needs no download.

The columns are the ones verl's own gsm8k preprocessing writes and ``RLHFDataset`` reads:
``data_source``, ``prompt`` (chat messages), ``ability``, ``reward_model`` {style, ground_truth}
and ``extra_info``. Prompt lengths vary on purpose (a few to a few hundred tokens): the
consistency check should see short and long prefills.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

from verl_consistency.contracts.atomic import atomic_path

DATA_SOURCE = "verl_consistency/arithmetic"
DEFAULT_SIZE = 64
DEFAULT_SEED = 20260513

_CONTEXT = (
    "A warehouse keeps a ledger of boxes that arrive and leave during the day. ",
    "Each entry in the ledger is written down exactly once and never changed afterwards. ",
    "The clerk double-checks every number before adding it to the running total. ",
)


def make_rows(size: int = DEFAULT_SIZE, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """Deterministic arithmetic questions: the same seed gives the same prompts, in the same order."""
    if size < 1:
        raise ValueError(f"prompt set size must be at least 1, got {size}")
    rng = random.Random(seed)
    rows = []
    for index in range(size):
        terms = [rng.randint(1, 999) for _ in range(rng.randint(2, 6))]
        context = "".join(rng.choice(_CONTEXT) for _ in range(rng.choice((0, 0, 1, 3, 8, 20))))
        question = (
            f"{context}Add the following numbers: {', '.join(map(str, terms))}. "
            "Think step by step and give the final answer as a single integer on the last line."
        )
        answer = str(sum(terms))
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": "train", "index": index, "answer": answer, "question": question},
            }
        )
    return rows


def write_parquet(path: Path, size: int = DEFAULT_SIZE, seed: int = DEFAULT_SEED) -> Path:
    """Write the prompt set atomically (temp file + rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(make_rows(size, seed))
    with atomic_path(path, mode=None) as tmp:
        pq.write_table(table, str(tmp))
    return path


def reward_source() -> Path:
    """The reward module beside this one (``contracts/reward.py``), copied into each run folder."""
    return Path(__file__).with_name("reward.py")


def write_reward_fn(path: Path) -> Path:
    with atomic_path(path) as tmp:
        shutil.copyfile(reward_source(), tmp)
    return path
