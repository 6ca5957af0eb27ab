"""Request-scoped msprobe dumps: dump one request's rows out of a batched (packed) vLLM step.

Why: the recipe can only pair prefill steps that hold exactly one request, and dumps every
step (decode included) to find them. mindstudio-probe 26.2.0 can cut one request's token rows
out of a packed step, so any prefill step that *contains* a captured request becomes pairable,
and every other step can be left undumped.

How msprobe 26.2.0 does it (read from its source, checked on CPU by ``tests/selective``):

- The task section of the config (``"statistics"``/``"tensor"``) may hold ``"request_id"``. Only
  task ``statistics`` or ``tensor`` at level ``L0``, ``L1`` or ``mix`` keep it; any other
  combination silently drops it (``DebuggerConfig.check``), which :func:`start_step` refuses.
- ``PrecisionDebugger.start(model, scheduled_tokens={req_id: n, ...})`` then, per step:
  if ``request_id`` is not a key, the step is not dumped at all (no ``step{N}`` folder, one
  WARNING line); otherwise it sets ``slice = {dim: 0, size: sum(n), begin, end}`` where
  ``begin``/``end`` are the request's offsets **in the dict's iteration order**.
- Every dumped tensor (module inputs, outputs *and parameters*, statistics and ``.pt`` files)
  whose ``shape[0] == sum(n)`` is cut to rows ``[begin:end]``; any other tensor is dumped whole.
  vLLM's activations are ``[num_tokens, ...]`` so they are cut. ``LogitsProcessor`` sees
  ``[num_reqs, ...]`` and is dumped whole (every request's last-token logits) unless, by
  coincidence, ``num_reqs == num_tokens`` (decode steps: then the cut is the request's own row).
  A parameter whose first dimension happens to equal the step's token count is cut too.
- The dumped ``shape`` in ``dump.json`` is the cut shape, so a scoped vLLM dump and a
  training forward of that request alone have matching shapes.

Why a sentinel instead of the real id: ``PrecisionDebugger`` is a per-process singleton whose
``service.config`` is a deep copy of ``debugger.config``, and msprobe 26.x hot-reloads the
config file (when it carries ``dump_enable``), replacing both. Writing a per-step id into a
live config would race with that reload. Instead the config carries one constant id,
:data:`CAPTURED_SENTINEL`, and each step renames the captured request's key to it in the
``scheduled_tokens`` that msprobe sees. The config never changes; only the argument does.

Packing order: vllm-ascend packs tokens in ``self.input_batch.req_ids`` order (the persistent
batch, possibly reordered decode-first), **not** in the scheduler's ``num_scheduled_tokens``
dict order. Pass ``packing_order=self.input_batch.req_ids[:num_reqs]``; without it the slice can
land on another request's rows.

Step numbering: a step that is not dumped calls neither ``start`` nor ``stop``/``step`` (the
patched runner guards every stop site with ``DispatchLogger.finish()``), so msprobe's
``current_iter`` moves only on dumped steps and ``step{N}`` is the N-th *dumped* step. The
dispatch log writes a record for every step: a dumped one carries that N in ``step``; a skipped
one has ``dumped: false``, the N the next dumped step will take, and ``runner_step`` (every
model-runner step). Pair on dumped records only.

What the dispatch hook (``hooks/rollout/dispatch.py``) does at vllm-ascend's ``debugger.start`` site
(``execute_model``): every captured request of the step gets a lane of its own::

    order = self.input_batch.req_ids[: self.input_batch.num_reqs]
    targets = dump_targets(requests_in_packing_order, phase, rule)      # [] : not this step
    lanes = msprobe_lanes.packed_lanes(num_scheduled_tokens, order, targets, request_rows=True)
    dumped = start_lanes(self.debugger, self.model, lanes)
    # write the DispatchRecord with dumped=dumped, lane_request_ids=targets

:func:`should_dump` and :func:`start_step` are msprobe's own one-request cut (one pair per
step at most), kept for ``bench/bench_selective.py`` and as the baseline the lanes are
measured against.

This module must not import torch_npu or vllm at import time; it imports msprobe lazily.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from verl_consistency.contracts.capture import CaptureRule
from verl_consistency.contracts.msprobe_scope import (  # here too: the hooks' callers use these names
    BLOCK_TENSOR_LIST,
    CAPTURED_SENTINEL,
    LAYER_TENSOR_LIST,
    SCOPED_LEVELS,
    SCOPED_TASKS,
    TENSOR_DATA_MODE,
    scoped_msprobe_config,
)
from verl_consistency.contracts.records import ScheduledRequest, base_request_id
from verl_consistency.patches.hooks.lanes import msprobe_lanes

__all__ = [
    "BLOCK_TENSOR_LIST",
    "CAPTURED_SENTINEL",
    "LAYER_TENSOR_LIST",
    "SCOPED_LEVELS",
    "SCOPED_TASKS",
    "TENSOR_DATA_MODE",
    "scoped_msprobe_config",
]


def ensure_request_scope(debugger: Any) -> None:
    """Make a live ``PrecisionDebugger`` scope by :data:`CAPTURED_SENTINEL`; idempotent.

    Sets ``request_id`` on both ``debugger.config`` and ``debugger.service.config`` (msprobe
    reads the latter; a hot reload rebuilds both from the file, which is why the file should
    carry the sentinel too: see :func:`scoped_msprobe_config`). Raises ``ValueError`` when the
    task/level cannot be scoped, because msprobe would then dump whole batched steps.
    """
    for cfg in (debugger.config, debugger.service.config):
        task, level = getattr(cfg, "task", None), getattr(cfg, "level", None)
        if task not in SCOPED_TASKS or level not in SCOPED_LEVELS:
            raise ValueError(
                f"msprobe task={task!r} level={level!r} cannot dump one request's rows; request-scoped "
                f"dumps need task in {SCOPED_TASKS} and level in {SCOPED_LEVELS} (fix the msprobe config)"
            )
        if getattr(cfg, "request_id", None) != CAPTURED_SENTINEL:
            cfg.request_id = CAPTURED_SENTINEL


def scoped_tokens(
    scheduled_tokens: Mapping[str, int],
    capture_request_id: str,
    packing_order: Sequence[str] | None = None,
) -> dict[str, int]:
    """The ``scheduled_tokens`` msprobe must see: packing order, captured id renamed to the sentinel.

    Raises ``ValueError`` when the captured request is not scheduled, when ``packing_order`` and
    ``scheduled_tokens`` disagree, or when a count is not a positive int (msprobe would then
    silently dump the whole step).
    """
    order = list(scheduled_tokens) if packing_order is None else list(packing_order)
    if set(order) != set(scheduled_tokens) or len(order) != len(scheduled_tokens):
        raise ValueError(
            f"packing_order ({len(order)} ids) and scheduled_tokens ({len(scheduled_tokens)} ids) name "
            "different requests; pass input_batch.req_ids[:num_reqs] and "
            "scheduler_output.num_scheduled_tokens"
        )
    if capture_request_id not in scheduled_tokens:
        raise ValueError(f"captured request {capture_request_id!r} is not scheduled in this step")
    if CAPTURED_SENTINEL in scheduled_tokens:
        raise ValueError(f"a scheduled request is literally named {CAPTURED_SENTINEL!r}")
    out: dict[str, int] = {}
    for rid in order:
        n = scheduled_tokens[rid]
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"scheduled_tokens[{rid!r}] = {n!r}: expected a positive int")
        out[CAPTURED_SENTINEL if rid == capture_request_id else rid] = int(n)
    return out


def install_compact_tensor_save() -> None:
    """Make msprobe save a request's rows, not the whole batch's storage; idempotent.

    msprobe 26.2.0 cuts rows with a view (``tensor[begin:end]``) and ``torch.save`` writes a
    view's *whole* storage, so every ``.pt`` of a request-scoped tensor dump would hold all the
    step's rows on disk (``torch.load`` shows only the cut). This wraps the ``save_pt`` that
    msprobe's PyTorch data processor calls so that such a view is cloned first: the copy costs
    the captured rows only. Imports msprobe (and torch) when called, never at module import.
    """
    from msprobe.core.dump.data_dump.data_processor import pytorch_processor

    original = pytorch_processor.save_pt
    if getattr(original, "_verl_consistency_compact", False):
        return

    def save_pt(tensor: Any, filepath: str) -> None:
        nbytes = getattr(tensor, "nbytes", None)
        if nbytes is not None and tensor.untyped_storage().nbytes() > nbytes:
            tensor = tensor.clone()
        original(tensor, filepath)

    save_pt._verl_consistency_compact = True  # type: ignore[attr-defined]
    pytorch_processor.save_pt = save_pt


def start_step(
    debugger: Any,
    model: Any,
    *,
    capture_request_id: str | None,
    scheduled_tokens: Mapping[str, int],
    packing_order: Sequence[str] | None = None,
) -> bool:
    """Start msprobe for this step, scoped to one request; returns whether the step is dumped.

    ``capture_request_id=None``: msprobe is *not* started (nothing is dumped, no warning, no
    hook work); the caller still runs its usual ``stop()``/``step()``, which keeps ``step{N}``
    aligned with the model-runner step count. Otherwise ``debugger.start(model=model,
    scheduled_tokens=...)`` runs with the captured request renamed to the sentinel, and only
    rows ``[begin:end]`` of that request are dumped (see the module docstring for what is cut).
    ``model`` may be None for level L1 (API hooks only), as vllm-ascend does. Also installs
    :func:`install_compact_tensor_save`, so tensor files hold the captured rows only.
    """
    if capture_request_id is None:
        return False
    tokens = scoped_tokens(scheduled_tokens, capture_request_id, packing_order)
    _reload_config_now(debugger)
    ensure_request_scope(debugger)
    install_compact_tensor_save()
    msprobe_lanes.uninstall(debugger.service)
    _start(debugger, model, scheduled_tokens=tokens)
    return True


def _reload_config_now(debugger: Any) -> None:
    """msprobe's ``start()`` first re-reads a changed config file (at most every 0.5 s); a reload
    rebuilds the service's collector (dropping lanes) and its config (dropping a ``request_id``
    that only :func:`ensure_request_scope` set). Run that check now, so the one inside ``start()``
    finds nothing new."""
    reload_now = getattr(debugger, "_maybe_reload_config", None)
    if callable(reload_now):
        reload_now(force=True)


def _start(debugger: Any, model: Any, **kwargs: Any) -> None:
    """``debugger.start``; ``model`` None for level L1 (API hooks only), as vllm-ascend does."""
    if model is None:
        debugger.start(**kwargs)
    else:
        debugger.start(model=model, **kwargs)


def start_lanes(debugger: Any, model: Any, lanes: Sequence[msprobe_lanes.Lane]) -> bool:
    """Start msprobe for this step with one dump per lane (captured request); returns whether it dumps.

    No lanes: msprobe is not started (as :func:`start_step` with no captured request). Otherwise
    :func:`msprobe_lanes.install` aims msprobe at the lanes and ``debugger.start`` runs *without*
    ``scheduled_tokens``: each lane cuts its own rows (``msprobe_lanes`` says how), so msprobe's
    one-request cut stays off. The config may still carry :data:`CAPTURED_SENTINEL` (a run's
    config does, for the one-request path); it is ignored here.
    """
    if not lanes:
        return False
    _reload_config_now(debugger)
    install_compact_tensor_save()
    msprobe_lanes.install(debugger.service, lanes)
    _start(debugger, model)
    return True


def is_comparable_prefill(request: ScheduledRequest) -> bool:
    """Whether this step computes the request's *whole* prompt from scratch, in one piece.

    Only then do its rows equal a training forward over the prompt: a cached request in a
    prefill step is decoding, a prefix-cache hit (``num_computed_tokens > 0``) computes only the
    uncached suffix, and a chunk (``tokens < prompt_tokens``) only part of the prompt.
    """
    if request.type != "new":
        return False
    if request.num_computed_tokens:
        return False
    return request.prompt_tokens is None or request.tokens == request.prompt_tokens


def dump_targets(
    requests: Sequence[ScheduledRequest],
    phase: Literal["prefill", "decode"] | str,
    rule: CaptureRule,
) -> list[str]:
    """Selective mode with lanes: every request of this step to dump, in the order given.

    Each request that :func:`is_comparable_prefill` accepts and ``rule.captures`` (by
    ``base_request_id``) gets a lane of its own (:func:`start_lanes`); a decode step gets none.
    Pass the packing order, so that lane ``k`` is the k-th captured request as packed.
    """
    if phase == "decode":
        return []
    return [
        req.request_id
        for req in requests
        if is_comparable_prefill(req) and rule.captures(base_request_id(req.request_id))
    ]


def should_dump(
    requests: Sequence[ScheduledRequest],
    phase: Literal["prefill", "decode"] | str,
    rule: CaptureRule,
) -> str | None:
    """Selective mode: the vLLM request id to dump in this step, or None to skip the step.

    - ``phase == "decode"``: always None; decode rows are never compared.
    - Otherwise the first request, in the order given (pass the packing order), that
      :func:`is_comparable_prefill` accepts and whose id (``base_request_id``: vLLM's
      ``-[0-9a-f]{8}`` suffix and n>1 child prefix stripped) ``rule.captures``.
    - msprobe scopes to one request per step, so further captured requests in the same step
      are not dumped; their prompt is never prefilled again, so they stay unpaired.

    ``rule`` 'all' makes every request eligible (every prefill step then dumps one request);
    the recipe's dump-every-step behaviour is a different mode that does not call this.
    """
    targets = dump_targets(requests, phase, rule)
    return targets[0] if targets else None
