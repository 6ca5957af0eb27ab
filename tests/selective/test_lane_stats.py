"""One pass for every lane (issue 32) writes what msprobe's own per-lane path writes, on the pinned msprobe.

``lane_stats_scenario.py`` dumps each layout twice in one process with real mindstudio-probe:
through ``LaneFanout`` (one msprobe collector per lane, msprobe's own cut and statistics: the
reference) and through ``LaneStats`` (one collector, every lane's statistics reduced together on
the device). Every lane's ``dump.json`` must be the reference's, key for key and in the same
order, with Max and Min equal and Mean and Norm equal to float32 rounding (the summation order
differs); ``construct.json`` and ``stack.json`` byte for byte. The unit tests below check the
cut rule against msprobe's ``slice_by_config`` and the queue's values against torch directly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.subprocess_run import run_module_json
from verl_consistency.contracts.records import LANE_PREFIX
from verl_consistency.patches.hooks.lanes.lane_json import LANE_RECORD, StepTemplate
from verl_consistency.patches.hooks.lanes.lane_stats import LaneStatQueue, lane_boxes
from verl_consistency.patches.hooks.lanes.msprobe_lanes import Cut, one_pass

pytestmark = [pytest.mark.msprobe, pytest.mark.pinset]

CASES = ("vllm", "vllm-subset", "vllm-bf16", "thd", "padded", "thd-prompt-rows", "padded-prompt-rows")
STATS = ("Max", "Min", "Mean", "Norm")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    out = tmp_path_factory.mktemp("lane-stats")
    result = run_module_json("tests.selective.lane_stats_scenario", str(out), result=out / "result.json")
    return out, {c["case"]: c for c in result["cases"]}


def _lane_file(out: Path, step: int, lane: int, name: str = "dump.json") -> Path:
    (path,) = (out / "dump" / f"step{step}").glob(f"*/{LANE_PREFIX}{lane}/{name}")
    return path


def _elements(record: dict[str, Any]) -> int:
    return math.prod(record["shape"])


def _differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where ``got`` (one pass) is not ``want`` (msprobe's per-lane path); empty when they agree:
    the same keys in the same order, equal non-statistics, Max/Min equal, Mean/Norm to float32
    rounding (relative to the lane's RMS for a mean, whose sign may cancel)."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or list(got) != list(want):
            return [f"{where}: keys {list(got) if isinstance(got, dict) else got} != {list(want)}"]
        if "Mean" in want and "shape" in want:
            return _record_differences(got, want, where)
        return [d for key in want for d in _differences(got[key], want[key], f"{where}.{key}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: {got!r} != {want!r}"]
        pairs = enumerate(zip(got, want, strict=True))
        return [d for i, (g, w) in pairs for d in _differences(g, w, f"{where}[{i}]")]
    return [] if got == want and type(got) is type(want) else [f"{where}: {got!r} != {want!r}"]


def _record_differences(got: dict[str, Any], want: dict[str, Any], where: str) -> list[str]:
    bad = [f"{where}.{k}: {got[k]!r} != {want[k]!r}" for k in want if k not in STATS and got[k] != want[k]]
    for key in STATS:
        g, w = got[key], want[key]
        if w is None or g is None or isinstance(w, (bool, int)):
            if g != w or type(g) is not type(w):
                bad.append(f"{where}.{key}: {g!r} != {w!r}")
            continue
        if key in ("Max", "Min"):
            same = g == w or (math.isnan(g) and math.isnan(w))
        else:
            rms = (want["Norm"] or 0.0) / math.sqrt(max(1, _elements(want)))
            scale = abs(w) if key == "Norm" else max(abs(w), rms)
            same = math.isclose(g, w, rel_tol=1e-5) or abs(g - w) <= 1e-5 * scale
            # bf16/fp16 values are rounded to the tensor's dtype, as torch.mean/torch.norm return
            # them: one unit in the last place of the dtype is the summation order's reach there
            if want.get("dtype") in ("torch.bfloat16", "torch.float16"):
                same = same or math.isclose(g, w, rel_tol=2**-7)
        if not same:
            bad.append(f"{where}.{key}: {g!r} != {w!r}")
    return bad


def test_each_case_ran_both_paths(run: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    _, cases = run
    assert sorted(cases) == sorted([*CASES, "empty", "empty-training"])
    for case in cases.values():
        assert case["fronts"] == ["LaneFanout", "LaneStats"], case


@pytest.mark.parametrize("case", CASES)
def test_every_lane_equals_msprobes_own_per_lane_dump(
    run: tuple[Path, dict[str, dict[str, Any]]], case: str
) -> None:
    out, cases = run
    reference_step, one_pass_step = cases[case]["steps"]
    checked = 0
    for lane in range(len(cases[case]["lanes"])):
        want = json.loads(_lane_file(out, reference_step, lane).read_text())
        text = _lane_file(out, one_pass_step, lane).read_text()
        got = json.loads(text)
        assert _differences(got, want) == []
        assert text == json.dumps(got, indent=1)  # what msprobe's save_json writes for this content
        checked += sum(1 for _ in _records(want))
        for name in ("construct.json", "stack.json"):
            reference = _lane_file(out, reference_step, lane, name).read_text()
            assert _lane_file(out, one_pass_step, lane, name).read_text() == reference, name
        # msprobe's file layout too: with the reference's Mean and Norm put in, the text is the same
        for g, w in zip(_records(got), _records(want), strict=True):
            g["Mean"], g["Norm"] = w["Mean"], w["Norm"]
        assert json.dumps(got, indent=1) == _lane_file(out, reference_step, lane).read_text()
    assert checked > 80 * len(cases[case]["lanes"])  # every module call, every lane


def _records(node: Any) -> Any:
    if isinstance(node, dict):
        if "Mean" in node and "shape" in node:
            yield node
        else:
            for value in node.values():
                yield from _records(value)
    elif isinstance(node, list):
        for value in node:
            yield from _records(value)


def test_a_step_without_module_calls_leaves_msprobes_initial_files(
    run: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    out, cases = run
    reference_step, one_pass_step = cases["empty"]["steps"]
    for lane in range(len(cases["empty"]["lanes"])):
        for name in ("dump.json", "construct.json", "stack.json"):
            want = _lane_file(out, reference_step, lane, name).read_text()
            assert _lane_file(out, one_pass_step, lane, name).read_text() == want, name
        assert json.loads(_lane_file(out, one_pass_step, lane).read_text())["data"] == {}


TRAINING_CASES = ("thd", "padded", "thd-prompt-rows", "padded-prompt-rows", "empty-training")


@pytest.mark.parametrize("case", TRAINING_CASES)
def test_the_helper_process_writes_each_lane_byte_for_byte_as_in_line(
    run: tuple[Path, dict[str, dict[str, Any]]], case: str
) -> None:
    """The training side hands a step's lane files to a helper process (``lane_writer``, issue 43):
    once drained, every lane's three files are the in-line one pass's, byte for byte."""
    out, cases = run
    _, one_pass_step = cases[case]["steps"]
    helper_step = cases[case]["helper_step"]
    assert helper_step is not None
    assert helper_step != one_pass_step
    for lane in range(len(cases[case]["lanes"])):
        for name in ("dump.json", "construct.json", "stack.json"):
            want = _lane_file(out, one_pass_step, lane, name).read_bytes()
            assert _lane_file(out, helper_step, lane, name).read_bytes() == want, (case, lane, name)


@pytest.mark.parametrize("case", ["thd-prompt-rows", "padded-prompt-rows"])
def test_a_prompt_row_lane_holds_its_prompt_rows_only(
    run: tuple[Path, dict[str, dict[str, Any]]], case: str
) -> None:
    """Ride-along: the forward covers prompt + response; each lane is the prompt's rows alone."""
    from tests.selective.scenario import LENGTHS

    out, cases = run
    for step in cases[case]["steps"]:
        for lane, rid in enumerate(cases[case]["lanes"]):
            data = json.loads(_lane_file(out, step, lane).read_text())["data"]
            key = next(k for k in data if ".embed_tokens." in k and ".forward." in k)
            assert data[key]["output"][0]["shape"][:2] == [1, LENGTHS[rid]], (case, rid)


