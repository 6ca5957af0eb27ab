"""One msprobe collector for every lane of a statistics-mode dumped step: one pass per tensor (issue 32).

Why: :class:`msprobe_lanes.LaneFanout` gives each lane (captured request) its own msprobe
``DataCollector``, so every module call walks its inputs, outputs and parameters once per lane and
computes each lane's statistics one reduction at a time. With 8-16 lanes per micro batch that made
a dumped log_prob pass 16-19x the undumped one on an H200. :class:`LaneStats` walks each module
call once, for all lanes: one msprobe ``DataCollector`` (built by msprobe's own factory, its config
uncut) does the walking, the naming, ``construct.json`` and ``stack.json``, exactly as for a whole
step; only its processor's per-tensor step, ``_analyze_tensor``, is replaced, by one that queues
every lane's statistics of that tensor at once on the device (``lane_stats.LaneStatQueue``, no host
sync in the forward). When msprobe writes the step (``write_json``, at ``debugger.stop()``), the
values cross to the host in one copy and each lane's ``dump.json`` is the step's records with that
lane's shapes and values, in msprobe's record layout (``type``, ``dtype``, ``shape``, ``Max``,
``Min``, ``Mean``, ``Norm``, then the rest, as its ``DataWriter._replace_stat_placeholders``
orders them), written by msprobe's own ``DataWriter`` (one per lane: its paths, ``save_json``,
``stack.json``, ``construct.json``) into the same ``req{k}/`` folders. So ``msprobe compare``
reads a lane unchanged.

Why here and not a patch of msprobe's data processor: both pin sets pin mindstudio-probe 26.2.0,
and a runtime object in front of msprobe's unchanged classes needs no patched msprobe in the image,
the venvs or the device; what it relies on is the hook manager's and service's calls (the same as
the fan-out's, ``msprobe_lanes.check_msprobe``) plus the processor's ``_analyze_tensor``,
``tensor_handler`` and ``get_stat_info`` (checked in :meth:`LaneStats.aim`), and
``tests/selective/test_lane_stats.py`` checks every value against the fan-out on the pinned release.

Only ``task: statistics`` with ``summary_mode: statistics`` and no ``tensor_list`` takes this path
(``msprobe_lanes.one_pass``). Tensor mode writes each lane's rows to its own ``.pt`` files and
md5/xor summaries hash each lane's bytes: those keep the fan-out, per lane.

msprobe is imported lazily (in :meth:`LaneStats.aim`), never at import time.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from verl_consistency.contracts.records import lane_folder
from verl_consistency.patches.hooks.lanes.call_stack import remembering
from verl_consistency.patches.hooks.lanes.lane_json import LANE_RECORD, StepTemplate, save_text
from verl_consistency.patches.hooks.lanes.lane_stats import LaneStatQueue
from verl_consistency.patches.hooks.lanes.lane_writer import LaneFiles, LaneWriter, write_files
from verl_consistency.patches.hooks.lanes.msprobe_shortcuts import (
    PlainTensors,
    dtype_kind,
    element_walk,
    quiet_debug,
    single_element,
)

if TYPE_CHECKING:
    from verl_consistency.patches.hooks.lanes.cuts import Lane

PROCESSOR_NEEDS = (
    "_analyze_tensor",
    "tensor_handler",
    "get_stat_info",
    "analyze_single_element",
    "analyze_element",
    "recursive_apply_transform",
    "torch_object_key",
)


def lane_paths(aggregation: Any, k: int) -> Any:
    """msprobe's ``DumpPathAggregation`` for lane ``k``: the same file names in ``<rank dir>/req{k}/``
    (created, with ``dump_tensor_data/`` when the step has one)."""
    from msprobe.core.common.file_utils import check_path_before_create
    from msprobe.core.common.utils import DumpPathAggregation

    lane_dir = os.path.join(os.path.dirname(aggregation.dump_file_path), lane_folder(k))
    check_path_before_create(lane_dir)  # msprobe's path checks (length, characters), once per lane
    os.makedirs(lane_dir, mode=0o750, exist_ok=True)
    lane = DumpPathAggregation()
    for attr in ("dump_file_path", "stack_file_path", "construct_file_path", "debug_file_path"):
        setattr(lane, attr, os.path.join(lane_dir, os.path.basename(getattr(aggregation, attr))))
    lane.dump_error_info_path = os.path.join(lane_dir, os.path.basename(aggregation.dump_error_info_path))
    lane.dump_tensor_data_dir = None
    if aggregation.dump_tensor_data_dir:
        lane.dump_tensor_data_dir = os.path.join(lane_dir, "dump_tensor_data")
        os.makedirs(lane.dump_tensor_data_dir, mode=0o750, exist_ok=True)
    return lane


def uncut_config(config: Any) -> Any:
    """A copy of msprobe's config that cuts nothing (the lanes cut), msprobe's one-request cut off."""
    whole = copy.copy(config)
    whole.slice_info = []
    whole.request_id = None
    whole.is_slice_info_modified = False
    return whole


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _step_folder(lane_files: Sequence[str]) -> str:
    """The rank folder above a step's lane folders (``.../step{N}/rank{R}``), to name it in an error."""
    return os.path.dirname(os.path.dirname(lane_files[0])) if lane_files else "a step"


