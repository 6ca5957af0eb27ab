"""msprobe's module hook pair, lean, for the module calls a one-pass lanes step dumps (issue 43).

Why: with the lanes' statistics batched (``lane_stats``) and msprobe's hook sets kept
(``lean_walk``), msprobe's own hook walk was still half of what a dumped FSDP log_prob pass adds on
an H100 (0.52 s of 1.03 s at micro batch 8: ~220 us a module call;
``bench/results/gpu-2026-12-07c/README.md``). Per module call msprobe runs two hooks, each a
``ThreadSafe.synchronized`` wrapper around a closure that asks its hook manager for a hook set and
calls a second closure: ``_should_execute_hook`` twice, ``_maybe_update_dump_dir`` twice, the
garbage collector's state twice, three ``hasattr`` on the module (each a failed ``nn.Module``
``__getattr__`` that formats its error text), three ``logger.debug`` texts, and a new
``BackwardHook`` with two new closures (each through ``functools.wraps``) whose setup does nothing
without gradients.

What: :class:`LeanHooks` takes each module's msprobe pre-hook (and the forward hook that pre-hook
registers) from the module's own hook dicts and, while a one-pass lanes front
(``lane_collector.LaneStats``) is in place, puts in the same slots a pair built once per module
(:func:`_pair`) that does, under its preconditions, what msprobe's pair does, calling msprobe's
own code for everything that makes the dump: ``ModuleProcessor.set_construct_info_in_pre_hook``
and ``set_construct_info_in_hook`` (``construct.json``, the scope), the module call counts, the
collector's ``should_collect``, ``handle_data`` and ``forward_output_data_collect``, the processor's
``update_api_or_module_name`` and ``analyze_forward_input``, the writer's ``update_stack``, the hook
manager's ``_maybe_update_dump_dir``, gc state, ``_no_grad_context``, ``_register_param_hook`` and
``_clear_input_kwargs``, under msprobe's ``ThreadSafe`` lock. What it leaves out answers nothing in
a forward without gradients: the ``BackwardHook`` (its setup hands back the same items, its
``setup_output_hook`` too: ``lean_walk.quick_setup_hooks``), the hook-set lookups and the debug
texts. The call stack is msprobe's (``call_stack.remembering``) taken from torch's frame that
called the hook, the frame msprobe's own skip count reaches.

Preconditions, checked at every call (else msprobe's own hook runs, as it is): the hook manager's
collector is the front this was engaged for; msprobe is running; gradients are off; no tensor
loader; no ``msprobe_module_dump`` on the module; what ``_should_execute_hook`` asks of a module
hook (no dynamic enable mode, the same process, the thread not inside a hook, the processor not
terminated); and the processor's call stack is the remembering one. The forward half runs lean only
for a call whose pre-hook ran lean, under the same checks. So the update_actor pass (gradients on)
and every other front (the fan-out, msprobe's own collector) keep msprobe's hooks: a fan-out
install or ``uninstall`` puts msprobe's own hooks back in their slots (:meth:`LeanHooks.disengage`).
When a lean hook falls back, its own frame is between torch's and msprobe's: ``call_stack``
leaves out the frames of :data:`HIDDEN` code, so ``stack.json`` is msprobe's.

``tests/patches/test_lean_hooks.py`` checks the lanes' files with the pair engaged against msprobe's
own hooks on the same front, the fall-back with gradients on, and the slots put back.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

from verl_consistency.patches.hooks.lanes import call_stack

ATTR = "_verl_consistency_lean_hooks"
"""The :class:`LeanHooks` of an msprobe service (an attribute on the service)."""

PRE_HOOK = "ModuleProcessor.build_module_hook.<locals>.forward_pre_hook"
"""The qualified name of msprobe's module pre-hook (under its ``ThreadSafe.synchronized`` wrapper)."""

CELLS = ("module_name", "self", "forward_hook")
"""What the pair reads from msprobe's pre-hook closure: the module's dump name prefix, the
``ModuleProcessor`` and the forward hook it registers."""


