"""Weight versions at their source: verl's sync label reaches both sides' records (issue 35).

The state machine runs as the engines drive it (``micro_batch_dump.batch_dumper`` per
``forward_backward_batch``, ``weight_sync.weights_sent`` per sync); the patched verl of the set in
force is checked with ``ast`` (vLLM and a GPU are not here), as the Megatron patch is.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from verl_consistency.contracts import weight_labels
from verl_consistency.patches.hooks.rollout import weight_sync as vllm_side
from verl_consistency.patches.hooks.training import micro_batch_dump, older_weights, weight_sync

pytestmark = pytest.mark.pinset


@pytest.fixture(autouse=True)
def _fresh() -> None:
    weight_sync.reset_for_tests()
    vllm_side.reset_for_tests()
    older_weights.reset_for_tests()


def _engine() -> SimpleNamespace:
    import torch

    return SimpleNamespace(
        engine_config=SimpleNamespace(forward_only=False),
        model_config=SimpleNamespace(model_type="language_model"),
        rank=0,
        module=torch.nn.Linear(2, 2),  # a sync's first forward keeps a host copy of it (older_weights)
    )


def _dumper(monkeypatch: pytest.MonkeyPatch, *, forward_only: bool) -> micro_batch_dump.BatchDumper:
    monkeypatch.setenv("DUMP_ON", "1")
    monkeypatch.setenv("DUMP_PHASE", "all")
    monkeypatch.setattr(micro_batch_dump.dump_session, "session", lambda: object())
    got = micro_batch_dump.batch_dumper(_engine(), backend="fsdp", forward_only=forward_only)
    assert isinstance(got, micro_batch_dump.BatchDumper)
    return got


def test_a_forward_carries_the_last_sync_sent_and_the_updates_since(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _dumper(monkeypatch, forward_only=True).version == (None, 0), "before any sync: unknown"
    weight_sync.weights_sent(3)
    assert _dumper(monkeypatch, forward_only=True).version == (3, 0), "log_prob after sync 3"
    # update_actor, two mini-batches: the first runs sync 3's weights, the second one step past them
    assert _dumper(monkeypatch, forward_only=False).version == (3, 0)
    assert _dumper(monkeypatch, forward_only=False).version == (3, 1)
    assert _dumper(monkeypatch, forward_only=True).version == (3, 2)
    weight_sync.weights_sent(4)
    assert _dumper(monkeypatch, forward_only=True).version == (4, 0)


def test_updates_are_counted_even_when_their_phase_is_not_dumped(monkeypatch: pytest.MonkeyPatch) -> None:
    weight_sync.weights_sent(1)
    monkeypatch.setenv("DUMP_ON", "1")
    monkeypatch.setenv("DUMP_PHASE", "log_prob")
    monkeypatch.setattr(micro_batch_dump.dump_session, "session", lambda: object())
    assert (
        micro_batch_dump.batch_dumper(_engine(), backend="fsdp", forward_only=False)
        is micro_batch_dump.NO_DUMP
    )
    got = micro_batch_dump.batch_dumper(_engine(), backend="fsdp", forward_only=True)
    assert isinstance(got, micro_batch_dump.BatchDumper)
    assert got.version == (1, 1)


@pytest.mark.parametrize(("label", "version"), [(7, 7), ("7", 7), (None, None), (True, None), ("x", None)])
def test_the_vllm_worker_keeps_the_label_it_loaded(label: object, version: int | None) -> None:
    vllm_side.weights_loaded(2)
    vllm_side.weights_loaded(label)
    assert vllm_side.loaded_version() == version, "an unlabelled sync forgets the old label"
    assert vllm_side.sync_kwargs(label) == {weight_labels.KWARG: version}
    assert weight_sync.trainer_version() == (None, 0), "the trainer's side is another process's state"


def _function(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return item
    raise AssertionError(f"{cls}.{name} not found")


def _first_line(fn: ast.AST, call: str) -> int:
    lines = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) == call]
    assert lines, f"no call to {call}"
    return min(lines)


def test_the_trainer_labels_its_weights_before_any_backend_sends(root: Path) -> None:
    tree = ast.parse((root / "verl/workers/engine_workers.py").read_text())
    fn = _function(tree, "ActorRolloutRefWorker", "update_weights")
    sent = _first_line(fn, "weight_sync.weights_sent")
    assert sent < _first_line(fn, "self.checkpoint_engine.send_weights"), "separate pools"
    assert sent < _first_line(fn, "self.rollout.update_weights"), "shared GPUs (naive)"
    returns = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Return)]
    assert all(sent < r for r in returns)


def test_the_label_reaches_the_vllm_workers_through_one_keyword(root: Path) -> None:
    rollout = ast.parse((root / "verl/workers/rollout/vllm_rollout/vllm_rollout.py").read_text())
    update = _function(rollout, "ServerAdapter", "update_weights")
    assert "weight_sync.sync_kwargs(global_steps)" in ast.unparse(update)
    worker = ast.parse((root / "verl/workers/rollout/vllm_rollout/utils.py").read_text())
    ipc = _function(worker, "vLLMColocateWorkerExtension", "update_weights_from_ipc")
    assert weight_labels.KWARG in [a.arg for a in ipc.args.args]
    body_calls = [
        ast.unparse(s.value.func)
        for s in ipc.body
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
    ]
    assert body_calls[:1] == ["weight_sync.weights_loaded"], "labelled before any bucket loads"


def _assigned_before(fn: ast.AST, target: str, value_call: str, call: str) -> None:
    """``target = value_call(...)`` comes before every ``call(...)`` that passes ``target``."""
    assigns = [
        n.lineno
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign)
        and ast.unparse(n.targets[0]) == target
        and isinstance(n.value, ast.Call)
        and ast.unparse(n.value.func) == value_call
    ]
    calls = [
        n.lineno
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == call and target in ast.unparse(n.args[:1])
    ]
    assert calls, f"no {call}({target}, ...)"
    for line in calls:
        assert any(a < line for a in assigns), f"{call} at line {line} sends {target} unfingerprinted"


def test_the_weight_check_wraps_what_either_backend_sends(root: Path) -> None:
    """Issue 42: the exported stream is fingerprinted on its way to the checkpoint engine (separate
    pools) and to the colocated rollout (naive), after the engine's HF conversion."""
    tree = ast.parse((root / "verl/workers/engine_workers.py").read_text())
    fn = _function(tree, "ActorRolloutRefWorker", "update_weights")
    _assigned_before(fn, "per_tensor_param", "weight_export.exporting", "self.checkpoint_engine.send_weights")
    _assigned_before(fn, "per_tensor_param", "weight_export.exporting", "self.rollout.update_weights")
    # each print is taken in the dtype vLLM holds: verl's own rollout.dtype, a field of its config
    calls = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "weight_export.exporting"
    ]
    assert [ast.unparse(c.args[2]) for c in calls] == ["self.config.rollout.dtype"] * len(calls)
    config = (root / "verl/workers/config/rollout.py").read_text()
    assert re.search(r"^    dtype: str = ", config, re.M), "verl's RolloutConfig has no dtype field any more"


def test_the_vllm_worker_checks_what_arrived_and_what_it_holds_after_loading(root: Path) -> None:
    worker = ast.parse((root / "verl/workers/rollout/vllm_rollout/utils.py").read_text())
    ipc = _function(worker, "vLLMColocateWorkerExtension", "update_weights_from_ipc")
    receiving = _first_line(ipc, "held_check.receiving")
    assert receiving < _first_line(ipc, "receiver.receive_weights")
    finish = _first_line(ipc, "held_check.finish")
    loads = [
        n.lineno
        for n in ast.walk(ipc)
        if isinstance(n, ast.Call) and "process_weights_after_loading" in ast.unparse(n.func)
    ]
    assert loads, "vLLM's process_weights_after_loading is not called here any more"
    assert all(line < finish for line in loads), "the held check must see the weights as vLLM serves them"
    assert ast.unparse(ipc.body[-1]).startswith("if held_check is not None"), (
        "the check is the last thing it does"
    )
