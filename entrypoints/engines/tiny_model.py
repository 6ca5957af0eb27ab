"""The built-in model of a single-node run: a tiny random Qwen2, its tokenizer and its prompts.

Why built, not downloaded: the demo, ``check`` without ``--model`` and the vLLM bench must run on
a machine with no hub access, and a random model of Qwen2's architecture exercises every kernel
and hook the real ones do. It is:

* a random Qwen2 (hidden 128, 2 heads of 64, 2 layers unless told, fp32) built from a config and saved with
  ``save_pretrained``, with a word-level tokenizer trained offline on the embedded prompt set
  (``verl_consistency.entrypoints.run.dataset``);
* its perturbed copy (:func:`perturbed_copy`): one weight (:data:`PERTURBED_MODULE`) changed, for
  the training side of the demo's second run and the check's test, whose first divergence must be
  that module.

It is also the one home of the random Qwen2 itself (:func:`tiny_qwen2_config`, :func:`tiny_qwen2`):
the tests, the benches, the Docker sample run and the GPU machine's ``bench/gpu/make_assets.py``
build theirs here, each at its own widths, so that one seed and one construction order give every
caller the same weights for the same config.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_consistency.entrypoints.engines.stage_runner import StageError
from verl_consistency.entrypoints.run import dataset

if TYPE_CHECKING:
    from transformers import Qwen2Config, Qwen2ForCausalLM

PERTURBED_MODULE = "model.layers.1.mlp.down_proj"
"""The training copy's weight that ``--perturb`` changes: ``W·1.2 + 0.2·std(W)·noise``."""
PERTURBATION = 0.2


def tiny_qwen2_config(
    *,
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    **extra: Any,
) -> Qwen2Config:
    """A small ``Qwen2Config``: 2 layers and 4 query heads over 2 KV heads unless told (so grouped-query
    attention is exercised); ``extra`` passes any other field through (e.g. ``tie_word_embeddings``)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        **extra,
    )


def tiny_qwen2(config: Qwen2Config, seed: int = 0) -> Qwen2ForCausalLM:
    """The transformers model of ``config`` with weights from ``torch.manual_seed(seed)``, in eval mode.

    Built on the current default device (a caller may wrap it in ``with torch.device(...)``)."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


def prompt_texts(size: int) -> list[str]:
    """The embedded prompt set's user turns, as plain text (our tokenizer has no chat template)."""
    return [f"user: {row['prompt'][0]['content']}" for row in dataset.make_rows(size)]


def build_model(model_dir: Path, texts: list[str], layers: int = 2) -> None:
    """Random Qwen2 + an offline word-level tokenizer, saved as a Hugging Face folder.

    ``layers``: 2 for the demo and ``check``; the weight-sync test's planted fault sits in layer 2
    (``engines/weight_sync``), so it builds 3."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["<unk>", "<pad>", "<eos>"]))
    vocab = 256
    if tok.get_vocab_size() > vocab:
        raise StageError(f"the prompt set needs {tok.get_vocab_size()} tokens; raise the demo's vocab")
    config = tiny_qwen2_config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,  # head_dim 64: vLLM's CPU attention refuses 16
        num_key_value_heads=1,  # grouped-query attention, as Qwen2 ships
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        dtype="float32",
        eos_token_id=2,
        pad_token_id=1,
    )
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tiny_qwen2(config, seed=0).save_pretrained(tmp)
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    ).save_pretrained(tmp)
    os.replace(tmp, model_dir)


def perturbed_copy(model_dir: Path, dest: Path, module: str = PERTURBED_MODULE) -> None:
    """The same model with ``module``'s weight scaled and jittered (the training side's copy)."""
    import torch
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    weight = model.get_submodule(module).weight
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        noise = torch.randn(weight.shape, generator=gen)
        weight.mul_(1 + PERTURBATION).add_(PERTURBATION * weight.std() * noise)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for extra in model_dir.glob("tokenizer*"):
        shutil.copy2(extra, tmp / extra.name)
    os.replace(tmp, dest)


def encode(model_dir: Path, texts: list[str]) -> list[list[int]]:
    """Token ids from the tiny model's own tokenizer (plain text: it has no chat template)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    return [list(tok(t)["input_ids"]) for t in texts]


def ensure_built(model_dir: Path) -> Path:
    """The tiny model at ``model_dir``, built on the embedded prompt set unless a run built it before."""
    if not (model_dir / "config.json").is_file():
        build_model(model_dir, prompt_texts(dataset.DEFAULT_SIZE))
    return model_dir
