"""The hooks' decisions that need no engine: which engine dumps, config errors, PROMPTS_ONLY trim.

The trim runs on a real verl ``DataProto``; the FSDP tests run it inside the real engine.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from verl_consistency.patches.hooks.training import micro_batch_dump, prompts_only

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.pinset


def _engine(forward_only: bool = False, model_type: str = "language_model") -> SimpleNamespace:
    return SimpleNamespace(
        engine_config=SimpleNamespace(forward_only=forward_only),
        model_config=SimpleNamespace(model_type=model_type),
        rank=0,
    )


def test_only_the_actor_engine_dumps() -> None:
    assert micro_batch_dump.is_actor_engine(_engine())
    assert not micro_batch_dump.is_actor_engine(_engine(forward_only=True)), "ref engine"
    assert not micro_batch_dump.is_actor_engine(_engine(model_type="value_model")), "critic"


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
    monkeypatch.setattr(micro_batch_dump.dump_session, "session", lambda: object())
    got = micro_batch_dump.batch_dumper(_engine(), backend="fsdp", forward_only=forward_only)
    assert (got is not micro_batch_dump.NO_DUMP) == dumps


def test_missing_actor_config_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DUMP_ON", "1")
    monkeypatch.delenv("VERL_CONSISTENCY_ACTOR_CONFIG", raising=False)
    micro_batch_dump.reset_for_tests()
    with pytest.raises(micro_batch_dump.TrainingDumpError, match="VERL_CONSISTENCY_ACTOR_CONFIG is not set"):
        micro_batch_dump.batch_dumper(_engine(), backend="fsdp", forward_only=True)
    monkeypatch.setenv("VERL_CONSISTENCY_ACTOR_CONFIG", str(tmp_path / "nope.json"))
    with pytest.raises(micro_batch_dump.TrainingDumpError, match="no such file"):
        micro_batch_dump.batch_dumper(_engine(), backend="fsdp", forward_only=True)
    micro_batch_dump.reset_for_tests()


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
    assert "micro_batch_dump.batch_dumper" in names
    assert names.index("micro_batch_dump.batch_dumper") < names.index("forward_backward_func")

    step = _calls(_method(tree, "MegatronEngineWithLMHead", "forward_step"))
    lines = {c: ln for ln, c in reversed(step)}  # first occurrence of each call
    assert lines["micro_batch_dump.current"] < lines["dumper.start"]
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
    assert micro_batch_dump.request_ids_of(_td(request_id=["a", "b"])) == ["a", "b"]
    v1 = _td(extra_fields=[{"request_id": "a", "request_ids_all": ["a", "x"]}, {"request_id": "b"}])
    assert micro_batch_dump.request_ids_of(v1) == ["a", "b"]
    assert micro_batch_dump.request_ids_of(v1, "request_ids_all") == [["a", "x"], None]
    both = _td(request_id=["col"], extra_fields=[{"request_id": "nested"}])
    assert micro_batch_dump.request_ids_of(both) == ["col"], "a column wins"
    assert micro_batch_dump.request_ids_of(_td(extra_fields=[{"other": 1}])) == []
    assert micro_batch_dump.request_ids_of(_td(uid=["u"])) == []


def test_padding_rows_are_verl_091_synthetic_uids_only() -> None:
    pad = "pad" + "0123456789abcdef" * 2
    real = "3f2b8a9c-1d4e-4f5a-9b6c-7d8e9f0a1b2c"  # str(uuid4()), the trainer's dataset uid
    assert micro_batch_dump.padding_rows(_td(uid=[real, pad, "pad-not-hex"])) == [False, True, False]
    assert micro_batch_dump.padding_rows(_td(request_id=["a"])) == []


def _ride_along_td(nested: bool, marked: bool = False):  # type: ignore[no-untyped-def]
    """The 2-row micro batch of :func:`_rollout_batch` as verl's engine sees it: nested
    ``input_ids`` (rows of 4 + 2 and 5 + 1 tokens), ``prompts`` padded (RayPPOTrainer) or nested
    (verl 0.9's V1 path)."""
    from tensordict import NonTensorStack, TensorDict

    b = _rollout_batch().batch
    rows = [torch.tensor([5, 6, 11, 12]), torch.tensor([7, 8, 9, 10, 13])]
    fields: dict[str, object] = {
        "input_ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged),
        "request_id": NonTensorStack("a", "b"),
    }
    if nested:
        fields["prompts"] = torch.nested.as_nested_tensor(
            [torch.tensor([5, 6]), torch.tensor([7, 8, 9, 10])], layout=torch.jagged
        )
        fields["responses"] = torch.nested.as_nested_tensor(
            [torch.tensor([11, 12]), torch.tensor([13])], layout=torch.jagged
        )
        fields["rollout_log_probs"] = torch.nested.as_nested_tensor(
            [torch.tensor([-0.25, -0.5]), torch.tensor([-0.75])], layout=torch.jagged
        )
    else:
        for key in ("prompts", "responses", "attention_mask", "response_mask"):
            fields[key] = b[key]
        fields["rollout_log_probs"] = torch.tensor([[-0.25, -0.5, 0.0], [-0.75, 0.0, 0.0]])
    if marked:
        fields[prompts_only.PREFILL_ROWS] = NonTensorStack(4, 5)
    return TensorDict(fields, batch_size=[2])


@pytest.mark.parametrize("nested", [False, True], ids=["padded-prompts", "nested-prompts"])
def test_prompt_lengths_are_read_as_verl_reads_them(nested: bool) -> None:
    layout = micro_batch_dump.PackedLayout.of(_ride_along_td(nested))
    assert layout is not None
    assert layout.lengths == (4, 5)
    assert layout.prompts == (2, 4), "the rows vLLM prefilled: the prompts' valid tokens"
    assert not layout.prompt_only
    marked = micro_batch_dump.PackedLayout.of(_ride_along_td(nested, marked=True))
    assert marked is not None
    assert marked.prompt_only, "a PROMPTS_ONLY batch: its rows whole"


def test_lanes_and_last_positions_are_cut_to_the_prompt_rows() -> None:
    """Rows of 4 and 5 tokens whose prompts are 2 and 4: THD ``[begin, begin + p)`` on dims 1
    and 0; padded, the row and its first p positions; the output row at ``begin + p - 1``."""
    cut = micro_batch_dump.msprobe_lanes.Cut
    thd = micro_batch_dump.PackedLayout((4, 5), thd=True, prompts=(2, 4))
    lanes = thd.lanes(["a", "b"], ["b", "a"])
    assert lanes is not None
    assert [(x.request_id, x.cuts) for x in lanes] == [
        ("b", (cut(1, 9, 4, 8), cut(0, 9, 4, 8))),
        ("a", (cut(1, 9, 0, 2), cut(0, 9, 0, 2))),
    ]
    assert thd.last_positions() == [1, 7]
    padded = micro_batch_dump.PackedLayout((4, 5), thd=False, prompts=(2, 4))
    lanes = padded.lanes(["a", "b"], ["a", "b"])
    assert lanes is not None
    assert [x.cuts for x in lanes] == [
        (cut(0, 2, 0, 1), cut(1, 5, 0, 2)),
        (cut(0, 2, 1, 2), cut(1, 5, 0, 4)),
    ]
    assert padded.last_positions() == [1, 5 + 3]
    # without prompt lengths (a prompt-only forward) the cuts are the whole rows, as before
    whole = micro_batch_dump.PackedLayout((4, 5), thd=True)
    assert whole.prompt_only
    assert whole.last_positions() == [3, 8]
    lanes = whole.lanes(["a", "b"], ["b"])
    assert lanes is not None
    assert lanes[0].cuts == (cut(1, 9, 4, 9), cut(0, 9, 4, 9))
    assert whole.lanes(["a"], ["a"]) is None, "lengths that do not match the ids: dumped whole"


def test_unreadable_prompt_lengths_are_a_clear_error() -> None:
    from verl_consistency.patches.hooks.training.prompt_rows import PromptRowsError

    td = _ride_along_td(nested=False)
    del td["attention_mask"]
    with pytest.raises(PromptRowsError, match="no padded 'attention_mask'"):
        micro_batch_dump.PackedLayout.of(td)
    td = _ride_along_td(nested=False)
    del td["prompts"]
    with pytest.raises(PromptRowsError, match="has no 'prompts'"):
        micro_batch_dump.PackedLayout.of(td)
    from tensordict import NonTensorStack

    td = _ride_along_td(nested=True)
    td[prompts_only.PREFILL_ROWS] = NonTensorStack(4, 6)
    with pytest.raises(PromptRowsError, match=r"\[4, 6\].*rows of \[4, 5\] tokens"):
        micro_batch_dump.PackedLayout.of(td)


def test_the_trims_mark_each_row_with_the_tokens_vllm_prefilled(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = prompts_only.trim(_rollout_batch())
    assert list(batch.non_tensor_batch[prompts_only.PREFILL_ROWS]) == [2, 4], "the whole trimmed row"
    monkeypatch.setenv("PROMPTS_ONLY", "1")
    field = {
        "prompts": torch.tensor([1, 2, 3]),
        "responses": torch.tensor([7, 8]),
        "input_ids": torch.tensor([1, 2, 3, 7, 8]),
        "position_ids": torch.arange(5),
        "response_mask": torch.ones(2, dtype=torch.long),
    }
    assert prompts_only.trim_sample(field)[prompts_only.PREFILL_ROWS] == 3 == len(field["input_ids"])


def test_megatron_refuses_a_ride_along_forward_and_names_prompts_only() -> None:
    ride = _ride_along_td(nested=False)
    with pytest.raises(micro_batch_dump.TrainingDumpError, match="--prompts-only"):
        micro_batch_dump.check_megatron_prompt_only(ride, micro_batch_dump.PackedLayout.of(ride))
    marked = _ride_along_td(nested=False, marked=True)
    micro_batch_dump.check_megatron_prompt_only(marked, micro_batch_dump.PackedLayout.of(marked))
    micro_batch_dump.check_megatron_prompt_only(marked, None)
    with pytest.raises(micro_batch_dump.TrainingDumpError, match="--prompts-only"):
        micro_batch_dump.check_megatron_prompt_only(ride, None)


@pytest.mark.parametrize("nested", [False, True], ids=["padded", "nested"])
def test_ride_along_next_token_is_read_from_the_responses(
    monkeypatch: pytest.MonkeyPatch, nested: bool
) -> None:
    from verl_consistency.patches.hooks.training import next_token

    got = next_token.rollout_next_tokens(_ride_along_td(nested))
    assert got == ([11, 13], [-0.25, -0.75])
    assert next_token.rollout_next_tokens(_ride_along_td(nested, marked=True)) is None, (
        "a trimmed batch's response is its last prompt token"
    )
    td = _ride_along_td(nested)
    del td["rollout_log_probs"]
    assert next_token.rollout_next_tokens(td) is None
    if not nested:
        td = _ride_along_td(nested)
        td["response_mask"][1, 0] = 0
        td["rollout_log_probs"][0, 0] = float("nan")
        assert next_token.rollout_next_tokens(td) == ([None, None], [None, None])
    # the probe: only with the layout's positions (a response follows the prompt)
    monkeypatch.setenv("VERL_CONSISTENCY_TOKEN_LEVEL", "1")
    monkeypatch.setenv("VERL_CONSISTENCY_RUN_DIR", "/nonexistent-run")
    head = torch.nn.Linear(2, 16)
    model = SimpleNamespace(lm_head=head)
    td = _ride_along_td(nested)
    assert next_token.NextTokenProbe.attach(td, model) is None
    probe = next_token.NextTokenProbe.attach(td, model, wanted=[1], last_positions=[1, 7])
    assert probe is not None
    assert [(r.position, r.token, r.rollout_log_prob) for r in probe.rows] == [(7, 13, -0.75)]
    head(torch.randn(9, 2))
    probe.detach()
    assert len(probe.last) == 1
    assert probe.last[0].shape == (16,)
