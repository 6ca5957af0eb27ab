"""``msprobe_shortcuts``'s short ways give msprobe's own answers, on the pinned mindstudio-probe.

The one-pass lanes answer the per-tensor questions of a plain tensor once per dtype
(``PlainTensors``), send tensors straight to the one-pass ``_analyze_tensor`` (``single_element``)
check the log level before escaping a debug message (``quiet_debug``) and skip popping torch's
dispatch modes when none is pushed (``modes_context``). Each is compared here
with what msprobe's own code answers; ``test_lane_stats.py`` compares whole dumps.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from verl_consistency.patches.hooks.lanes.lane_collector import _one_pass_kind, resolve_type_checks
from verl_consistency.patches.hooks.lanes.msprobe_shortcuts import (
    PlainTensors,
    element_walk,
    modes_context,
    quiet_debug,
    single_element,
)

pytestmark = [pytest.mark.msprobe, pytest.mark.pinset]


def _tensors() -> dict[str, Any]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.zeros(2, 3)
    found = {
        "float32": torch.randn(4, 3),
        "bfloat16": torch.randn(2, 5).bfloat16(),
        "float16 view": torch.randn(6, 4).half()[:, 1:3],
        "float64": torch.randn(3, 2, dtype=torch.float64),
        "int64": torch.arange(6).reshape(2, 3),
        "uint8": torch.ones(5, dtype=torch.uint8),
        "bool": torch.ones(3, dtype=torch.bool),
        "0-d": torch.tensor(1.5),
        "empty": torch.zeros(0, 4),
        "meta": torch.zeros(2, 3, device="meta"),
        "complex": torch.zeros(2, 2, dtype=torch.complex64),
        "parameter": torch.nn.Parameter(torch.randn(3, 3)),
        "frozen parameter": torch.nn.Parameter(torch.randn(3), requires_grad=False),
        "nested": torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)], layout=torch.jagged),
        "fake": fake,
    }
    if hasattr(torch, "float8_e4m3fn"):
        found["float8"] = torch.zeros(2, 2).to(torch.float8_e4m3fn)
    seen: dict[str, Any] = {}

    def grab(row: torch.Tensor) -> torch.Tensor:
        seen["batched"] = row  # a functorch BatchedTensor, of Python type torch.Tensor
        return row.sum()

    torch.vmap(grab)(torch.randn(3, 4))
    found["batched"] = seen["batched"]
    return found


@pytest.mark.parametrize("precision", ["low", "high"])
def test_a_plain_tensor_gets_msprobes_answers_and_any_other_takes_the_full_path(precision: str) -> None:
    from msprobe.core.common.const import Const
    from msprobe.core.dump.data_dump.data_processor.pytorch_processor import TensorHandler

    handler = TensorHandler(None)
    resolve_type_checks(handler)
    config = SimpleNamespace(precision=precision)
    plain = PlainTensors(precision == "high")
    answers = {}
    for name, tensor in _tensors().items():
        got = plain.kind(tensor)
        answers[name] = got
        if got is None:
            continue
        assert handler.convert_common_tensor(tensor) is tensor, name
        assert handler.get_tensor_type(tensor) == Const.TENSOR_TYPE, name
        assert handler.get_tensor_dtype(tensor) == got[0], name
        assert not handler.is_dtensor(tensor), name
        assert _one_pass_kind(tensor, handler, config) is got[1], name
    high = precision == "high"
    assert answers["float32"] == ("torch.float32", not high)
    assert answers["bfloat16"] == ("torch.bfloat16", not high)
    assert answers["float16 view"] == ("torch.float16", not high)
    assert answers["parameter"] == ("torch.float32", not high)
    assert answers["frozen parameter"] == ("torch.float32", not high)
    assert answers["float64"] == ("torch.float64", False)
    assert answers["int64"] == ("torch.int64", False)
    assert answers["uint8"] == ("torch.uint8", False)
    assert answers["bool"] == ("torch.bool", False)  # msprobe's any and all, in one pass
    # msprobe's own per-lane path, or a tensor msprobe unwraps or names otherwise: the full path
    for name in ("0-d", "empty", "meta", "complex", "nested", "fake", "batched", "float8"):
        assert answers.get(name) is None, name


def test_single_element_sends_tensors_to_the_one_pass_and_the_rest_to_msprobe() -> None:
    calls: list[tuple[str, Any]] = []
    processor = SimpleNamespace(
        torch_object_key={"dtype": None, "device": None},
        _analyze_tensor=lambda tensor, suffix: calls.append(("one-pass", tensor)) or {"one": "pass"},
    )

    def msprobes(element: Any, suffix_stack: Any) -> Any:
        calls.append(("msprobe", element))
        return {"msprobe": True}

    analyze = single_element(processor, msprobes)
    tensor, parameter = torch.ones(2), torch.nn.Parameter(torch.ones(1))
    assert analyze(tensor, [0, "x"]) == {"one": "pass"}
    assert analyze(parameter, []) == {"one": "pass"}
    assert analyze(tensor, ["dtype"]) == {"msprobe": True}  # msprobe's torch_object_key analysers first
    assert analyze(3, [1]) == {"msprobe": True}
    assert analyze(torch.Size([2, 3]), []) == {"msprobe": True}
    assert [(who, type(what).__name__) for who, what in calls] == [
        ("one-pass", "Tensor"),
        ("one-pass", "Parameter"),
        ("msprobe", "Tensor"),
        ("msprobe", "int"),
        ("msprobe", "Size"),
    ]


def _statistics_processor() -> Any:
    """msprobe's real statistics processor, with a config of the fields it reads."""
    from msprobe.core.dump.data_dump.data_processor.pytorch_processor import StatisticsDataProcessor

    config = SimpleNamespace(
        task="statistics", level="L0", summary_mode="statistics", async_dump=False, precision="low",
        data_mode=["all"], scope=[], list=[], slice_info=[], is_slice_info_modified=False,
    )  # fmt: skip
    try:
        return StatisticsDataProcessor(config, None)
    except Exception as exc:  # a constructor that wants more of the config: say which
        pytest.fail(f"msprobe's StatisticsDataProcessor(config, None): {exc!r}")