class LaneStats:
    """Stands where msprobe expects its ``DataCollector``: one real collector walks each module call
    once; each lane's ``dump.json`` is written from it at the step's end.

    Reads and calls it does not define go to that collector (``forward_*_data_collect``,
    ``update_construct``, ``data_processor``, ``scope``, ...). ``dump_file_path`` is lane 0's, as
    the fan-out answers it. The collector and the lanes' writers are kept between steps and
    re-aimed, like the fan-out's collectors.
    """

    def __init__(self, original: Any) -> None:
        self.original = original
        self.collector: Any = None
        self.writers: list[Any] = []
        self.lanes: list[Lane] = []
        self.queue = LaneStatQueue([])
        self._last: tuple[dict[str, Any], StepTemplate] | None = None
        self._plain: PlainTensors | None = None
        self._tensor_type = "torch.Tensor"  # msprobe's Const.TENSOR_TYPE, read in aim()
        self.lean_hooks: Any = None  # lean_hooks.LeanHooks, set by msprobe_lanes.install
        self.writer: LaneWriter | None = None
        """Writes the lanes' files in a helper process (the training side sets it after each
        ``msprobe_lanes.install``, which clears it); None: :meth:`write_json` writes them itself."""

    # -- set-up --------------------------------------------------------------------------------
    def aim(self, config: Any, lanes: Sequence[Lane]) -> None:
        """Use these lanes for the next dumped step."""
        from msprobe.core.dump.data_dump.data_collector import build_data_collector
        from msprobe.core.dump.data_dump.json_writer import DataWriter

        if not lanes:
            raise ValueError("a dumped step needs at least one lane")
        whole = uncut_config(config)
        if self.collector is None:
            self.collector = build_data_collector(whole)
            missing = [n for n in PROCESSOR_NEEDS if not hasattr(self.collector.data_processor, n)]
            if missing:
                raise RuntimeError(
                    "this mindstudio-probe's data processor lacks what one-pass lanes rely on ("
                    + ", ".join(missing)
                    + "); use the pinned release (patches/pins.toml upstream.mindstudio_probe)"
                )
            # the step's template: msprobe fills it, lanes are written from it; it never writes
            # itself, neither mid-forward (no host sync there) nor at exit
            self.collector.data_writer.write_json = _noop
            self.collector.data_writer.flush_data_periodically = _noop
            # msprobe's stack capture, formatted once per call stack (call_stack.py)
            from msprobe.core.common.const import Const
            from msprobe.core.common.log import logger

            processor = self.collector.data_processor
            processor.analyze_api_call_stack = remembering(Const, logger.warning)
            # less Python per tensor and per hook call (msprobe_shortcuts.py): the same answers as msprobe's
            processor.analyze_single_element = single_element(processor, processor.analyze_single_element)
            processor.analyze_element = element_walk(
                processor, processor.recursive_apply_transform, Const.DUMP_MAX_DEPTH
            )
            from msprobe.core.common.const import MsgConst
            from msprobe.pytorch.common.log import logger as pytorch_logger

            for msprobe_logger in (logger, pytorch_logger):
                quiet_debug(msprobe_logger, MsgConst.LogLevel.DEBUG.value)
        self.collector.config = whole
        self.collector.data_processor.config = whole
        self.collector.data_writer.config = whole
        handler = self.collector.data_processor.tensor_handler
        if hasattr(handler, "config"):
            handler.config = whole
        resolve_type_checks(handler)
        self.collector.data_processor._analyze_tensor = self._analyze_tensor
        self._plain = PlainTensors(getattr(whole, "precision", "low") == "high")
        from msprobe.core.common.const import Const as MsprobeConst

        self._tensor_type = MsprobeConst.TENSOR_TYPE
        while len(self.writers) < len(lanes):
            self.writers.append(DataWriter())
        for writer in self.writers:
            writer.config = whole
        self.lanes = list(lanes)
        self.queue = LaneStatQueue([lane.cuts for lane in self.lanes])

    @property
    def active(self) -> list[Any]:
        return self.writers[: len(self.lanes)]

    # -- the per-tensor step ---------------------------------------------------------------------
    def _analyze_tensor(self, tensor: Any, suffix: str) -> dict[str, Any]:
        """msprobe's ``PytorchDataProcessor._analyze_tensor`` for every lane at once: the record's
        fixed fields now, each lane's shape and statistics queued (``LaneStatQueue``). A plain tensor
        takes the short way (``msprobe_shortcuts.PlainTensors``: msprobe's answers, once per dtype)."""
        plain = self._plain.kind(tensor) if self._plain is not None else None
        if plain is not None:
            return {
                "type": self._tensor_type,
                "dtype": plain[0],
                LANE_RECORD: self.queue.add(tensor, full=plain[1]),
                "requires_grad": tensor.requires_grad,
            }
        from msprobe.core.common.utils import slice_by_config

        processor = self.collector.data_processor
        handler = processor.tensor_handler
        config = processor.config
        common = handler.convert_common_tensor(tensor)
        full = _one_pass_kind(common, handler, config)
        if full is None:

            def stat(part: Any) -> list[Any]:
                info = processor.get_stat_info(part, config.async_dump, config.precision)
                return [info.max, info.min, info.mean, info.norm]

            index = self.queue.add_per_lane(common, stat, slice_by_config)
        else:
            index = self.queue.add(common, full=full)
        record: dict[str, Any] = {
            "type": handler.get_tensor_type(tensor),
            "dtype": handler.get_tensor_dtype(tensor),
            LANE_RECORD: index,
            "requires_grad": tensor.requires_grad,
        }
        if handler.is_dtensor(tensor):
            record.update(handler.get_dtensor_info(tensor))
        return record

    # -- what msprobe's service and hook manager call -------------------------------------------
    @property
    def dump_file_path(self) -> Any:
        return self.collector.dump_file_path

    def update_dump_paths(self, aggregation: Any) -> None:
        for k, writer in enumerate(self.active):
            writer.update_dump_paths(lane_paths(aggregation, k))
        self.collector.update_dump_paths(lane_paths(aggregation, 0))

    def replace_proc_with_rank(self, rank_path: str) -> None:
        for k, writer in enumerate(self.active):
            writer.replace_proc_with_rank(os.path.join(rank_path, lane_folder(k)))
        self.collector.replace_proc_with_rank(os.path.join(rank_path, lane_folder(0)))

    def initialize_json_file(self, framework: Any = None) -> None:
        """msprobe's start of a step's files (``DataWriter.initialize_json_file``): the template's
        header, and in each lane's folder a ``dump.json`` with no data and empty ``stack.json`` and
        ``construct.json``, the same text for every lane, written as the step's end writes (by the
        :attr:`writer`'s helper, if any, before it writes the step's end)."""
        config, template = self.collector.config, self.collector.data_writer
        template.reset_cache()
        template.cache_data = {
            "task": config.task,
            "level": config.level,
            "framework": framework if framework is not None else "unknown",  # DataCollector's default
            "dump_data_dir": template.dump_tensor_data_dir,
            "data": {},
        }
        if self.lean_hooks is not None:  # msprobe registered its module hooks by now (start)
            self.lean_hooks.engage(self)
        empty = json.dumps(template.cache_data, indent=1)
        extra = getattr(config, "extra_info", True)
        texts = []
        for writer in self.active:
            texts.append((writer.dump_file_path, empty))
            if extra:
                texts += [(writer.stack_file_path, "{}"), (writer.construct_file_path, "{}")]
        if self.writer is not None:  # written by the helper before the step's own files (in order)
            self.writer.submit(LaneFiles.plain(texts, _step_folder([path for path, _ in texts])))
        else:
            for path, text in texts:
                save_text(path, text)

    def reset_status(self) -> None:
        self.collector.reset_status()
        for writer in self.writers:
            writer.reset_cache()
        self.queue = LaneStatQueue([lane.cuts for lane in self.lanes])

    def write_json(self) -> None:
        """msprobe's write of the step, per lane: the queued statistics in one copy, then each
        lane's ``dump.json`` from the step's template (``lane_json.StepTemplate``: the text msprobe's
        ``save_json`` would write for that lane), and ``stack.json`` and ``construct.json``, the
        same for every lane, encoded once; each into the lane's folder (its msprobe ``DataWriter``'s
        paths), as msprobe's ``DataWriter.write_json`` writes them. Like it, nothing is written
        again when nothing changed since the last write (msprobe writes at ``stop()`` and again at
        ``step()``).

        With a :attr:`writer` (the training side sets one: ``lane_writer.LaneWriter``) the files are
        rendered and written by its helper process, after this returns; its owner drains it before
        anything reads them. Without one they are written here."""
        template = self.collector.data_writer
        if not template.data_updated:
            return
        template.data_updated = False
        entries = self.queue.materialise()
        extra = getattr(self.collector.config, "extra_info", True)
        active = self.active
        files = LaneFiles(
            template=self._template(template.cache_data) if template.cache_data else None,
            shapes=[entry.shapes for entry in entries],
            values=[entry.values or [[None] * 4] * len(self.lanes) for entry in entries],
            shared=[entry.shared for entry in entries],
            dump_paths=[writer.dump_file_path for writer in active],
            stack_paths=[writer.stack_file_path for writer in active],
            construct_paths=[writer.construct_file_path for writer in active],
            stack=template.cache_stack if extra and template.cache_stack else None,
            construct=template.cache_construct if extra and template.cache_construct else None,
            where=_step_folder([writer.dump_file_path for writer in active]),
        )
        if self.writer is not None:
            self.writer.submit(files)
        else:
            write_files(files)

    def _template(self, cache_data: dict[str, Any]) -> StepTemplate:
        """The step's template, the last step's again when this step's records are the same.

        The micro batches of a pass walk the same modules in the same order, so their records
        (queue indices included) differ only in what the queue holds; the template's encoding is
        msprobe's pure-Python JSON encoder over every record, so it is made once per kind of step.
        msprobe gives each step a new ``cache_data`` (``DataWriter.reset_cache``), so the last one
        is kept as it was; equal dicts may differ in key order, which the text follows, so the
        module names' and each module's keys' orders must match too. The very same dict again (a
        second write in one step, after msprobe added records to it) is encoded anew: what was kept
        is no longer what was encoded."""
        last = self._last
        if last is not None:
            kept, step = last
            if kept is not cache_data and kept == cache_data and _same_order(kept, cache_data):
                return step
        step = StepTemplate(cache_data, _record_index)
        self._last = (cache_data, step)
        return step

    @property
    def data_processor(self) -> Any:
        """The collector's processor (msprobe's hook manager asks for it twice a module call)."""
        collector = self.__dict__.get("collector")
        return (collector if collector is not None else self.__dict__["original"]).data_processor

    def __getattr__(self, name: str) -> Any:
        # only reached for names this class does not define (or has not kept yet)
        collector = self.__dict__.get("collector")
        value = getattr(collector if collector is not None else self.__dict__["original"], name)
        if collector is not None and getattr(value, "__self__", None) is collector:
            # a method of the kept collector (update_api_or_module_name, forward_*_data_collect:
            # several a module call): kept on the instance, found without this fallback next time
            self.__dict__[name] = value
        return value


