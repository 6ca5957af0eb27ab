"""The embedded reward pays the right answer most, and varies across a random model's responses.

Why both: GRPO's advantage is a response's reward minus its group's mean, so a reward that never
pays a random model leaves every advantage and ``actor/grad_norm`` at 0, and the weights never
move (issue 35, measured on an H200). The last test runs verl's own reward worker on the config
that ``verl-consistency run`` composes, so the reward is loaded and called as verl does it.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verl_consistency.entrypoints.cli import app
from verl_consistency.entrypoints.engines import tiny_model
from verl_consistency.entrypoints.run import dataset, reward
from verl_consistency.entrypoints.run.overrides import ENV, Mode, launch

ROWS = dataset.make_rows(16)
GROUP = 2
"""Responses per prompt: the run's ``actor_rollout_ref.rollout.n`` (GRPO's group)."""


def _score(row: dict, text: str) -> float:
    truth = row["reward_model"]["ground_truth"]
    return reward.compute_score(row["data_source"], text, truth, extra_info=row["extra_info"])


def random_unicode(rng: random.Random, tokens: int = 16) -> str:
    """What a random model with a large byte-level vocabulary (Qwen2's, 150k tokens) decodes to:
    pieces of Latin words, digits, punctuation, CJK and Cyrillic characters, in no order."""
    latin, digits, punct = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " .,;:!?-\n"

    def piece() -> str:
        kind = rng.random()
        if kind < 0.4:
            return " " * rng.randint(0, 1) + "".join(rng.choice(latin) for _ in range(rng.randint(1, 7)))
        if kind < 0.5:
            return rng.choice(digits)
        if kind < 0.6:
            return rng.choice(punct)
        if kind < 0.9:
            return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 2)))
        return "".join(chr(rng.randint(0x0410, 0x044F)) for _ in range(rng.randint(1, 4)))

    return "".join(piece() for _ in range(tokens))


def test_right_answer_scores_highest() -> None:
    rng = random.Random(7)
    for row in ROWS:
        truth = int(row["reward_model"]["ground_truth"])
        right = _score(row, f"Adding them up step by step.\n{truth}")
        assert right == reward.RIGHT == 1.0
        assert _score(row, f"{truth:05d}") == right  # the same integer, zero-padded
        wrong = [
            f"Adding them up step by step.\n{truth + 1}",  # a near miss in the asked-for format
            f"{truth} is what I first thought, but it is {truth + 3}",  # the answer, not last
            "I do not know",
            "",
            random_unicode(rng, 64) + f"\n{truth - 1}",  # varied text and a near miss
        ]
        for text in wrong:
            assert 0.0 <= _score(row, text) < reward.PARTIAL_MAX < right, text


def test_partial_credit_rewards_what_a_real_model_should_learn() -> None:
    """Nearer answers, the asked-for format, a number at all earn more: the shaping points at the
    right answer. Each pair has the same characters, so the variety term is equal within it."""

    def score(text: str) -> float:
        return reward.compute_score(dataset.DATA_SOURCE, text, "100")

    assert score("so:\n101") > score("so:\n110") > score("so:\n0111") > score("so:\n1110")
    assert score("so:\n101") > score("101\nso:")  # the integer on the last line
    assert score("so 11") > score("so ll")  # a number at all
    assert score("so:\n100") == reward.RIGHT


@pytest.mark.parametrize("tokens", [4, 16, 128, 1024])
def test_varies_across_random_responses_within_grpo_groups(tokens: int) -> None:
    """Random text gets different scores, also between the responses to one prompt, short or long
    (16 tokens: the H200 triage run; 128: the run's data.max_response_length; 1024: past
    reward.VARIETY_CHARS)."""
    rng = random.Random(20260513)
    scores = [[_score(row, random_unicode(rng, tokens)) for _ in range(GROUP)] for row in ROWS]
    flat = [s for group in scores for s in group]
    assert statistics.pstdev(flat) > 0
    assert all(0.0 <= s < reward.PARTIAL_MAX for s in flat)
    # GRPO's advantage is zero for a group whose responses all score the same; any difference
    # counts in full, since verl's GRPO divides by the group's std (norm_adv_by_std_in_grpo)
    assert sum(max(g) > min(g) for g in scores) >= 0.9 * len(scores)


@pytest.mark.verl
@pytest.mark.pinset
def test_deterministic_and_the_run_folder_copy_is_the_same(tmp_path: Path) -> None:
    from verl.utils.import_utils import load_extern_object

    copy = load_extern_object(
        module_path=str(dataset.write_reward_fn(tmp_path / "reward.py")), object_name="compute_score"
    )
    rng = random.Random(3)
    texts = [random_unicode(rng) for _ in range(20)]
    row = ROWS[1]
    kwargs = {"data_source": row["data_source"], "ground_truth": row["reward_model"]["ground_truth"]}
    first = [reward.compute_score(solution_str=t, **kwargs) for t in texts]
    assert first == [reward.compute_score(solution_str=t, **kwargs) for t in texts]
    assert first == [copy(solution_str=t, **kwargs) for t in texts]


def _plan(tmp_path: Path, model: Path, *options: str) -> dict:
    unset = dict.fromkeys({row.name for row in ENV} | {"VERL_CONSISTENCY_RUN_ID", "VERL_CONSISTENCY_CAPTURE"})
    args = ["run", "hybrid", *options, "--dry-run", "--json", "--dump-root", str(tmp_path), "--run-id", "rw"]
    result = CliRunner().invoke(app, [*args, f"model={model}"], env=unset)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _batch(tokenizer, responses: list[list[int]], rows: list[dict]):
    """A DataProto as verl's agent loop hands it to the reward worker (one prompt token each)."""
    import numpy as np
    import torch
    from verl import DataProto

    width = max(len(r) for r in responses)
    ids = torch.full((len(responses), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(responses), 1 + width), dtype=torch.long)
    mask[:, 0] = 1
    for i, r in enumerate(responses):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, 1 : 1 + len(r)] = 1
    return DataProto.from_dict(
        tensors={"responses": ids, "attention_mask": mask},
        non_tensors={
            "data_source": np.array([r["data_source"] for r in rows], dtype=object),
            "reward_model": np.array([r["reward_model"] for r in rows], dtype=object),
            "extra_info": np.array([dict(r["extra_info"]) for r in rows], dtype=object),
        },
    )