def test_the_comparison_tells_lanes_apart(run: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    """The control: another lane's dump differs, in shapes or statistics."""
    out, cases = run
    reference_step, one_pass_step = cases["thd"]["steps"]
    want = json.loads(_lane_file(out, reference_step, 0).read_text())
    got = json.loads(_lane_file(out, one_pass_step, 1).read_text())
    assert _differences(got, want) != []


def test_only_statistics_take_the_one_pass_path() -> None:
    stats = {"task": "statistics", "summary_mode": "statistics", "tensor_list": []}
    assert one_pass(SimpleNamespace(**stats))
    assert not one_pass(SimpleNamespace(**(stats | {"task": "tensor"})))
    assert not one_pass(SimpleNamespace(**(stats | {"summary_mode": "md5"})))
    assert not one_pass(SimpleNamespace(**(stats | {"tensor_list": ["mlp"]})))


# -- the cut rule and the queue's values, without a debugger ------------------------------------


@st.composite
def _cut_case(draw: Any) -> tuple[list[int], list[list[Cut]]]:
    shape = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    cut = st.builds(
        lambda d, size, b, n: Cut(d, size, b, b + n),
        st.integers(0, 4),
        st.integers(1, 6),
        st.integers(0, 6),
        st.integers(0, 4),
    )
    return shape, draw(st.lists(st.lists(cut, max_size=3), min_size=1, max_size=4))


@settings(max_examples=200, deadline=None)
@given(_cut_case())
def test_lane_boxes_is_msprobes_slice_by_config(case: tuple[list[int], list[list[Cut]]]) -> None:
    from msprobe.core.common.utils import slice_by_config

    shape, lanes = case
    tensor = torch.arange(math.prod(shape)).reshape(shape)
    dims, boxes = lane_boxes(shape, lanes)
    for cuts, box in zip(lanes, boxes, strict=True):
        want = slice_by_config(tensor, [c.as_msprobe() for c in cuts])
        got = tensor
        for d, (start, stop) in zip(dims, box, strict=True):
            got = got.narrow(d, start, stop - start)
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.bool])
def test_queue_values_are_each_lanes_statistics(dtype: torch.dtype) -> None:
    from msprobe.core.common.utils import slice_by_config

    gen = torch.Generator().manual_seed(0)
    tensor = (torch.randn((3, 10, 6), generator=gen) * 5).to(dtype)
    if dtype == torch.bool:  # the first lane all False (any and all False), the others mixed
        tensor = torch.randn((3, 10, 6), generator=gen) > 0
        tensor[1, 0:7] = False
    else:
        tensor[1, 2, 3] = float("inf") if dtype.is_floating_point else 99
    lanes = [
        [Cut(0, 3, 1, 2), Cut(1, 10, 0, 7)],  # padded: a row, its first positions
        [Cut(1, 10, 4, 10)],  # packed: positions on dim 1
        [Cut(1, 10, 3, 3)],  # selects nothing: msprobe writes no statistics
        [Cut(2, 99, 0, 1)],  # matches no dimension: the whole tensor
    ]
    queue = LaneStatQueue(lanes)
    full = dtype in (torch.float32, torch.bfloat16)
    queue.add(tensor, full=full)
    (entry,) = queue.materialise()
    for cuts, shape, values in zip(lanes, entry.shapes, entry.values or [], strict=True):
        part = slice_by_config(tensor, [c.as_msprobe() for c in cuts])
        assert shape == list(part.shape)
        if part.numel() == 0:
            assert values == [None] * 4
            continue
        assert values[:2] == [part.max().item(), part.min().item()]
        assert [type(v) for v in values[:2]] == [type(part.max().item())] * 2  # bools as bools
        if not full:
            assert values[2:] == [None, None]
            continue
        for got, want in zip(values[2:], [part.mean().item(), part.norm().item()], strict=True):
            assert math.isclose(got, want, rel_tol=1e-5 if dtype == torch.float32 else 2**-7) or got == want