def service_hooks(service: Any) -> LeanHooks:
    """The service's :class:`LeanHooks`, made once."""
    found = getattr(service, ATTR, None)
    if found is None:
        found = LeanHooks(service)
        setattr(service, ATTR, found)
    return found


def disengage(service: Any) -> None:
    """msprobe's own hooks back in their slots on this service's modules (if any were swapped)."""
    found = getattr(service, ATTR, None)
    if found is not None:
        found.disengage()


class LeanHooks:
    """The lean pairs of one msprobe service's hooked modules, swapped in while a front is engaged."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.front: Any = None
        self.pairs: list[_Pair] = []
        self.models: list[Any] = []  # the models adopted (kept: msprobe's service keeps them too)
        self.lean: set[str] = set()  # the forward names whose pre-hook ran lean, until their forward

    def engage(self, front: Any) -> None:
        """Lean pairs in the slots of msprobe's hooks, for calls while ``front`` is the collector.
        Called when msprobe starts a step's files, after it registered its module hooks."""
        self._adopt()
        self.front = front
        self.lean.clear()
        for pair in self.pairs:
            pair.swap_in()

    def disengage(self) -> None:
        self.front = None
        self.lean.clear()
        for pair in self.pairs:
            pair.swap_out()

    def _adopt(self) -> None:
        """A pair for each module of a newly hooked model whose pre-hook is msprobe's."""
        models = list(getattr(self.service, "hooked_modules", None) or [])
        for model in models:
            if any(model is seen for seen in self.models):
                continue
            self.models.append(model)
            for root in model if isinstance(model, (list, tuple)) else [model]:
                for module in getattr(root, "modules", lambda: [])():
                    for key, hook in list(module._forward_pre_hooks.items()):
                        cells = msprobe_pre_hook(hook)
                        if cells is not None:
                            self.pairs.append(_Pair(self, module, key, hook, cells))


def msprobe_pre_hook(hook: Any) -> dict[str, Any] | None:
    """The closure cells (:data:`CELLS`) of msprobe's module pre-hook, or None for another hook."""
    inner = getattr(hook, "__wrapped__", None)
    if getattr(inner, "__qualname__", "") != PRE_HOOK or inner.__closure__ is None:
        return None
    cells = {n: c.cell_contents for n, c in zip(inner.__code__.co_freevars, inner.__closure__, strict=True)}
    if any(name not in cells for name in CELLS):
        return None
    return {name: cells[name] for name in CELLS}


class _Pair:
    """One module's slots: msprobe's pre-hook and forward hook, and the lean pair for them."""

    def __init__(self, owner: LeanHooks, module: Any, key: int, pre: Any, cells: dict[str, Any]) -> None:
        self.module_ref = module
        self.key = key
        self.pre = pre
        self.forward = cells["forward_hook"]
        self.forward_key: int | None = None
        self.lean_pre, self.lean_forward = _pair(owner, self, cells["module_name"], cells["self"])

    def swap_in(self) -> None:
        hooks = self.module_ref._forward_pre_hooks
        if hooks.get(self.key) is self.pre:
            hooks[self.key] = self.lean_pre
        self.find_forward()
        if self.forward_key is not None:
            forwards = self.module_ref._forward_hooks
            if forwards.get(self.forward_key) is self.forward:
                forwards[self.forward_key] = self.lean_forward

    def swap_out(self) -> None:
        hooks = self.module_ref._forward_pre_hooks
        if hooks.get(self.key) is self.lean_pre:
            hooks[self.key] = self.pre
        if self.forward_key is not None:
            forwards = self.module_ref._forward_hooks
            if forwards.get(self.forward_key) is self.lean_forward:
                forwards[self.forward_key] = self.forward

    def find_forward(self) -> None:
        """The slot of msprobe's forward hook, once its pre-hook registered it."""
        if self.forward_key is None:
            for key, hook in self.module_ref._forward_hooks.items():
                if hook is self.forward or hook is self.lean_forward:
                    self.forward_key = key
                    return

    def register_forward(self, module: Any) -> None:
        """msprobe's first-call registration of its forward hook (first, with kwargs), with the lean
        one in its slot."""
        from torch.utils.hooks import RemovableHandle

        forwards = getattr(module, "_forward_hooks", OrderedDict())
        handle = RemovableHandle(forwards)
        forwards[handle.id] = self.lean_forward
        forwards.move_to_end(handle.id, last=False)
        getattr(module, "_forward_hooks_with_kwargs", OrderedDict())[handle.id] = True
        module.msprobe_forward_hook = True
        self.forward_key = handle.id


