"""``verl-consistency check`` refuses what it cannot do before any engine starts: exit 1, one
line saying what to change, and nothing written (no run folder, no model built, inputs unchanged).

Through the command a user types (the typer app). None of these needs vLLM: each refusal comes
before the first engine process, which is why they run in the test venv.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verl_consistency.entrypoints.check import command as check
from verl_consistency.entrypoints.cli import app
from verl_consistency.entrypoints.engines.fsdp_stage import FP32, precision


def _check(tmp_path: Path, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["check", "--dump-root", str(tmp_path / "out"), *args])
    return res.exit_code, res.output


def _written(tmp_path: Path) -> list[str]:
    out = tmp_path / "out"
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else []


def test_megatron_is_refused_with_the_way_out(tmp_path):
    code, out = _check(tmp_path, "--engine", "megatron")
    assert code == 1
    assert "--engine megatron" in out
    assert "--engine fsdp" in out
    assert _written(tmp_path) == []


def test_a_gpu_without_a_model_is_refused(tmp_path):
    code, out = _check(tmp_path, "--device", "cuda")
    assert code == 1
    assert "--model" in out
    assert _written(tmp_path) == []


def test_a_model_folder_without_config_is_named(tmp_path):
    bare = tmp_path / "not-a-model"
    bare.mkdir()
    code, out = _check(tmp_path, "--model", str(bare))
    assert code == 1
    assert str(bare) in out
    assert "config.json" in out


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("empty.txt", "\n  \n", "no prompt in it"),
        ("bad.jsonl", '{"prompt": "one"}\n{"prompt": \n', "bad.jsonl:2"),
        ("wrong.jsonl", '{"prompt": "one"}\n{"text": "two"}\n', "wrong.jsonl:2"),
    ],
)
def test_a_bad_prompts_file_is_named_with_its_line_and_left_as_it_was(tmp_path, name, text, where):
    f = tmp_path / name
    f.write_text(text)
    code, out = _check(tmp_path, "--prompts", str(f))
    assert code == 1
    assert where in out.replace("\n", "")
    assert f.read_text() == text
    assert _written(tmp_path) == []


def test_a_micro_batch_that_does_not_divide_the_prompts_is_refused_before_the_model_is_built(tmp_path):
    code, out = _check(tmp_path, "--num-prompts", "6", "--micro-batch", "4")
    assert code == 1
    assert "--micro-batch 4" in out
    assert _written(tmp_path) == []  # the built-in model is built only once every input passed


def test_an_existing_run_folder_is_never_overwritten(tmp_path):
    run = tmp_path / "out" / "mine"
    run.mkdir(parents=True)
    (run / "keep.txt").write_text("earlier results")
    code, out = _check(tmp_path, "--run-id", "mine")
    assert code == 1
    assert "exists" in out
    assert _written(tmp_path) == ["mine", "mine/keep.txt"]
    assert (run / "keep.txt").read_text() == "earlier results"


def test_a_bad_run_id_is_refused(tmp_path):
    code, out = _check(tmp_path, "--run-id", "Bad Id")
    assert code == 1
    assert "--run-id" in out


def test_prompts_files_read_as_lines_or_jsonl(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\nsecond prompt\n")
    jl = tmp_path / "p.jsonl"
    jl.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": "b c"}) + "\n")
    assert check.read_prompts(txt) == ["first prompt", "second prompt"]
    assert check.read_prompts(jl) == ["a", "b c"]


def test_precision_follows_the_dtype_and_the_device():
    assert precision("cpu", "float32") == ([FP32], "eager")
    extra, attn = precision("cuda", "bfloat16")
    assert attn == "sdpa"
    assert extra == [
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:bf16,reduce_dtype:fp32,buffer_dtype:fp32}"
    ]


def test_auto_dtype_is_the_models_own(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert check.resolve_dtype(tmp_path, check.Dtype.auto) == "bfloat16"
    assert check.resolve_dtype(tmp_path, check.Dtype.float32) == "float32"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "int8"}))
    with pytest.raises(check.CheckError, match="--dtype"):
        check.resolve_dtype(tmp_path, check.Dtype.auto)