def test_the_step_template_renders_what_json_dump_with_indent_1_writes() -> None:
    """Records at several depths, as list items and dict values, with extra keys (a DTensor's),
    an empty shape, and every kind of value msprobe writes: the text is json.dumps(indent=1)'s."""

    def rec(i: int, **extra: Any) -> dict[str, Any]:
        fixed = {"type": "torch.Tensor", "dtype": "torch.float32", LANE_RECORD: i, "requires_grad": False}
        return fixed | extra

    data = {
        "task": "statistics",
        "data": {
            "Module.a.forward.0": {
                "input_args": [rec(0), {"type": "str", "value": "50%s %d"}, [rec(1)]],
                "input_kwargs": {"x": rec(2, device_mesh=[[0, 1]], placements=[{"Shard": {"dim": 0}}])},
                "output": [],
            },
            "Module.b.forward.0": {"output": [rec(3)], "parameters": {"weight": rec(1)}},
        },
    }
    shapes = [[[2, 3]], [[]], [[1, 0, 4]], [[5]]]
    values = [
        [[1.5, -2.0, 1e-30, float("nan")]],
        [[True, False, None, None]],
        [[None, None, None, None]],
        [[7, -3, float("inf"), float("-inf")]],
    ]
    text = StepTemplate(data, lambda n: n.get(LANE_RECORD)).render(shapes, values, 0)

    def filled(node: Any) -> Any:
        if isinstance(node, dict):
            if LANE_RECORD in node:
                i = node[LANE_RECORD]
                head = {"type": node["type"], "dtype": node["dtype"], "shape": shapes[i][0]}
                rest = {k: v for k, v in node.items() if k not in (LANE_RECORD, "type", "dtype")}
                return head | dict(zip(("Max", "Min", "Mean", "Norm"), values[i][0], strict=True)) | rest
            return {k: filled(v) for k, v in node.items()}
        return [filled(v) for v in node] if isinstance(node, list) else node

    assert text == json.dumps(filled(data), indent=1)