def test_single_element_routes_as_msprobes_own_method() -> None:
    """On msprobe's real statistics processor: every element's record is what msprobe's own
    ``analyze_single_element`` makes of it, with the same ``_analyze_tensor`` behind both."""
    processor = _statistics_processor()
    processor._analyze_tensor = lambda tensor, suffix: {"tensor": tuple(tensor.shape)}
    ours = single_element(processor, processor.analyze_single_element)
    elements = [
        (torch.ones(2, 3), [0]),
        (torch.nn.Parameter(torch.ones(4)), ["weight"]),
        (5, [1]),
        (2.5, []),
        ("text", [0]),
        (torch.Size([3, 4]), [2]),
        (torch.float16, ["dtype"]),
        (torch.device("cpu"), ["device"]),
        (None, [0]),
        (object(), [0]),
    ]
    for element, suffix in elements:
        assert ours(element, suffix) == processor.analyze_single_element(element, suffix), element


def test_the_element_walk_gives_msprobes_records_in_msprobes_order() -> None:
    """``element_walk`` on msprobe's real processor: for a module's args, kwargs, outputs and
    parameters of every shape a forward passes (nested tuples, lists and dicts, None, scalars, a
    namedtuple, a dataclass model output, torch.Size, dtype and device kwargs), the records are
    msprobe's own ``analyze_element``'s, and its single-element step sees the same elements with
    the same key stacks in the same order; past msprobe's depth limit it raises as msprobe does."""
    import collections
    import dataclasses

    from msprobe.core.common.const import Const
    from msprobe.core.common.utils import CompareException

    @dataclasses.dataclass
    class Output:  # a model output: a dataclass
        logits: Any
        hidden: Any = None

    Pair = collections.namedtuple("Pair", "first second")
    x, w = torch.randn(2, 3), torch.nn.Parameter(torch.ones(3))
    elements = [
        (x, None, 3, 2.5, True, "text"),
        {"hidden_states": x, "dtype": torch.float16, "device": torch.device("cpu"), "flags": [1, None]},
        [x, (x, [w, {"k": x}]), {}],
        (Pair(x, 4), Output(x, (x,)), torch.Size([2, 3]), slice(1, 2), ...),
        {"weight": w, "bias": None},
        None,
        x,
    ]
    processor = _statistics_processor()
    seen: list[tuple[str, Any, tuple[Any, ...]]] = []

    def records(who: str) -> Any:
        def analyze(tensor: Any, suffix: str) -> dict[str, Any]:
            return {"tensor": tuple(tensor.shape)}

        def single(element: Any, keys: list[Any]) -> Any:
            seen.append((who, type(element).__name__, tuple(keys)))
            return original(element, keys)

        processor._analyze_tensor = analyze
        processor.analyze_single_element = single
        return single

    original = processor.analyze_single_element
    ours = element_walk(processor, processor.recursive_apply_transform, Const.DUMP_MAX_DEPTH)
    for element in elements:
        seen.clear()
        records("msprobe")
        theirs = processor.recursive_apply_transform(element, processor.analyze_single_element)
        records("ours")
        got = ours(element)
        assert got == theirs, element
        assert [s[1:] for s in seen if s[0] == "ours"] == [s[1:] for s in seen if s[0] == "msprobe"]
    nested: Any = x
    for _ in range(Const.DUMP_MAX_DEPTH + 2):
        nested = [nested]
    with pytest.raises(CompareException):
        processor.recursive_apply_transform(nested, processor.analyze_single_element)
    with pytest.raises(CompareException):
        ours(nested)