def has_attr(module: Any, name: str) -> bool:
    """``hasattr(module, name)`` for an ``nn.Module``, answered without its ``__getattr__`` (which
    formats an error text for a missing name) when the name is nowhere it could come from."""
    d = module.__dict__
    if (
        name in d
        or hasattr(type(module), name)
        or name in d.get("_parameters", ())
        or name in d.get("_buffers", ())
        or name in d.get("_modules", ())
    ):
        return hasattr(module, name)
    if type(module).__getattr__ is not _MODULE_GETATTR[0]:
        return hasattr(module, name)
    return False


_MODULE_GETATTR: list[Any] = []


def _pair(owner: LeanHooks, pair: _Pair, module_name: str, processor: Any) -> tuple[Any, Any]:
    """The lean pre-hook and forward hook of one module (``module_name``: msprobe's prefix,
    ``processor``: its ``ModuleProcessor``)."""
    import torch
    from msprobe.core.common.const import Const
    from msprobe.core.common.runtime import Runtime
    from msprobe.core.common.utils import ThreadSafe
    from msprobe.core.dump.data_dump.data_processor.base import BaseDataProcessor, ModuleForwardInputsOutputs
    from msprobe.core.dump.hook_manager import BaseHookManager
    from msprobe.pytorch.dump.module_dump.module_processor import ModuleProcessor

    if not _MODULE_GETATTR:
        _MODULE_GETATTR.append(torch.nn.Module.__getattr__)
    manager = owner.service.hook_manager
    grad_enabled, get_ident, getpid = torch.is_grad_enabled, threading.get_ident, os.getpid
    lock = ThreadSafe._lock
    forward_name = f"{module_name}{Const.FORWARD}{Const.SEP}"
    structure, level_l2, params_key = Const.STRUCTURE, Const.LEVEL_L2, Const.PARAMS
    forward, backward = Const.FORWARD, Const.BACKWARD
    base_update = BaseDataProcessor.update_api_or_module_name
    levels = (Const.LEVEL_MIX, Const.LEVEL_L0)  # a module hook's in msprobe's dynamic enable mode

    rules: list[Any] = [None, None]  # the processor's ignore rules, and this module's from them

    def name_rules(data: Any, name: str) -> None:
        """msprobe's ``update_api_or_module_name(name)``: its ignore rules for a module's call are
        looked up by the name without the call index (``_parse_ignore_key``), so they are this
        module's for every call; looked up once per rules table."""
        if type(data).update_api_or_module_name is not base_update:  # not msprobe's base method: its own
            data.update_api_or_module_name(name)
            return
        if data.current_api_or_module_name == name:
            return
        if rules[0] is not data.ignore_rules:
            rules[0] = data.ignore_rules
            rules[1] = (data._resolve_ignore_rule(name, forward), data._resolve_ignore_rule(name, backward))
        data.current_api_or_module_name = name
        data.current_ignore_rules = {forward: rules[1][0], backward: rules[1][1]}

    def lean(module: Any, tid: int) -> Any:
        """The front's collector when this call may run lean, else None."""
        front = owner.front
        if (
            front is None
            or manager.data_collector is not front
            or not Runtime.is_running
            or grad_enabled()
            or processor.tensor_loader is not None
            or BaseHookManager.inner_switch.get(tid)
            or manager.current_pid != getpid()
            or (
                getattr(manager.config, "dump_enable", None) is not None
                and manager.config.level not in levels
            )
            or has_attr(module, "msprobe_module_dump")
        ):
            return None
        collector = front.collector
        if collector is None or collector.data_processor.is_terminated:
            return None
        if not hasattr(collector.data_processor.analyze_api_call_stack, "from_frame"):
            return None
        return collector

    def forward_pre_hook(module: Any, args: Any, kwargs: Any = None) -> Any:
        tid = get_ident()
        collector = lean(module, tid)
        if collector is None:
            return pair.pre(module, args, kwargs)
        if kwargs is None:
            kwargs = {}
        with lock:
            counts = ModuleProcessor.module_count
            index = counts[module_name] = counts[module_name] + 1 if module_name in counts else 0
            name = forward_name + str(index)
            processor.set_construct_info_in_pre_hook(name)
            if pair.forward_key is None:
                if not has_attr(module, "msprobe_forward_hook"):
                    pair.register_forward(module)
                else:
                    pair.swap_in()
            gc_state = manager.ensure_gc_enabled()
            BaseHookManager.inner_switch[tid] = True
            manager._maybe_update_dump_dir()
            data = collector.data_processor
            name_rules(data, name)
            io = ModuleForwardInputsOutputs(args=args, kwargs=kwargs, output=None)
            with manager._no_grad_context():
                _collect_input(collector, data, name, module, io, structure, level_l2)
            BaseHookManager.inner_switch[tid] = False
            manager.restore_gc_state(gc_state)
            owner.lean.add(name)
        return args, kwargs

    def forward_hook(module: Any, args: Any, kwargs_or_output: Any, output_or_kwargs: Any = None) -> Any:
        name = forward_name + str(ModuleProcessor.module_count.get(module_name))
        tid = get_ident()
        collector = lean(module, tid) if name in owner.lean else None
        owner.lean.discard(name)
        if collector is None:
            return pair.forward(module, args, kwargs_or_output, output_or_kwargs)
        with lock:
            gc_state = manager.ensure_gc_enabled()
            output = output_or_kwargs
            BaseHookManager.inner_switch[tid] = True
            manager._maybe_update_dump_dir()
            io = ModuleForwardInputsOutputs(args=args, kwargs=kwargs_or_output, output=output)
            with manager._no_grad_context():
                params = manager._get_params_dict(module)
                setattr(io, params_key, params)
                if params:
                    manager._register_param_hook(name, module, params)
                name_rules(collector.data_processor, name)
                collector.forward_output_data_collect(name, module, manager.current_pid, io)
                if has_attr(module, "msprobe_input_kwargs"):
                    manager._clear_input_kwargs(module, tid)
            BaseHookManager.inner_switch[tid] = False
            manager.restore_gc_state(gc_state)
            processor.set_construct_info_in_hook(name)
        return output

    call_stack.HIDDEN.add(forward_pre_hook.__code__)
    call_stack.HIDDEN.add(forward_hook.__code__)
    return forward_pre_hook, forward_hook


def _collect_input(
    collector: Any, data: Any, name: str, module: Any, io: Any, structure: str, l2: str
) -> None:
    """msprobe's ``DataCollector.forward_input_data_collect``, the call stack taken from torch's frame
    that called the hook (three frames up: this, the lean pre-hook, torch)."""
    import sys

    pid = os.getpid()
    if not collector.should_collect(name, pid):
        return
    config = collector.config
    info = {} if config.task == structure else data.analyze_forward_input(name, module, io)
    if config.level == l2:
        return
    if collector._collect_extra_info:
        stack = data.analyze_api_call_stack.from_frame(name, sys._getframe(2))
        collector.data_writer.update_stack(name, stack)
    collector.handle_data(name, info, flush=data.is_terminated)
