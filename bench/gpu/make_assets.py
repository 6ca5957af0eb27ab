"""A random bf16 Qwen2 and a tokenizer that verl 0.9.1 accepts, built at run time on the device.

usage: python3 make_assets.py OUTDIR   (writes OUTDIR/model)

Why a trained byte-level BPE and not a word list: under transformers 5.x a ``model_type=qwen2``
folder loads as ``Qwen2Tokenizer``, which rebuilds a byte-level BPE from vocab and merges and
silently ignores a WordLevel ``tokenizer.json``; and verl's Qwen code needs ``"\\n"`` to be one
token and ``<|im_end|>`` to exist (``ValueError: Expected Qwen newline to tokenize to one token``,
verl/utils/tokenizer/continuous_token.py:558). The prompt set and the reward are the bundle's own
(``verl-consistency run`` writes them into the run folder).
"""

from __future__ import annotations

import os
import random
import sys
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, GenerationConfig, Qwen2Tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus() -> list[str]:
    rng = random.Random(0)
    words = ["user", "assistant", "what", "is", "plus", "minus", "the", "answer", "a", "number", "sum", "of"]
    words += [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(3, 9)))
        for _ in range(800)
    ]
    out = []
    for _ in range(6000):
        x, y = rng.randrange(100), rng.randrange(100)
        out.append(
            f"<|im_start|>user\nwhat is {x} plus {y} ?<|im_end|>\n"
            f"<|im_start|>assistant\nthe answer is {x + y} ."
        )
        out.append(
            " ".join(rng.choice(words) for _ in range(12))
            + f" {rng.randrange(1000)} , {rng.randrange(1000)} !"
        )
    # The bundle's own prompt set (what `verl-consistency run` writes as data/train.parquet), so its
    # words are single tokens: prompts stay short and so do the tensor dumps.
    from verl_consistency.entrypoints.run.dataset import make_rows

    for row in make_rows():
        out += [f"<|im_start|>user\n{row['prompt'][0]['content']}<|im_end|>\n<|im_start|>assistant\n"] * 20
    return out


def main(out: str) -> None:
    t0 = time.time()
    mdir = os.path.join(out, "model")
    tk = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        min_frequency=2,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(corpus(), trainer=trainer)
    import json

    st = json.loads(tk.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in st["merges"]]
    tok = Qwen2Tokenizer(
        vocab=st["vocab"],
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=4096,
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok.save_pretrained(mdir)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    # The shape: hidden >= 512, >= 4 layers, head_dim 64 (FlashAttention 3 in vLLM).
    from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2, tiny_qwen2_config

    cfg = tiny_qwen2_config(
        vocab_size=len(tok),
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    model = tiny_qwen2(cfg, seed=0).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]
    )
    model.save_pretrained(mdir)
    t2 = AutoTokenizer.from_pretrained(mdir)
    assert len(t2.encode("\n", add_special_tokens=False)) == 1, "verl needs '\\n' to be one token"
    print("ASSETS_OK", mdir, type(t2).__name__, "vocab", len(t2), "%.1fs" % (time.time() - t0), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
