"""``check.encode``: the prompts as token ids, through the model's own chat template; and the
rollout's deadline on vLLM.

Found on the H200 (issue 22): under transformers 5, ``apply_chat_template(tokenize=True)`` returns
a ``BatchEncoding`` (a UserDict, not a dict), so ``list()`` of it was its keys; vLLM 0.23's engine
core then died decoding ``'input_ids'`` as a token id and the check waited for it until its time
limit. These tests use a real tokenizer folder with a ChatML template, as Qwen's are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_consistency.entrypoints.check.command import CheckError, encode

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>"]


def _tokenizer(folder: Path, *, template: str | None) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        ["user assistant hello world two words", "more words"],
        trainers.WordLevelTrainer(special_tokens=SPECIALS),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>")
    fast.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(folder)
    return folder


def test_chat_template_prompts_are_token_ids_with_the_template_around_them(tmp_path):
    folder = _tokenizer(tmp_path / "tok", template=CHATML)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    ids = encode(folder, ["hello world", "two words"])
    assert all(isinstance(i, int) for p in ids for i in p)
    hello, world, user, assistant = tok.convert_tokens_to_ids(["hello", "world", "user", "assistant"])
    assert ids[0] == [start, user, hello, world, end, start, assistant]
    assert len(ids[1]) == len(ids[0])


def test_without_a_template_the_plain_text_is_tokenized(tmp_path):
    folder = _tokenizer(tmp_path / "tok", template=None)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    assert encode(folder, ["hello world"]) == [tok.convert_tokens_to_ids(["hello", "world"])]


def test_a_prompt_that_tokenizes_to_nothing_is_named(tmp_path):
    folder = _tokenizer(tmp_path / "tok", template=None)
    with pytest.raises(CheckError, match=r"made prompt 1 into \[\], not token ids"):
        encode(folder, ["hello", "   "])


def test_a_silent_engine_ends_the_pass_with_its_name():
    """``check_stages.within``: a request vLLM never answers (what a dead engine core leaves)
    ends the pass with the reason and the flag to raise, instead of waiting forever."""
    import asyncio

    from verl_consistency.entrypoints.check.stages import EngineSilent, within

    async def never() -> None:
        await asyncio.Event().wait()

    async def answer() -> int:
        await asyncio.sleep(0)
        return 7

    with pytest.raises(EngineSilent, match=r"within 0\.05 s \(the batched pass\).*--request-timeout"):
        asyncio.run(within(never(), 0.05, "the batched pass"))
    assert asyncio.run(within(answer(), 5, "prompt 0 alone")) == 7
