"""msprobe's per-module-call work cut in a dumped forward (``patches/hooks/lanes/lean_walk.py``, issue 43).

A kept hook set must answer as the one msprobe would build anew (its hooks read the manager's
state when they run, not when they were built), and the quick ``BackwardHook`` setup must give,
with gradients off, what msprobe's wrapper of torch's method gives (the same items, the same
fields on the hook), and leave the work to msprobe's wrapper with gradients on.
"""

from __future__ import annotations

import inspect
from collections import namedtuple
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.hooks import BackwardHook

from verl_consistency.patches.hooks.lanes import lean_walk

pytestmark = pytest.mark.msprobe

Pair = namedtuple("Pair", ["a", "b"])


class _Collector:
    """What msprobe's module pre-hook asks of its data collector, recorded."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.data_processor = SimpleNamespace(is_terminated=False)
        self.dump_file_path = None

    def update_api_or_module_name(self, name: str) -> None:
        self.names.append(name)

    def forward_input_data_collect(self, name: str, *_args: Any) -> None:
        self.names.append(f"input {name}")


def _manager() -> Any:
    from msprobe.core.common.runtime import Runtime
    from msprobe.pytorch.dump.api_dump.pt_hook_manager import PytorchHookManager

    config = SimpleNamespace(task="statistics", level="L0", data_mode=["all"])
    manager = PytorchHookManager(_Collector(), config)
    Runtime.is_running = True
    return manager


@pytest.fixture
def running() -> Iterator[None]:
    from msprobe.core.common.runtime import Runtime

    was = Runtime.is_running
    try:
        yield
    finally:
        Runtime.is_running = was


def test_a_kept_hook_set_is_built_once_per_name_and_reads_the_manager_when_it_runs(running: None) -> None:
    from msprobe.core.common.const import Const

    manager = _manager()
    lean_walk.remembered_hook_sets(manager)
    first = manager.build_hook(Const.MODULE, "Module.a.A.forward.0")
    assert manager.build_hook(Const.MODULE, "Module.a.A.forward.0") is first
    other = manager.build_hook(Const.MODULE, "Module.b.B.forward.0")
    assert other is not first
    assert other.forward_hook is not first.forward_hook
    # a later collector (msprobe swaps its collector on a config reload, the lanes put a front in
    # its place): the kept set's hook talks to it, as a set built now would
    later = _Collector()
    manager.data_collector = later
    first.module_forward_pre_hook(torch.nn.Identity(), (torch.ones(2),), {})
    assert later.names == ["Module.a.A.forward.0", "input Module.a.A.forward.0"]
    lean_walk.forget_hook_sets(manager)
    assert "build_hook" not in manager.__dict__
    assert manager.build_hook(Const.MODULE, "Module.a.A.forward.0") is not first  # msprobe's own again


def test_the_hook_sets_are_remembered_once_per_manager() -> None:
    manager = _manager()
    lean_walk.remembered_hook_sets(manager)
    kept = manager.build_hook
    lean_walk.remembered_hook_sets(manager)
    assert manager.build_hook is kept


def _arguments() -> tuple[Any, ...]:
    t = torch.ones(2, 3)
    return (t, [t * 2, None], {"k": t + 1, "n": 3}, Pair(t, (t, "x")), 1.5)


@pytest.fixture
def msprobes_setup(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """torch's ``BackwardHook`` methods wrapped by msprobe's ``wrap_setup_backward_hook`` (as its
    ``ModuleProcessor`` does), then by :func:`lean_walk.quick_setup_hooks`; put back after."""
    from msprobe.pytorch.dump.module_dump.hook_wrapper import wrap_setup_backward_hook

    found = {}
    for method in ("setup_input_hook", "setup_output_hook"):
        torchs = inspect.unwrap(getattr(BackwardHook, method))
        found[method] = wrap_setup_backward_hook(torchs)
        monkeypatch.setattr(BackwardHook, method, found[method])
    lean_walk.quick_setup_hooks()
    return found


def _hook() -> BackwardHook:
    return BackwardHook(torch.nn.Identity(), [], [])


@pytest.mark.parametrize("method", ["setup_input_hook", "setup_output_hook"])
def test_without_gradients_the_quick_setup_gives_msprobes_answer(msprobes_setup: dict, method: str) -> None:
    assert getattr(getattr(BackwardHook, method), lean_walk.QUICK)
    args = _arguments()
    ours, theirs = _hook(), _hook()
    with torch.no_grad():
        got = getattr(ours, method)(args)
        expected = msprobes_setup[method](theirs, args)
    assert got == expected or _same_items(got, expected)
    fields = ("n_inputs", "input_tensors_index", "n_outputs", "output_tensors_index")
    assert {f: getattr(ours, f, "unset") for f in fields} == {f: getattr(theirs, f, "unset") for f in fields}
    single = torch.ones(3)
    with torch.no_grad():
        assert _hook().setup_output_hook(single) is single


def _same_items(a: Any, b: Any) -> bool:
    """Equal structure, the very same tensors and scalars at each place."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same_items, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_items(a[k], b[k]) for k in a)
    return bool(a == b)


def test_with_gradients_msprobes_wrapper_does_the_work(msprobes_setup: dict) -> None:
    x = torch.ones(2, 3, requires_grad=True)
    y = x * 2
    with torch.enable_grad():
        (hooked,) = _hook().setup_input_hook((y,))
    assert hooked is not y
    assert hooked.grad_fn is not None
    assert hooked.grad_fn.name() == "BackwardHookFunctionBackward"


def test_only_msprobes_wrapper_is_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    for method in ("setup_input_hook", "setup_output_hook"):
        monkeypatch.setattr(BackwardHook, method, inspect.unwrap(getattr(BackwardHook, method)))
    lean_walk.quick_setup_hooks()
    assert not getattr(BackwardHook.setup_input_hook, lean_walk.QUICK, False)  # torch's own: left