def test_a_tensor_met_again_unchanged_is_reduced_once() -> None:
    """A module's output is the next one's input: queued once while it is the same, unchanged
    object; an in-place change or an inference-mode tensor (no version counter) is reduced anew."""
    queue = LaneStatQueue([[Cut(0, 4, 0, 2)], [Cut(0, 4, 2, 4)]])
    x = torch.arange(8.0).reshape(4, 2)
    first = queue.add(x, full=True)
    assert queue.add(x, full=True) == first
    assert queue.add(x.clone(), full=True) != first  # the same values, another tensor
    x.add_(100)
    changed = queue.add(x, full=True)
    assert changed != first
    with torch.inference_mode():
        y = torch.arange(8.0).reshape(4, 2)
    assert queue.add(y, full=True) != queue.add(y, full=True)
    entries = queue.materialise()
    # the norms are float32 (as torch.norm returns them), here within an ulp of the exact ones
    want = [[3.0, 0.0, 1.5, math.sqrt(14.0)], [7.0, 4.0, 5.5, math.sqrt(126.0)]]
    assert entries[first].values == [pytest.approx(lane, rel=1e-6) for lane in want]
    assert entries[changed].values is not None
    assert entries[changed].values[0][:2] == [103.0, 100.0]


def _stack_both(name: str) -> tuple[Any, Any]:
    """msprobe's ``analyze_api_call_stack`` and ``call_stack.remembering``'s, each called at the same
    depth (one frame below this function's callers), as msprobe's collector calls it."""
    from msprobe.core.common.const import Const
    from msprobe.core.common.log import logger
    from msprobe.core.dump.data_dump.data_processor.base import BaseDataProcessor

    from verl_consistency.patches.hooks.lanes.call_stack import remembering

    ours = remembering(Const, logger.warning)

    def collect(capture: Any) -> Any:  # stands where DataCollector.call_stack_collect stands
        return capture(name)

    def call_site(capture: Any) -> Any:
        return collect(capture)

    return call_site(BaseDataProcessor.analyze_api_call_stack), call_site(ours)


@pytest.mark.parametrize("name", ["Module.model.layers.0.mlp.Qwen2MLP.forward.0", "Primitive.add.0"])
def test_the_remembered_call_stack_is_msprobes(name: str) -> None:
    theirs, ours = _stack_both(name)
    assert ours == theirs
    assert len(theirs) > 3
    assert all(line.startswith("File ") for line in theirs)
    assert not any("msprobe/core" in line for line in ours)


def test_the_call_stack_is_remembered_per_stack_not_per_name() -> None:
    """The second capture from the same call site (a loop's) is the first's object (formatted
    once); one from another line of the caller is a different stack, formatted anew and naming that
    line; two call sites on one line are two keys with the same text."""
    from msprobe.core.common.const import Const
    from msprobe.core.common.log import logger

    from verl_consistency.patches.hooks.lanes.call_stack import remembering

    capture = remembering(Const, logger.warning)

    def site(depth: int = 4) -> Any:  # msprobe skips 5 frames: the capture and four callers
        return site(depth - 1) if depth > 1 else capture("Module.a.forward.0")

    def layer(again: bool) -> list[Any]:  # the first frame that the stack shows
        return [site() for _ in range(2)] if again else [site()]

    first, second = layer(True)
    assert first is second
    (other,) = layer(False)
    assert other != first
    assert [line for line in other if line not in first]  # the caller's other line

    def one_line() -> list[Any]:
        return [site(), site()]

    left, right = one_line()
    assert left == right