@pytest.mark.verl
@pytest.mark.pinset
@pytest.mark.parametrize("kind", [(), ("--token-level",)], ids=["collection", "token-level"])
def test_verls_reward_worker_loads_it_as_the_run_wires_it(tmp_path: Path, kind: tuple[str, ...]) -> None:
    """verl's RewardLoopWorker, on the run's composed config, scores the demo's random model's tokens."""
    from transformers import AutoTokenizer
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from . import verl_validation

    model = tmp_path / "model"
    tiny_model.build_model(model, tiny_model.prompt_texts(64))
    plan = _plan(tmp_path, model, *kind)
    assert f"reward.custom_reward_function.path={tmp_path}/rw/data/reward.py" in plan["overrides"]
    dataset.write_reward_fn(tmp_path / "rw" / "data" / "reward.py")  # as prepare_run_dir does
    config = verl_validation.validate(launch(Mode.HYBRID).module, plan["overrides"])

    worker = RewardLoopWorker(config)
    tokenizer = AutoTokenizer.from_pretrained(model)
    rng = random.Random(11)
    rows = [row for row in ROWS for _ in range(GROUP)]
    right = [tokenizer(f"so {r['reward_model']['ground_truth']}")["input_ids"] for r in rows[:2]]
    noise = [[rng.randrange(3, tokenizer.vocab_size) for _ in range(16)] for _ in rows[2:]]
    out = worker.loop.run_until_complete(worker.compute_score_batch(_batch(tokenizer, right + noise, rows)))
    scores = [o["reward_score"] for o in out]
    assert scores[:2] == [reward.RIGHT, reward.RIGHT]
    texts = [tokenizer.decode(n, skip_special_tokens=True) for n in noise]
    assert scores[2:] == [_score(r, t) for r, t in zip(rows[2:], texts, strict=True)]
    assert max(scores[2:]) < reward.PARTIAL_MAX
    groups = [scores[i : i + GROUP] for i in range(2, len(scores), GROUP)]
    assert sum(max(g) > min(g) for g in groups) >= 0.75 * len(groups)  # GRPO's advantages are not all 0
