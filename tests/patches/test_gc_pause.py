"""No automatic collection inside a dumped training step (``patches/hooks/training/gc_pause.py``, issue 43).

The pause must turn the collector off only where it was on and back on only where it turned it
off, keep msprobe's hooks (which turn it on around every hook) from collecting while it holds, and
the training dumper must hold it from ``start`` to the end of ``stop`` (msprobe's write included),
give it back when msprobe fails to start, and after a step whose forward raised.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.patches.test_training_fsdp import _msprobe_config
from verl_consistency.patches.hooks.training import gc_pause
from verl_consistency.patches.hooks.training import micro_batch_dump as training


@pytest.fixture(autouse=True)
def _collector_kept() -> Iterator[None]:
    """Each test starts with the collector on and no pause held, and leaves it so."""
    was = gc.isenabled()
    gc.enable()
    gc_pause.PAUSE.paused = False
    try:
        yield
    finally:
        gc_pause.PAUSE.paused = False
        if was:
            gc.enable()
        else:
            gc.disable()


class _Collections:
    """Counts the collections that run (any generation, asked for or not) while counting."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self.count += 1

    def __enter__(self) -> _Collections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.callbacks.remove(self)


def _churn(n: int = 20_000) -> None:
    """Allocate enough container objects to set off young collections, were the collector on."""
    kept = []
    for i in range(n):
        node: dict[str, Any] = {"i": i}
        node["self"] = node  # a cycle: only the collector frees it
        kept.append([node])
    kept.clear()


def test_pause_and_resume_turn_the_collector_off_and_on_once() -> None:
    gc_pause.pause()
    assert not gc.isenabled()
    gc_pause.pause()  # again: still one pause
    with _Collections() as seen:
        _churn()
    assert seen.count == 0
    gc_pause.resume()
    assert gc.isenabled()
    gc.disable()
    gc_pause.resume()  # nothing held any more: leaves the collector as it is
    assert not gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    gc_pause.pause()
    assert not gc_pause.PAUSE.paused
    gc_pause.resume()
    assert not gc.isenabled()


def test_resume_collects_the_steps_cyclic_garbage() -> None:
    gc_pause.pause()
    node: dict[str, Any] = {}
    node["self"] = node

    class Marker:
        pass

    marker = Marker()
    node["marker"] = marker
    import weakref

    alive = weakref.ref(marker)
    del node, marker
    assert alive() is not None  # in a cycle, the collector off: not freed yet
    gc_pause.resume()
    assert alive() is None


def _msprobe_hook_manager() -> Any:
    """An object with msprobe's own ``ensure_gc_enabled`` and ``restore_gc_state`` (static methods of
    its ``BaseHookManager``), which every one of its hooks calls around its work."""
    from msprobe.core.dump.hook_manager import BaseHookManager

    return SimpleNamespace(
        ensure_gc_enabled=BaseHookManager.ensure_gc_enabled, restore_gc_state=BaseHookManager.restore_gc_state
    )


def _msprobe_hook(manager: Any) -> bool:
    """What msprobe's hooks do with the collector: on for the hook's work, then as it was."""
    state = manager.ensure_gc_enabled()
    try:
        return gc.isenabled()
    finally:
        manager.restore_gc_state(state)


@pytest.mark.msprobe
def test_msprobes_hooks_keep_the_collector_off_while_paused_and_their_own_way_otherwise() -> None:
    manager = _msprobe_hook_manager()
    gc_pause.pause(manager)
    assert not _msprobe_hook(manager)  # held: msprobe's hook does not turn it on
    assert not gc.isenabled()
    gc_pause.resume()
    gc.disable()  # not ours: msprobe's own behaviour again (on for the hook, off after)
    assert _msprobe_hook(manager)
    assert not gc.isenabled()
    first = manager.ensure_gc_enabled
    gc_pause.hold(manager)  # once per manager
    assert manager.ensure_gc_enabled is first


# -- the training dumper ------------------------------------------------------------------------


@pytest.fixture
def dumper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The actor's real ``BatchDumper`` (a real msprobe debugger, a whole-micro-batch dump)."""
    pytest.importorskip("verl")
    monkeypatch.setenv("DUMP_ON", "1")
    monkeypatch.setenv(
        "VERL_CONSISTENCY_ACTOR_CONFIG", str(_msprobe_config(tmp_path / "msprobe.json", tmp_path / "d"))
    )
    monkeypatch.delenv("VERL_CONSISTENCY_RUN_DIR", raising=False)
    monkeypatch.delenv("VERL_CONSISTENCY_CAPTURE", raising=False)
    training.reset_for_tests()
    engine = SimpleNamespace(
        engine_config=SimpleNamespace(forward_only=False), model_config=SimpleNamespace(model_type="x")
    )
    try:
        yield training.batch_dumper(engine, backend="fsdp", forward_only=True), engine
    finally:
        training.reset_for_tests()


def _micro_batch() -> Any:
    from verl.utils import tensordict_utils as tu

    return tu.get_tensordict({"request_id": ["r0", "r1"]})


class _Model:
    """A torch module whose forward allocates cyclic garbage and notes whether the collector is on."""

    def __init__(self) -> None:
        import torch

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.linear = torch.nn.Linear(4, 4)
                self.enabled: list[bool] = []

            def forward(self, x: Any) -> Any:
                self.enabled.append(gc.isenabled())
                _churn()
                return self.linear(x)

        self.net = Net()


@pytest.mark.msprobe
def test_the_dumper_holds_the_collector_off_from_start_to_the_end_of_stop(dumper: Any) -> None:
    import torch

    batch_dumper, _engine = dumper
    model = _Model().net
    micro_batch = _micro_batch()
    with _Collections() as seen:
        batch_dumper.start(micro_batch, model=model)
        assert not gc.isenabled()
        assert not _msprobe_hook(batch_dumper.session.service.hook_manager)  # its hooks keep it off
        with torch.no_grad():
            model(torch.ones(2, 4))
        during = seen.count
        batch_dumper.stop(micro_batch)
    assert model.enabled == [False]  # msprobe's module hooks ran around it, and kept it off
    assert during == 0
    assert seen.count == 1  # the one young collection after the step
    assert gc.isenabled()
    assert list(batch_dumper.session.dump_dir.glob("step*/*/dump.json"))  # msprobe wrote the step


@pytest.mark.msprobe
def test_a_failed_start_and_a_step_that_never_stopped_give_the_collector_back(
    dumper: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_dumper, engine = dumper
    model = _Model().net

    def refuse(**_kwargs: Any) -> None:
        raise RuntimeError("msprobe refused to start")

    with monkeypatch.context() as m:
        m.setattr(batch_dumper.session.debugger, "start", refuse)
        with pytest.raises(RuntimeError, match="refused"):
            batch_dumper.start(_micro_batch(), model=model)
    assert gc.isenabled()
    batch_dumper.start(_micro_batch(), model=model)  # its forward raises: no stop
    assert not gc.isenabled()
    batch_dumper.session.debugger.stop()
    training.batch_dumper(engine, backend="fsdp", forward_only=True)  # the engine's next call
    assert gc.isenabled()