def test_a_step_like_the_last_reuses_its_template_and_a_reordered_one_does_not() -> None:
    """``LaneStats._template``: the same records give the last step's template (encoded once); the
    same records with two modules' keys in another order give a new one, whose text follows it."""
    from verl_consistency.patches.hooks.lanes.lane_collector import LaneStats

    def record(i: int) -> dict[str, Any]:
        return {"type": "torch.Tensor", "dtype": "torch.float32", LANE_RECORD: i, "requires_grad": False}

    def step(order: tuple[str, str]) -> dict[str, Any]:
        module = {order[0]: [record(0)], order[1]: [record(1)]}
        return {"task": "statistics", "level": "L0", "data": {"Module.a.forward.0": module}}

    stats = LaneStats(original=None)
    first = stats._template(step(("input_args", "output")))
    assert stats._template(step(("input_args", "output"))) is first
    swapped = stats._template(step(("output", "input_args")))
    assert swapped is not first
    text = swapped.render([[[2]], [[3]]], [[[1.0, 0.0, 0.5, 1.0]], [[2.0, 0.0, 1.0, 2.0]]], 0)
    assert list(json.loads(text)["data"]["Module.a.forward.0"]) == ["output", "input_args"]


def test_the_same_step_dict_written_again_after_more_records_is_encoded_anew() -> None:
    """msprobe fills one ``cache_data`` in place through a step and may write it twice (``stop()``,
    then ``step()``, with a ``start()`` between): the template kept from the first write must not
    stand for the dict once it holds more records."""
    from verl_consistency.patches.hooks.lanes.lane_collector import LaneStats

    record = {"type": "torch.Tensor", "dtype": "torch.float32", LANE_RECORD: 0, "requires_grad": False}
    modules = {"Module.a.forward.0": {"output": [record]}}
    data: dict[str, Any] = {"task": "statistics", "level": "L0", "data": modules}
    stats = LaneStats(original=None)
    first = stats._template(data)
    data["data"]["Module.b.forward.0"] = {"output": [dict(record, **{LANE_RECORD: 1})]}
    again = stats._template(data)
    assert again is not first
    text = again.render([[[2]], [[3]]], [[[1.0, 0.0, 0.5, 1.0]], [[2.0, 0.0, 1.0, 2.0]]], 0)
    assert list(json.loads(text)["data"]) == ["Module.a.forward.0", "Module.b.forward.0"]


def test_the_resolved_type_checks_answer_as_msprobes() -> None:
    """``lane_collector.resolve_type_checks``: msprobe's four tensor-kind tests, classes looked up
    once, give msprobe's answers for a plain, a nested (jagged) and a fake tensor."""
    from msprobe.core.dump.data_dump.data_processor.pytorch_processor import TensorHandler
    from torch._subclasses.fake_tensor import FakeTensorMode

    from verl_consistency.patches.hooks.lanes.lane_collector import TYPE_CHECKS, resolve_type_checks

    theirs, ours = TensorHandler(None), TensorHandler(None)
    resolve_type_checks(ours)
    assert all(method in vars(ours) for method in TYPE_CHECKS)  # each replaced on the instance
    with FakeTensorMode():
        fake = torch.zeros(2, 3)
    nested = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)], layout=torch.jagged)
    for tensor in (torch.zeros(2, 3), nested, fake):
        for method in TYPE_CHECKS:
            assert getattr(ours, method)(tensor) == getattr(theirs, method)(tensor), (method, type(tensor))
    assert ours.is_nested_tensor(nested)
    assert ours.is_fake_tensor(fake)
    assert not ours.is_dtensor(torch.zeros(1))