TYPE_CHECKS = {
    "is_dtensor": ("has_dtensor", ("torch.distributed.tensor", "DTensor")),
    "is_fake_tensor": ("has_fake_tensor", ("torch._subclasses.fake_tensor", "FakeTensor")),
    "is_nested_tensor": ("has_nested_tensor", ("torch.nested._internal.nested_tensor", "NestedTensor")),
    "is_async_collective_tensor": (
        "has_async_collective_tensor",
        ("torch.distributed._functional_collectives", "AsyncCollectiveTensor"),
    ),
}
"""msprobe's tensor-kind tests on its ``TensorHandler``: method -> (its flag, the class it tests)."""


def resolve_type_checks(handler: Any) -> None:
    """msprobe's ``is_dtensor``, ``is_fake_tensor``, ``is_nested_tensor`` and
    ``is_async_collective_tensor`` on this collector's handler, with their classes looked up once.

    Why: each is ``self.has_x and isinstance(tensor, torch.distributed.tensor.DTensor)`` (or the
    like), the dotted lookup made on every call, and msprobe asks three of them for every tensor of
    every module call. On the H200 host (torch 2.11) ``is_dtensor`` alone was the largest own time in
    a dumped log_prob pass (17 us a call under cProfile; bench/results/fsdp-onepass-profile2-h200-next.txt).
    The answers are the same: the flag msprobe computed at start, then ``isinstance`` against the
    same class. A method whose flag or class is missing is left as msprobe's."""
    import importlib

    for method, (flag, (module, name)) in TYPE_CHECKS.items():
        if not hasattr(handler, method) or not hasattr(handler, flag):
            continue
        if not getattr(handler, flag):
            setattr(handler, method, _never)
            continue
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        setattr(handler, method, _instance_test(cls))


