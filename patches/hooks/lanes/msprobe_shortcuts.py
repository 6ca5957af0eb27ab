"""The one-pass lanes' per-tensor host path with less Python per module call (issue 32, what was left).

Why: once every lane's statistics came from one reduction per tensor (``lane_stats``), a dumped
log_prob pass on the H200 was still ~3x its undumped pass, and nearly all of the rest was host
Python run for every tensor of every module call (``bench/results/fsdp-onepass-profile3-h200-next.txt``):
msprobe's ``analyze_single_element`` builds a list of nine (type, analyser) pairs, three lambdas
and the tensor's dotted suffix for each element, then our ``_analyze_tensor`` asked msprobe's
handler the same questions about the tensor several times over (``convert_common_tensor``,
``get_tensor_type``, ``is_empty_data``, ``is_batchedtensor`` twice, ``str(dtype)`` three times),
and msprobe's ``logger.debug`` escapes thirteen characters of every message it then drops.

What: five drop-ins, each answering exactly what msprobe's own code answers, the first four put on
the one-pass collector's own objects by ``lane_collector.LaneStats.aim``, the last on msprobe's hook
manager while lanes are in place (msprobe's code itself stays unpatched):

- :func:`single_element`: msprobe's ``PytorchDataProcessor.analyze_single_element`` that sends a
  tensor straight to the processor's ``_analyze_tensor`` (the one-pass one). msprobe gets there
  too for every tensor whose key is not one of its ``torch_object_key`` names (a tensor is neither
  a builtin nor a ``torch.Size``); the suffix it builds is unused in statistics mode (it names
  tensor files). Everything else goes to msprobe's own method.
- :func:`element_walk`: msprobe's ``analyze_element`` (its ``recursive_apply_transform`` over a
  module's args, kwargs, output and parameters) that walks exact tuples, lists and dicts, plain
  tensors, ``None`` and builtin scalars itself, in msprobe's order and with its key stack, and
  hands every other kind (a namedtuple, a dataclass such as a model output, ``torch.Size``, a
  dtype) to msprobe's own method at that depth. msprobe's asks ~20 ``isinstance`` questions of
  every element after joining three type tuples anew (``get_special_types``).
- :class:`PlainTensors`: for a *plain* tensor (exactly ``torch.Tensor`` or ``nn.Parameter``, not a
  functorch wrapper, on a CPU or CUDA device, not meta, not empty, >= 1 dimension), msprobe's
  answers are fixed by its dtype: the tensor is its own ``convert_common_tensor``, its type is
  ``torch.Tensor``, its dtype text is ``str(dtype)``, it is no DTensor, and whether and how it is
  reduced in one pass (``lane_collector._one_pass_kind``) depends on the dtype and the precision
  only. Those are looked up once per dtype. Any other tensor takes the full path as before.
- :func:`quiet_debug`: msprobe's ``logger.debug`` that checks the level before escaping the
  message (msprobe escapes, then checks); the same lines print at ``MSPROBE_LOG_LEVEL=0``.
- :func:`modes_context`: msprobe's hook manager's ``_no_grad_context`` (torch's
  ``_disable_current_modes``, entered twice a module call: ~4.6 us each on the 2-core VM) that
  answers a shared ``nullcontext`` when no torch dispatch mode is pushed, where popping and
  pushing back none is all torch's would do. Put on the hook manager by ``msprobe_lanes.install``
  while lanes are in place, taken off by ``uninstall``.

``tests/selective/test_lane_stats.py`` (every lane's files equal to msprobe's own per-lane path)
runs through these; ``tests/selective/test_lane_fast.py`` checks each against msprobe's answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Kind = tuple[str, bool]
"""A plain tensor's dtype text (msprobe's ``get_tensor_dtype``) and its one-pass kind: True for
max, min, mean and norm; False for max and min only (``lane_stats.LaneStatQueue.add``)."""


def single_element(processor: Any, original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """msprobe's ``analyze_single_element`` for ``processor``: tensors straight to its
    ``_analyze_tensor``, the rest to ``original`` (msprobe's bound method)."""
    import torch

    tensor_type = torch.Tensor
    keys = processor.torch_object_key

    def analyze_single_element(element: Any, suffix_stack: Any) -> Any:
        if isinstance(element, tensor_type) and not (suffix_stack and suffix_stack[-1] in keys):
            return processor._analyze_tensor(element, "")
        return original(element, suffix_stack)

    return analyze_single_element


def element_walk(processor: Any, recursive: Callable[..., Any], max_depth: int) -> Callable[[Any], Any]:
    """msprobe's ``analyze_element`` for ``processor``: ``recursive`` is its class's
    ``recursive_apply_transform`` (bound), ``max_depth`` its ``Const.DUMP_MAX_DEPTH``."""
    import torch

    tensors = (torch.Tensor, torch.nn.Parameter)
    scalars = (bool, int, float, str)
    sequences = (tuple, list)

    def walk(element: Any, depth: int, keys: list[Any]) -> Any:
        kind = type(element)
        if depth > max_depth:  # msprobe's own check, error and all
            return recursive(element, processor.analyze_single_element, depth, keys)
        if kind in tensors or kind in scalars:
            return processor.analyze_single_element(element, keys)
        if element is None:
            return None
        if kind in sequences:
            found = []
            for i, item in enumerate(element):
                keys.append(i)
                try:
                    found.append(walk(item, depth + 1, keys))
                finally:
                    keys.pop()
            return found
        if kind is dict:
            out = {}
            for key, item in element.items():
                keys.append(key)
                try:
                    out[key] = walk(item, depth + 1, keys)
                finally:
                    keys.pop()
            return out
        return recursive(element, processor.analyze_single_element, depth, keys)

    def analyze_element(element: Any) -> Any:
        return walk(element, 0, [])

    return analyze_element


class PlainTensors:
    """msprobe's per-tensor answers for plain tensors, looked up once per dtype."""

    def __init__(self, precision_high: bool) -> None:
        import torch

        self.exact = (torch.Tensor, torch.nn.Parameter)
        functorch = getattr(torch._C, "_functorch", None)
        self.batched = getattr(functorch, "is_batchedtensor", None)
        self.grad_tracking = getattr(functorch, "is_gradtrackingtensor", None)
        self.precision_high = precision_high
        self.dtypes: dict[Any, Kind | None] = {}

    def kind(self, tensor: Any) -> Kind | None:
        """The tensor's dtype text and one-pass kind, or None: not plain, or not reduced in one pass
        (complex, float8/4 and the like: msprobe's own per-lane path), or a question only the
        full path answers."""
        if type(tensor) not in self.exact or tensor.ndim == 0 or tensor.is_meta:
            return None
        if tensor.device.type not in ("cpu", "cuda"):  # an NPU tensor may be NZ: the full path asks
            return None
        if self.batched is not None and self.batched(tensor):
            return None
        if self.grad_tracking is not None and self.grad_tracking(tensor):
            return None
        if tensor.numel() == 0 or not tensor.data_ptr():
            return None
        dtype = tensor.dtype
        try:
            return self.dtypes[dtype]
        except KeyError:
            found = self.dtypes[dtype] = self._dtype_kind(dtype)
            return found

    def _dtype_kind(self, dtype: Any) -> Kind | None:
        """:func:`dtype_kind` with msprobe's dtype text, once per dtype."""
        full = dtype_kind(dtype, self.precision_high)
        return None if full is None else (str(dtype), full)


def dtype_kind(dtype: Any, precision_high: bool) -> bool | None:
    """How a tensor of this dtype is reduced in one pass: True for max, min, mean and norm; False
    for max and min only (integers and bool; float64 and every float under ``precision: high``, as
    msprobe's ``get_stat_info``); None for msprobe's own per-lane path (complex, float8/4). The dtype
    half of ``lane_collector._one_pass_kind``, which :class:`PlainTensors` asks once per dtype."""
    import torch

    text = str(dtype)
    if dtype.is_complex or "float4" in text or "float8" in text:
        return None
    if not dtype.is_floating_point:
        return False
    return dtype != torch.float64 and not precision_high


def modes_context(original: Callable[[], Any]) -> Callable[[], Any]:
    """msprobe's ``_no_grad_context`` (``original``), a ``nullcontext`` when no dispatch mode is on
    either of torch's mode stacks (the pre-dispatch one and the other)."""
    import contextlib

    import torch

    try:
        from torch._ops import _len_torch_dispatch_stack_pre_dispatch
    except ImportError:  # a torch without the pre-dispatch stack: msprobe's context, as it is
        return original
    stack_len = getattr(torch._C, "_len_torch_dispatch_stack", None)
    if stack_len is None:
        return original
    nothing = contextlib.nullcontext()

    def no_grad_context() -> Any:
        if stack_len() or _len_torch_dispatch_stack_pre_dispatch():
            return original()
        return nothing

    no_grad_context._lane_modes = True  # type: ignore[attr-defined]
    return no_grad_context


def quiet_debug(logger: Any, debug_level: int) -> None:
    """Put on msprobe's ``logger`` a ``debug`` that checks the level first.

    msprobe's is ``filter_special_chars(debug)``: it replaces thirteen characters in the message,
    then prints it only if ``logger.level <= DEBUG``. This one reads the level at every call (so a
    level set later still counts) and calls msprobe's own method when it would print. A logger
    without ``level`` and ``debug`` is left as it is."""
    original = getattr(logger, "debug", None)
    if original is None or not hasattr(logger, "level") or getattr(original, "_lane_quiet", False):
        return

    def debug(msg: Any, *args: Any, **kwargs: Any) -> Any:
        if logger.level <= debug_level:
            return original(msg, *args, **kwargs)
        return None

    debug._lane_quiet = True  # type: ignore[attr-defined]
    logger.debug = debug