def test_a_tensor_no_lane_cuts_is_counted_once_for_every_lane() -> None:
    """``add_per_lane``: a 0-d tensor (no cut applies) gets msprobe's statistics once, every lane
    the same values; a tensor the cuts do apply to gets them per lane."""
    from msprobe.core.common.utils import slice_by_config

    queue = LaneStatQueue([[Cut(0, 4, 0, 2)], [Cut(0, 4, 2, 4)]])
    calls: list[tuple[int, ...]] = []

    def stat(part: Any) -> list[Any]:
        calls.append(tuple(part.shape))
        return [part.max(), part.min(), part.float().mean(), part.float().norm()]

    scalar = queue.add_per_lane(torch.tensor(True), stat, slice_by_config)
    assert calls == [()]
    cut = queue.add_per_lane(torch.tensor([True, False, False, False]), stat, slice_by_config)
    assert calls == [(), (2,), (2,)]
    entries = queue.materialise()
    assert entries[scalar].shapes == [[], []]
    assert entries[scalar].values == [[True, True, 1.0, 1.0]] * 2
    assert [v[0] for v in entries[cut].values or []] == [True, False]


def test_blocks_of_many_tensors_and_a_second_write_keep_every_entrys_values() -> None:
    """Past ``BLOCK`` tensors a group's row statistics are stacked as they come; the entries keep
    their order and values across blocks and groups, and a second ``materialise`` in the step (a
    second write after more records) keeps the first's values and adds the new ones."""
    from verl_consistency.patches.hooks.lanes.lane_stats import BLOCK

    queue = LaneStatQueue([[Cut(0, 4, 0, 1)], [Cut(0, 4, 1, 4)]])
    gen = torch.Generator().manual_seed(1)
    tensors = [torch.randn((4, 3 + i % 2), generator=gen) for i in range(2 * BLOCK + 5)]
    ints = [torch.arange(4 * i, 4 * i + 8).reshape(4, 2) for i in range(3)]
    indices = [queue.add(t, full=True) for t in tensors] + [queue.add(t, full=False) for t in ints]
    first = queue.materialise()
    later = torch.full((4, 2), 7.0)
    again = queue.add(later, full=True)
    second = queue.materialise()
    assert len(first) == len(tensors) + len(ints)
    assert len(second) == len(first) + 1
    for index, tensor in zip(indices, tensors + ints, strict=True):
        for entries in (first, second):
            for (lane_max, lane_min, *_), rows in zip(
                entries[index].values or [], (tensor[:1], tensor[1:]), strict=True
            ):
                assert (lane_max, lane_min) == (rows.max().item(), rows.min().item())
    assert second[again].values == [
        [7.0, 7.0, 7.0, pytest.approx(math.sqrt(2 * 49))],
        [7.0, 7.0, 7.0, pytest.approx(math.sqrt(6 * 49))],
    ]


def test_msprobes_per_lane_values_are_read_as_item_reads_them_in_one_copy_per_kind(monkeypatch: Any) -> None:
    """``_read_pending``: 0-d tensors of every dtype (msprobe's statistics), a one-element tensor
    of more dimensions, numbers and None come back as ``.item()`` gives them (value and type),
    a tensor several lanes share read once, one ``torch.stack`` per device and dtype."""
    from verl_consistency.patches.hooks.lanes import lane_stats

    shared = torch.tensor(2.5, dtype=torch.bfloat16)
    pending = {
        0: [[torch.tensor(True), torch.tensor(False), None, None]] * 2,
        3: [
            [torch.tensor(7), torch.tensor(-2), None, None],
            [torch.tensor(1.25), torch.tensor(-0.5), torch.tensor(0.375), torch.tensor([[3.0]])],
        ],
        5: [[shared, shared, shared, shared], [shared, 1.5, 2, None]],
    }
    want = {
        i: [[v.item() if hasattr(v, "item") else v for v in lane] for lane in lanes]
        for i, lanes in pending.items()
    }
    stacks: list[int] = []
    real_stack = torch.stack

    def counting_stack(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        stacks.append(len(tensors))
        return real_stack(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, "stack", counting_stack)
    got = lane_stats._read_pending(pending)
    monkeypatch.undo()
    assert got == want
    assert [[[type(v) for v in lane] for lane in lanes] for lanes in got.values()] == [
        [[type(v) for v in lane] for lane in lanes] for lanes in want.values()
    ]
    # bool, int64, float32 (4 tensors: the [[3.0]] one too) and bfloat16 (one shared tensor, once)
    assert sorted(stacks) == [1, 2, 2, 4]
    assert got[0][0] is not got[0][1]  # each lane's own list, though msprobe's lanes shared one
