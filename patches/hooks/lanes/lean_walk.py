"""Less of msprobe's own per-module-call work in a dumped forward, same answers (issue 43).

Why: once the lanes' statistics were batched (``lane_stats``), msprobe's own hook walk was the
largest share of what a dumped FSDP log_prob pass adds: 45 % on an H100 at micro batch 8
(``../shared/gpu-runs/2026-12-06-h100/fsdp-cost.txt``). Two parts of it are rebuilt at every module
call for nothing in a log_prob forward:

- :func:`remembered_hook_sets`: msprobe's ``ModuleProcessor`` asks its hook manager for a new
  ``HookSet`` twice a module call (``build_hook(Module, name)``: three closures each, one of them
  wrapped by ``functools.wraps``) and calls one hook of it. Each closure reads nothing but the
  manager (at call time) and the names it was built with, so the set built for a name answers as a
  new one would; the module names of a step repeat at every step (msprobe resets its call counts),
  so they are built once per name and kept on the manager instance.
- :func:`quick_setup_hooks`: msprobe wraps torch's ``BackwardHook.setup_input_hook`` and
  ``setup_output_hook`` (``hook_wrapper.wrap_setup_backward_hook``), called twice a module call by
  its module hooks: the wrapper walks the module's inputs or outputs for tensors that need a
  gradient, hands torch an empty tuple when there are none, and rebuilds every tuple of the inputs
  or outputs from the same items. With gradients off (verl's log_prob pass runs under
  ``torch.no_grad``) no tensor needs one, so the answer is the same items: this returns them as
  they are and sets on the hook what torch's method sets for no tensors (``n_inputs`` or
  ``n_outputs`` 0, the tensors' index ``None``). With gradients on, msprobe's wrapper runs.

Both are put in place by ``msprobe_lanes.install`` (the remembered sets taken off again by
``msprobe_lanes.uninstall``); msprobe's code itself stays unpatched. With the one-pass lanes,
``lean_hooks`` goes further: a lean pair in the slots of msprobe's module hooks, where msprobe's
hooks (and these two shortcuts) then run only for the calls the pair hands back.
``tests/patches/test_lean_walk.py`` checks each against msprobe's own answer, and the lanes'
equality tests run through them.
"""

from __future__ import annotations

from typing import Any

REMEMBERED = "_lean_walk_sets"
"""The marker on a hook manager's remembered ``build_hook`` (and the name of its kept sets)."""

QUICK = "_lean_walk_quick"
"""The marker on torch's ``BackwardHook`` methods once :func:`quick_setup_hooks` wrapped them."""

MOST_SETS = 1 << 16
"""Kept hook sets per manager at most (a step has one per module call; more: start again)."""


def remembered_hook_sets(hook_manager: Any) -> None:
    """msprobe's ``hook_manager.build_hook``, each ``(hook_type, name)``'s set built once and kept
    (an instance attribute over its method). Once per manager; one without the method is left."""
    original = getattr(hook_manager, "build_hook", None)
    if original is None or getattr(original, REMEMBERED, False):
        return
    kept: dict[tuple[Any, str], Any] = {}

    def build_hook(hook_type: Any, name: str) -> Any:
        key = (hook_type, name)
        found = kept.get(key)
        if found is None:
            if len(kept) >= MOST_SETS:
                kept.clear()
            found = kept[key] = original(hook_type, name)
        return found

    setattr(build_hook, REMEMBERED, True)
    hook_manager.build_hook = build_hook


def forget_hook_sets(hook_manager: Any) -> None:
    """msprobe's own ``build_hook`` again on this manager (the instance attribute removed)."""
    if hook_manager is not None and hasattr(hook_manager, "__dict__"):
        found = hook_manager.__dict__.get("build_hook")
        if getattr(found, REMEMBERED, False):
            del hook_manager.__dict__["build_hook"]


def quick_setup_hooks() -> None:
    """torch's ``BackwardHook.setup_input_hook`` and ``setup_output_hook`` (msprobe's wrappers)
    with the answer for no gradients given at once; once per process."""
    import torch
    from torch.utils.hooks import BackwardHook

    grad_enabled = torch.is_grad_enabled
    for method, count, index in (
        ("setup_input_hook", "n_inputs", "input_tensors_index"),
        ("setup_output_hook", "n_outputs", "output_tensors_index"),
    ):
        current = getattr(BackwardHook, method)
        if getattr(current, QUICK, False) or _code_name(current) != MSPROBE_WRAPPER:
            continue  # ours already, or not msprobe's wrapper (whose answer this one gives)
        setattr(BackwardHook, method, _quick(current, grad_enabled, count, index))


MSPROBE_WRAPPER = "wrap_setup_hook_func"
"""The code name of msprobe's wrapper (``functools.wraps`` gives it torch's method's name, not its code)."""


def _code_name(function: Any) -> str:
    return str(getattr(getattr(function, "__code__", None), "co_name", ""))


def _quick(current: Any, grad_enabled: Any, count: str, index: str) -> Any:
    def setup(hook: Any, args: Any, *more: Any, **kwargs: Any) -> Any:
        if more or kwargs or grad_enabled():
            return current(hook, args, *more, **kwargs)
        # what torch's method sets when handed no tensor (msprobe hands it none without gradients)
        setattr(hook, count, 0)
        setattr(hook, index, None)
        return args

    setattr(setup, QUICK, True)
    setup.__wrapped__ = current  # type: ignore[attr-defined]
    return setup
