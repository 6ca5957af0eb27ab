"""The hooks' decisions that need no engine: which engine dumps, config errors, PROMPTS_ONLY trim.

The trim runs on a real verl ``DataProto``; the FSDP tests run it inside the real engine.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from verl_consistency.patches.hooks import prompts_only, training

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.pinset


def _engine(forward_only: bool = False, model_type: str = "language_model") -> SimpleNamespace:
    return SimpleNamespace(
        engine_config=SimpleNamespace(forward_only=forward_only),
        model_config=SimpleNamespace(model_type=model_type),
        rank=0,
    )


def test_only_the_actor_engine_dumps() -> None:
    assert training.is_actor_engine(_engine())
    assert not training.is_actor_engine(_engine(forward_only=True)), "ref engine"
    assert not training.is_actor_engine(_engine(model_type="value_model")), "critic"


@pytest.mark.parametrize(
    ("env", "forward_only", "dumps"),
    [
        ({}, True, False),
        ({"DUMP_ON": "1"}, True, True),
        ({"DUMP_ON": "1"}, False, False),
        ({"DUMP_ON": "1", "DUMP_PHASE": "update_actor"}, False, True),
        ({"DUMP_ON": "1", "DUMP_PHASE": "update_actor"}, True, False),
        ({"DUMP_ON": "1", "DUMP_PHASE": "all"}, False, True),
    ],
)
def test_phase_selection(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], forward_only: bool, dumps: bool
) -> None:
    for k in ("DUMP_ON", "DUMP_PHASE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(training, "_session", lambda: object())
    got = training.batch_dumper(_engine(), backend="fsdp", forward_only=forward_only)
    assert (got is not training.NO_DUMP) == dumps


def test_missing_actor_config_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DUMP_ON", "1")
    monkeypatch.delenv("VERL_CONSISTENCY_ACTOR_CONFIG", raising=False)
    training.reset_for_tests()
    with pytest.raises(training.TrainingDumpError, match="VERL_CONSISTENCY_ACTOR_CONFIG is not set"):
        training.batch_dumper(_engine(), backend="fsdp", forward_only=True)
    monkeypatch.setenv("VERL_CONSISTENCY_ACTOR_CONFIG", str(tmp_path / "nope.json"))
    with pytest.raises(training.TrainingDumpError, match="no such file"):
        training.batch_dumper(_engine(), backend="fsdp", forward_only=True)
    training.reset_for_tests()


def _rollout_batch():  # type: ignore[no-untyped-def]
    import numpy as np
    from verl import DataProto

    prompts = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    responses = torch.tensor([[11, 12, 0], [13, 0, 0]])
    attn = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]])
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": attn[:, 4:].clone(),
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attn,
            "position_ids": torch.clamp(attn.cumsum(-1) - 1, min=0),
            "rm_scores": torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
            "rollout_log_probs": torch.full((2, 3), -0.5),
        },
        non_tensors={"request_id": np.array(["a", "b"], dtype=object)},
        meta_info={"global_token_num": [4, 5]},
    )


def test_prompts_only_resplits_the_prompt_on_a_real_dataproto() -> None:
    batch = prompts_only.trim(_rollout_batch())
    b = batch.batch
    assert b["input_ids"].tolist() == [[0, 0, 5, 6], [7, 8, 9, 10]], "forward input = the prompt exactly"
    assert b["attention_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert b["prompts"].tolist() == [[0, 0, 5], [7, 8, 9]]
    assert b["responses"].tolist() == [[6], [10]], "the last prompt token is the one-token response"
    assert b["response_mask"].tolist() == [[1], [1]], "one valid token: no empty-mask NaN"
    assert b["rm_scores"].tolist() == [[0.0], [0.0]]
    assert "rollout_log_probs" not in b
    assert b["position_ids"].shape == (2, 4)
    assert batch.meta_info["global_token_num"] == [2, 4]
    assert list(batch.non_tensor_batch["request_id"]) == ["a", "b"]


def test_prompts_only_refuses_bypass_mode_and_unknown_keys() -> None:
    with pytest.raises(prompts_only.PromptsOnlyError, match=re.escape(prompts_only.BYPASS_OVERRIDE)):
        prompts_only.trim(_rollout_batch(), bypass_mode=True)
    batch = _rollout_batch()
    batch.batch["teacher_logprobs"] = torch.zeros(2, 3)
    with pytest.raises(prompts_only.PromptsOnlyError, match="teacher_logprobs"):
        prompts_only.trim(batch)


def test_prompts_only_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMPTS_ONLY", raising=False)
    batch = _rollout_batch()
    assert prompts_only.apply(batch, bypass_mode=True) is batch
    assert batch.batch["responses"].shape == (2, 3)


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{cls}.{name} not found")


def _calls(fn: ast.FunctionDef) -> list[tuple[int, str]]:
    return sorted((n.lineno, ast.unparse(n.func)) for n in ast.walk(fn) if isinstance(n, ast.Call))


def test_megatron_patch_wraps_forward_fn_in_start_stop(root: Path) -> None:
    """megatron-core is not installed here, so the patched Megatron engine is checked with ast."""
    tree = ast.parse((root / "verl/workers/engine/megatron/transformer_impl.py").read_text())
    fbb = _calls(_method(tree, "MegatronEngine", "forward_backward_batch"))
    names = [c for _, c in fbb]
    assert "training.batch_dumper" in names
    assert names.index("training.batch_dumper") < names.index("forward_backward_func")

    step = _calls(_method(tree, "MegatronEngineWithLMHead", "forward_step"))
    lines = {c: ln for ln, c in reversed(step)}  # first occurrence of each call
    assert lines["training.current"] < lines["dumper.start"]
    assert lines["dumper.start"] < lines["fused_forward_fn"] < lines["dumper.stop"]
    assert lines["dumper.start"] < lines["forward_fn"] < lines["dumper.stop"]
    assert [c for _, c in step].count("dumper.start") == 1
    assert [c for _, c in step].count("dumper.stop") == 1
    # the critic's forward_step (value head) is not patched
    value = _calls(_method(tree, "MegatronEngineWithValueHead", "forward_step"))
    assert not any("dumper" in c for _, c in value)


def _td(**non_tensor: list[object]):  # type: ignore[no-untyped-def]
    """A micro batch as the engines see it: a TensorDict whose non-tensor fields are stacks."""
    from tensordict import NonTensorStack, TensorDict

    n = len(next(iter(non_tensor.values())))
    fields = {k: NonTensorStack(*v) for k, v in non_tensor.items()}
    return TensorDict({"input_ids": torch.zeros(n, 2, dtype=torch.long), **fields}, batch_size=[n])


def test_request_ids_from_a_column_or_from_v1_extra_fields() -> None:
    """verl 0.8.0 flattens extra_fields into columns; verl 0.9.1's V1 path keeps one dict per row."""
    assert training.request_ids_of(_td(request_id=["a", "b"])) == ["a", "b"]
    v1 = _td(extra_fields=[{"request_id": "a", "request_ids_all": ["a", "x"]}, {"request_id": "b"}])
    assert training.request_ids_of(v1) == ["a", "b"]
    assert training.request_ids_of(v1, "request_ids_all") == [["a", "x"], None]
    both = _td(request_id=["col"], extra_fields=[{"request_id": "nested"}])
    assert training.request_ids_of(both) == ["col"], "a column wins"
    assert training.request_ids_of(_td(extra_fields=[{"other": 1}])) == []
    assert training.request_ids_of(_td(uid=["u"])) == []


def test_padding_rows_are_verl_091_synthetic_uids_only() -> None:
    pad = "pad" + "0123456789abcdef" * 2
    real = "3f2b8a9c-1d4e-4f5a-9b6c-7d8e9f0a1b2c"  # str(uuid4()), the trainer's dataset uid
    assert training.padding_rows(_td(uid=[real, pad, "pad-not-hex"])) == [False, True, False]
    assert training.padding_rows(_td(request_id=["a"])) == []
