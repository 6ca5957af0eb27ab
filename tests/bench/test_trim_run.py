"""``bench/gpu/trim_run.py``: what a GPU run folder keeps on its way into CI's fixtures.

Run on a real one, the H100 fully-async planted-fault run (``tests/postprocess/fixtures/``, 12 pairs:
two of each of its six training steps), without msprobe's compare: only the pairing is read.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench.gpu import trim_run
from tests.postprocess.gpu_runs import unpack
from tests.postprocess.pairing_trees import tree_digest
from verl_consistency.postprocess.output.per_step import training_version
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.pair import pair_run
from verl_consistency.postprocess.pairing.pair_types import Pair

RUN_ID = "h200-next-fully-async-ride-along-fault"


def _pairs(run: Path) -> list[Pair]:
    return pair_run(discover.Roots.open(run)).pairs


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack("h100-next-fully-async-fault.tar.xz", RUN_ID, tmp_path_factory.mktemp("run"))


def test_per_step_keeps_the_shortest_prompts_of_every_step(run: Path, tmp_path: Path) -> None:
    before = tree_digest(run)
    pairs = _pairs(run)
    steps = Counter(training_version(p) for p in pairs)
    assert len(steps) == 6, "the fixture: six training steps"
    assert set(steps.values()) == {2}, "... and two pairs of each"
    dest = tmp_path / RUN_ID
    assert trim_run.main([str(run), str(dest), "--per-step", "1", "--min-pairs", "1"]) == 0
    kept = _pairs(dest)
    assert Counter(training_version(p) for p in kept) == dict.fromkeys(steps, 1)
    for p in kept:
        same_step = [q for q in pairs if training_version(q) == training_version(p)]
        assert p.prompt_tokens == min(q.prompt_tokens for q in same_step)
    dropped = {p.pair_id for p in pairs} - {p.pair_id for p in kept}
    for p in pairs:
        if p.pair_id in dropped:
            assert not (dest / p.actor.dir).exists(), (
                "a dropped pair's dumps go, so it re-pairs as dump_missing"
            )
    assert tree_digest(run) == before, "the run folder is read, never changed"


def test_per_step_of_pairs_without_versions_is_one_group() -> None:
    pairs = [
        Pair.model_construct(pair_id=f"p{i}", weight_version=v, trainer_weight_version=None)
        for i, v in enumerate([None, None, 0, None, 0, 1])
    ]
    assert [p.pair_id for p in trim_run.per_step(pairs, 2)] == ["p0", "p1", "p2", "p4", "p5"]