def test_quiet_debug_prints_what_msprobe_prints_and_checks_the_level_first(capsys: Any) -> None:
    from msprobe.core.common.const import MsgConst
    from msprobe.core.common.log import BaseLogger

    debug_level = MsgConst.LogLevel.DEBUG.value
    theirs, ours = BaseLogger(), BaseLogger()
    quiet_debug(ours, debug_level)
    quiet_debug(ours, debug_level)  # once is enough: not wrapped twice
    assert getattr(ours.debug, "_lane_quiet", False)
    for lg in (theirs, ours):
        lg.level = MsgConst.LogLevel.INFO.value
    ours.debug("dropped\n")
    theirs.debug("dropped\n")
    assert capsys.readouterr().out == ""
    for lg in (theirs, ours):
        lg.level = debug_level  # a level set after the patch still counts
    theirs.debug("a\nb\tc")
    want = capsys.readouterr().out
    ours.debug("a\nb\tc")
    got = capsys.readouterr().out
    assert "a_b_c" in want
    assert got.split("[DEBUG]")[1] == want.split("[DEBUG]")[1]  # past the time stamp
    quiet_debug(SimpleNamespace(), debug_level)  # a logger without debug or level: left alone


def test_the_modes_context_is_msprobes_when_a_dispatch_mode_is_on_and_nothing_otherwise() -> None:
    """msprobe's ``_no_grad_context`` pops every torch dispatch mode for the hook's own tensor work;
    with none pushed, ``modes_context`` answers a no-op context; with one pushed, msprobe's own, under
    which the mode does not see the hook's operations, as under msprobe's."""
    from msprobe.pytorch.dump.api_dump.pt_hook_manager import PytorchHookManager
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    theirs = PytorchHookManager._no_grad_context
    ours = modes_context(theirs)
    assert getattr(ours, "_lane_modes", False)
    with ours() as nothing:
        assert nothing is None
    assert type(ours()).__name__ == "nullcontext"
    x = torch.ones(3)
    for context in (theirs, ours):
        with Seen() as mode:
            with context():
                x.sum()
            x.amax()
        assert mode.ops == ["aten.amax.default"]  # the hook's sum is hidden from the mode