def _never(_tensor: Any) -> bool:
    return False


def _instance_test(cls: type) -> Any:
    def test(tensor: Any) -> bool:
        return isinstance(tensor, cls)

    return test


def _one_pass_kind(tensor: Any, handler: Any, config: Any) -> bool | None:
    """Whether ``LaneStatQueue.add`` reduces this tensor: True with mean and norm, False with max
    and min only (integers, bool, float64, ``precision: high``, as msprobe's ``get_stat_info``), None
    for what msprobe's own per-lane path handles (0-d, empty, meta/fake, float8/4, complex, NZ)."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.ndim == 0:
        return None
    if (
        handler.is_empty_data(tensor)
        or handler.is_batchedtensor(tensor)
        or handler.is_gradtrackingtensor(tensor)
    ):
        return None
    if tensor.numel() == 0 or not tensor.data_ptr():
        return None
    if tensor.device.type == "npu":
        torch_npu = sys.modules.get("torch_npu")
        if torch_npu is None or not hasattr(torch_npu, "get_npu_format"):
            return None
        if torch_npu.get_npu_format(tensor) == torch_npu.Format.FRACTAL_NZ:
            return None
    return dtype_kind(tensor.dtype, getattr(config, "precision", "low") == "high")


def _same_order(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two equal step records list their modules, and each module its keys, in one order."""
    data_a, data_b = a.get("data", {}), b.get("data", {})
    if list(a) != list(b) or list(data_a) != list(data_b):
        return False
    return all(not isinstance(rec, dict) or list(rec) == list(data_b[name]) for name, rec in data_a.items())


def _record_index(node: dict[str, Any]) -> int | None:
    """The queue index of a tensor record :meth:`LaneStats._analyze_tensor` made, else None."""
    index = node.get(LANE_RECORD)
    return index if isinstance(index, int) else None
