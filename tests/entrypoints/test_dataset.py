"""The generated prompt set loads with verl's own RLHFDataset, and its reward loads the way verl loads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_consistency.entrypoints.run import dataset

pytestmark = [pytest.mark.verl, pytest.mark.pinset]


def tiny_tokenizer(texts: list[str]):
    """A word-level tokenizer built in code (no hub download), with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for t in texts for w in t.replace(",", " , ").replace(".", " . ").split()})
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<unk>", "<eos>", "user", ":", *words])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<eos>{% endif %}"
    )
    return tok


def test_rlhf_dataset_loads_the_prompt_set(tmp_path: Path) -> None:
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    path = dataset.write_parquet(tmp_path / "data" / "train.parquet", size=24)
    rows = dataset.make_rows(24)
    tok = tiny_tokenizer([r["prompt"][0]["content"] for r in rows])
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 512,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "return_raw_chat": True,
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    ds = RLHFDataset(data_files=[str(path)], tokenizer=tok, config=config)
    assert len(ds) == 24  # nothing filtered out: every prompt fits max_prompt_length
    item = ds[3]
    assert item["raw_prompt"] == rows[3]["prompt"]
    assert item["data_source"] == dataset.DATA_SOURCE
    assert item["reward_model"] == rows[3]["reward_model"]
    assert item["index"] == 3
    lengths = sorted(
        len(
            tok(tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True))["input_ids"]
        )
        for r in rows
    )
    assert lengths[-1] > 4 * lengths[0]  # short and long prefills
    # verl really tokenizes with it: a tighter limit filters out exactly the longer prompts.
    limit = lengths[len(lengths) // 2]
    tight = RLHFDataset(
        data_files=[str(path)], tokenizer=tok, config=OmegaConf.merge(config, {"max_prompt_length": limit})
    )
    assert len(tight) == sum(n <= limit for n in lengths)


def test_prompt_set_is_deterministic_and_atomic(tmp_path: Path) -> None:
    assert dataset.make_rows(8) == dataset.make_rows(8)
    assert dataset.make_rows(8, seed=1) != dataset.make_rows(8)
    out = dataset.write_parquet(tmp_path / "train.parquet", size=8)
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temp file left behind
    with pytest.raises(ValueError, match="at least 1"):
        dataset.make_rows(0)


def test_reward_loads_like_verl_loads_it(tmp_path: Path) -> None:
    from verl.utils.import_utils import load_extern_object

    path = dataset.write_reward_fn(tmp_path / "data" / "reward.py")
    score = load_extern_object(module_path=str(path), object_name="compute_score")
    row = dataset.make_rows(1)[0]
    truth = row["reward_model"]["ground_truth"]
    kwargs = {"data_source": row["data_source"], "ground_truth": truth, "extra_info": row["extra_info"]}
    assert score(solution_str=f"12 + 30 ...\n{truth}", **kwargs) == 1.0
    # a wrong answer earns only the partial credit (test_reward.py), below any right one
    assert score(solution_str="I do not know", **kwargs) < 0.5
    assert score(solution_str=f"{int(truth) + 1}", **kwargs) < 0.5