def test_install_puts_the_modes_context_on_msprobes_hook_manager_and_uninstall_takes_it_off() -> None:
    from verl_consistency.patches.hooks.lanes import msprobe_lanes

    class Manager:  # stands for msprobe's PytorchHookManager: the context a static method
        @staticmethod
        def _no_grad_context() -> str:
            return "msprobe's"

    manager = Manager()
    msprobe_lanes._lean_modes(manager)
    msprobe_lanes._lean_modes(manager)  # once: not wrapped twice
    assert getattr(manager._no_grad_context, "_lane_modes", False)
    with manager._no_grad_context() as nothing:
        assert nothing is None
    service = SimpleNamespace(data_collector=None, hook_manager=manager)
    msprobe_lanes.uninstall(service)
    assert "_no_grad_context" not in vars(manager)
    assert manager._no_grad_context() == "msprobe's"


def test_every_lane_renders_what_json_dump_writes_with_entries_named_twice_and_shared() -> None:
    """``StepTemplate.render_lanes`` encodes an entry once per lane (and a shared one once for all
    lanes): each lane's text is still ``json.dumps(lane's data, indent=1)``, for records that name
    one entry twice (an output that is the next module's input), at different depths, and entries
    shared by every lane between ones that are not."""
    import json

    from verl_consistency.patches.hooks.lanes.lane_json import LANE_RECORD, StepTemplate

    def rec(i: int) -> dict[str, Any]:
        return {"type": "torch.Tensor", "dtype": "torch.bfloat16", LANE_RECORD: i, "requires_grad": True}

    data = {
        "task": "statistics",
        "data": {
            "Module.a.forward.0": {
                "input_args": [rec(0)],
                "output": [rec(1)],
                "parameters": {"weight": rec(2)},
            },
            "Module.b.forward.0": {
                "input_args": [rec(1)],
                "input_kwargs": {"x": [rec(3)]},
                "output": [rec(4)],
            },
            "Module.c.forward.0": {"input_args": [[rec(4)]], "output": [rec(2)]},
        },
    }
    lanes = 3
    shared = [False, False, True, True, False]
    weight, bias = [4, 2], [7]
    shapes = [
        [[k + 1, 2] for k in range(lanes)],
        [[k + 1, 2] for k in range(lanes)],
        [weight] * lanes,
        [bias] * lanes,
        [[1, k + 1] for k in range(lanes)],
    ]
    values = [
        [[0.1 * k, -1.5, 1 / 3 + k, float("nan")] for k in range(lanes)],
        [[2.0 + k, float("-inf"), None, None] for k in range(lanes)],
        [[0.25, -0.75, 0.001, 12.5]] * lanes,
        [[3, -4, None, None]] * lanes,
        [[k, k - 1, 1e-40 * (k + 1), float("inf")] for k in range(lanes)],
    ]

    def filled(node: Any, k: int) -> Any:
        if isinstance(node, dict):
            if LANE_RECORD in node:
                i = node[LANE_RECORD]
                head = {"type": node["type"], "dtype": node["dtype"], "shape": shapes[i][k]}
                stats = dict(zip(("Max", "Min", "Mean", "Norm"), values[i][k], strict=True))
                return head | stats | {"requires_grad": node["requires_grad"]}
            return {key: filled(v, k) for key, v in node.items()}
        return [filled(v, k) for v in node] if isinstance(node, list) else node

    template = StepTemplate(data, lambda n: n.get(LANE_RECORD))
    want = [json.dumps(filled(data, k), indent=1) for k in range(lanes)]
    assert list(template.render_lanes(shapes, values, range(lanes), shared)) == want
    assert list(template.render_lanes(shapes, values, range(lanes))) == want  # nothing marked shared
    assert [template.render(shapes, values, k) for k in range(lanes)] == want
    assert len(set(want)) == lanes  # the lanes' texts differ: a mixed-up lane would show
