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
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from verl_consistency.entrypoints.engines.stage_runner import StageError
from verl_consistency.entrypoints.run import dataset

PERTURBED_MODULE = "model.layers.1.mlp.down_proj"
"""The training copy's weight that ``--perturb`` changes: ``W·1.2 + 0.2·std(W)·noise``."""
PERTURBATION = 0.2


def prompt_texts(size: int) -> list[str]:
    """The embedded prompt set's user turns, as plain text (our tokenizer has no chat template)."""
    return [f"user: {row['prompt'][0]['content']}" for row in dataset.make_rows(size)]


def build_model(model_dir: Path, texts: list[str], layers: int = 2) -> None:
    """Random Qwen2 + an offline word-level tokenizer, saved as a Hugging Face folder.

    ``layers``: 2 for the demo and ``check``; the weight-sync test's planted fault sits in layer 2
    (``engines/weight_sync``), so it builds 3."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["<unk>", "<pad>", "<eos>"]))
    vocab = 256
    if tok.get_vocab_size() > vocab:
        raise StageError(f"the prompt set needs {tok.get_vocab_size()} tokens; raise the demo's vocab")
    config = Qwen2Config(
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
    torch.manual_seed(0)
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    Qwen2ForCausalLM(config).save_pretrained(tmp)
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
