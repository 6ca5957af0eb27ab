"""The vLLM-side dispatch log: which requests each msprobe step of a vLLM worker saw.

vllm-ascend 0.18.0's ``NPUModelRunner`` calls into this module at two places (see
``patches/current/vllm-ascend/``):

* where it builds the ``PrecisionDebugger`` (``__init__``): :func:`rollout_dump_path` gives the
  per-process dump folder, passed as the constructor's ``dump_path=``. msprobe 26.x re-creates its
  config from the JSON file on a hot reload, keeping only the constructor's overrides, so the
  recipe's ``debugger.service.config.dump_path = ...`` is silently undone by the first reload;
* where upstream calls ``debugger.start`` (``execute_model``): :meth:`DispatchLogger.start` decides
  whether this step is dumped, starts msprobe, and writes one :class:`DispatchRecord` whose
  ``step`` is msprobe's own ``current_iter``, read after ``start()`` has set it. At each of the
  runner's stop sites (two early returns of ``execute_model`` and the main path in
  ``sample_tokens()``), :meth:`DispatchLogger.finish` says whether a stop+step is owed.

vLLM 0.18.0's own ``GPUModelRunner`` (NVIDIA; vLLM's ``CPUModelRunner`` subclasses it) calls
the same two places (``patches/current/vllm/``), plus :func:`setup_rollout_debugger` in ``__init__``
because vLLM has no debugger of its own, and passes ``attn_state=None`` because it has no
attention state: :func:`derived_attn_state` gives vllm-ascend's name from the scheduler output.

The next pin set (``patches/next/``) calls the same hook. vLLM 0.23.0's runner kept the 0.18.0
shape. vllm-ascend 0.23.0.post1 has its own ``_start_dump_data``/``_finalize_dump_data`` guarded
by ``self._debugger_started``, so its patch stores :meth:`DispatchLogger.start`'s answer in that
flag and lets upstream's ``_finalize_dump_data`` be the stop site (``finish()`` is not called
there; it would answer the same). The scheduler-output fields read here are the same in vLLM
0.18.0 and 0.23.0 (0.23.0 only adds ``NewRequestData.prompt_is_token_ids``;
``tests/patches/test_dispatch_vllm.py`` checks them against the set's wheel).

The recipe's own logger counts steps itself and writes before ``stop`` in ``execute_model``; on
the main path ``execute_model`` returns before that point, so its log missed most steps.

Selective mode (``$VERL_CONSISTENCY_CAPTURE=fraction:F``): a step is dumped only when it is a
prefill step holding a captured request whose whole prompt is computed in this step (no prefix
cache hit, no chunking), because only such a step can be compared with the training forward.
Every other step gets a record with ``dumped=false`` and no msprobe start/stop/step at all, so
msprobe's step counter advances only on dumped steps and ``step{N}`` always matches a record.
The dump is scoped to that one request's token rows with msprobe's ``scheduled_tokens``, in
the runner's packing order (``verl_consistency.patches.hooks.rollout.request_scope`` owns the msprobe side).

This module must import without torch_npu, vllm or vllm_ascend: the scheduler output and
``attn_state`` are taken as plain objects (duck-typed, ``attn_state.name``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from verl_consistency.contracts import capture, layout, records
from verl_consistency.contracts.env import CAPTURE, RUN_DIR
from verl_consistency.contracts.process_local import dist_rank
from verl_consistency.patches.hooks.lanes import msprobe_lanes
from verl_consistency.patches.hooks.rollout import request_scope, weight_sync

DECODE_STATE = "DecodeOnly"
"""The only ``AscendAttentionState`` member that is a decode step (upstream's ``!= DecodeOnly``)."""

DUMP_MODEL_LEVELS = ("L0", "MIX")
"""Levels at which upstream passes the model to ``start()`` (module hooks need it)."""


class _NewRequest(Protocol):
    req_id: str
    prompt_token_ids: list[int] | None
    num_computed_tokens: int


class _CachedRequests(Protocol):
    req_ids: list[str]


class SchedulerOutputLike(Protocol):
    """The fields of vLLM's ``vllm.v1.core.sched.output.SchedulerOutput`` this hook reads."""

    scheduled_new_reqs: Sequence[_NewRequest]
    scheduled_cached_reqs: _CachedRequests
    num_scheduled_tokens: Mapping[str, int]
    total_num_scheduled_tokens: int


class ConfigError(ValueError):
    """The inference-side msprobe config cannot give a dump folder."""


def rollout_dump_path(
    config_path: str | os.PathLike[str],
    *,
    pid: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """This worker's msprobe dump folder: ``<run>/rollout/<pid>``, else ``<config dump_path>/<pid>``.

    msprobe numbers steps per process from 0, so each vLLM worker process needs its own folder,
    or a restarted worker (or a second replica on the node) overwrites another's ``step0``.
    Under ``verl-consistency run`` the run folder comes from ``$VERL_CONSISTENCY_RUN_DIR``;
    without it (a user's own launch, as in the recipe) the config's ``dump_path`` is the root.
    """
    env = os.environ if environ is None else environ
    run_dir = env.get(RUN_DIR)
    if run_dir:
        try:  # the run folder's layout, as the training side's dump session reads it
            side = layout.RunLayout.from_run_dir(run_dir).rollout_dir
        except ValueError as exc:  # a folder name that is no run id: the postprocess would refuse it too
            raise ConfigError(f"${RUN_DIR}={run_dir}: {exc}") from None
        return layout.process_dump_dir(side, pid)
    path = Path(config_path)
    root = _read_config(path).get("dump_path")
    if not isinstance(root, str) or not root:
        raise ConfigError(f'{path}: no "dump_path" string; set it, or set ${RUN_DIR} to the run folder')
    return layout.process_dump_dir(root, pid)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the msprobe config ({exc}); fix dump_config_path") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the msprobe config must be a JSON object")
    return data


def attn_state_name(attn_state: object) -> str | None:
    """``AscendAttentionState.X`` → ``"X"`` without importing vllm_ascend (which loads torch_npu)."""
    if attn_state is None:
        return None
    name = getattr(attn_state, "name", None)
    return name if isinstance(name, str) else str(attn_state)


def derived_attn_state(so: SchedulerOutputLike) -> str:
    """The ``AscendAttentionState`` name vllm-ascend would give this step, from the scheduler output.

    vLLM's own ``GPUModelRunner`` (and the ``CPUModelRunner`` that subclasses it) has no
    attention state; its attention backends read per-request lengths instead. So that the
    dispatch log of a vLLM rollout reads like a vllm-ascend one, the patched vLLM runner leaves
    ``attn_state`` to this function, which applies vllm-ascend 0.18.0's ``_build_attn_state``
    rule (without speculative decoding, which the pinned runners here do not use) to the same
    numbers: every scheduled request with nothing computed before → ``PrefillNoCache``; every
    request advancing by one token → ``DecodeOnly``; anything else → ``ChunkedPrefill``
    (vLLM V1 always schedules with chunked prefill, which is vllm-ascend's branch for it).
    """
    computed = [r.num_computed_tokens for r in so.scheduled_new_reqs]
    computed += list(getattr(so.scheduled_cached_reqs, "num_computed_tokens", []))
    if all(c == 0 for c in computed):
        return "PrefillNoCache"
    if all(n == 1 for n in so.num_scheduled_tokens.values()):
        return DECODE_STATE
    return "ChunkedPrefill"


def scheduled_requests(so: SchedulerOutputLike) -> list[records.ScheduledRequest]:
    """The recipe's ``requests[]``: new requests first, then cached ones, in scheduler order."""
    out = []
    for req in so.scheduled_new_reqs:
        prompt = req.prompt_token_ids
        out.append(
            records.ScheduledRequest(
                request_id=req.req_id,
                type="new",
                tokens=so.num_scheduled_tokens.get(req.req_id, 0),
                prompt_tokens=len(prompt) if prompt is not None else None,
                num_computed_tokens=req.num_computed_tokens,
            )
        )
    # vLLM's draft tokens per request; a decode then advances by 1 + their number, which the
    # pairing must not mistake for the later chunk of a split prefill (postprocess/pairing/pair.py).
    spec: Mapping[str, Sequence[int]] = getattr(so, "scheduled_spec_decode_tokens", None) or {}
    for req_id in so.scheduled_cached_reqs.req_ids:
        drafts = spec.get(req_id)
        out.append(
            records.ScheduledRequest(
                request_id=req_id,
                type="cached",
                tokens=so.num_scheduled_tokens.get(req_id, 0),
                spec_tokens=len(drafts) if drafts else None,
            )
        )
    return out


def phase_of(state_name: str | None, reqs: Sequence[records.ScheduledRequest]) -> str:
    """Upstream's rule (``attn_state != DecodeOnly`` → prefill, so SpecDecoding counts as prefill).

    Without an attention state (never seen at the start site, but cheap to cover), a step where
    every request advances by one token is a decode step.
    """
    if state_name is not None:
        return "decode" if state_name == DECODE_STATE else "prefill"
    return "decode" if reqs and all(r.tokens == 1 and r.type == "cached" for r in reqs) else "prefill"


def in_batch_order(
    reqs: Sequence[records.ScheduledRequest], batch_order: Sequence[str] | None
) -> list[records.ScheduledRequest]:
    """The step's requests in the order the runner packs their tokens (``input_batch.req_ids``).

    msprobe finds a request's rows by summing the counts of the requests packed before it, and
    the runner reorders requests (decodes first) and fills freed slots, so the scheduler's order
    is not the packing order. Requests missing from ``batch_order`` keep their place at the end.
    """
    if batch_order is None:
        return list(reqs)
    rank = {rid: i for i, rid in enumerate(batch_order)}
    return sorted(reqs, key=lambda r: rank.get(r.request_id, len(rank)))


def _dumped_now(service: Any) -> bool:
    """Did msprobe open ``step{current_iter}`` in this ``start()``?

    msprobe can decline a step on its own (``step``/``rank`` filters in the config, the service
    stopped after the last configured step, the request missing from ``scheduled_tokens``). Only
    when it creates the step folder does it set ``dump_iter_dir`` to that step's path.
    """
    if getattr(service, "should_stop_service", False):
        return False
    expected = os.path.join(service.config.dump_path, f"step{service.current_iter}")
    return getattr(service, "dump_iter_dir", None) == expected


def setup_rollout_debugger(
    additional_config: Mapping[str, Any] | None, enforce_eager: bool
) -> tuple[Any, DispatchLogger | None]:
    """vLLM ``GPUModelRunner.__init__``: msprobe and the dispatch log, as vllm-ascend sets them up.

    vllm-ascend 0.18.0's ``NPUModelRunner`` builds a ``PrecisionDebugger`` when
    ``additional_config["dump_config_path"]`` is set, and refuses non-eager mode (msprobe's module
    hooks do not see a compiled graph). vLLM's own runner has no debugger at all, so the patch for
    it calls this: the same key, the same refusal, the same per-process ``dump_path=`` override.
    Returns ``(None, None)`` when no dump is configured, and then imports nothing.
    """
    dump_cfg = (additional_config or {}).get("dump_config_path")
    if dump_cfg is None:
        return None, None
    if not enforce_eager:
        raise RuntimeError("Dumping/debugging only works in eager mode.")
    from msprobe.pytorch import PrecisionDebugger

    logger = DispatchLogger.for_rollout(dump_cfg)
    return PrecisionDebugger(str(dump_cfg), dump_path=str(logger.dump_path)), logger


class DispatchLogger:
    """One per vLLM worker process: decides, starts and logs each msprobe step.

    Use (the patched runner): ``start(...)`` at upstream's start site; at every stop site,
    ``if logger.finish(): debugger.stop(); debugger.step()``. ``finish()`` answers True once per
    started step, so a start is paired with exactly one stop+step whichever path returns. A runner
    with its own started flag (vllm-ascend 0.23's ``_debugger_started``, cleared by its
    ``_finalize_dump_data``) may store ``start()``'s answer there instead of calling ``finish()``.
    """

    def __init__(
        self,
        dump_path: str | os.PathLike[str],
        *,
        rule: capture.CaptureRule | None = None,
        run_dir: str | None = None,
        pid: int | None = None,
    ) -> None:
        self.dump_path = Path(dump_path)
        self.rule = rule if rule is not None else capture.from_env()
        self.run_dir = run_dir
        self.pid = os.getpid() if pid is None else pid
        self._writer = records.JsonlWriter(self.dump_path / records.DISPATCH_LOG)
        self._started = False
        self.runner_step = 0
        """Every start-site visit of this process, dumped or not."""

    @classmethod
    def for_rollout(
        cls, config_path: str | os.PathLike[str], environ: Mapping[str, str] | None = None
    ) -> DispatchLogger:
        """Build from the vLLM ``dump_config_path`` and the run's environment."""
        env = os.environ if environ is None else environ
        rule = capture.parse(env.get(CAPTURE, "all"))
        if not rule.is_all:
            # refuse at start-up, not at the first captured step hours into the run
            try:
                request_scope.scoped_msprobe_config(_read_config(Path(config_path)))
            except ValueError as exc:
                raise ConfigError(f"{config_path}: {exc}") from None
        return cls(
            rollout_dump_path(config_path, environ=env),
            rule=rule,
            run_dir=env.get(RUN_DIR) or None,
        )

    def start(
        self,
        debugger: Any,
        model: Any,
        scheduler_output: SchedulerOutputLike,
        attn_state: object,
        batch_order: Sequence[str] | None = None,
    ) -> bool:
        """Upstream's ``debugger.start`` site. Returns whether msprobe was started."""
        reqs = scheduled_requests(scheduler_output)
        # vLLM's runner passes None (it has no attention state): derive vllm-ascend's name
        state = (
            attn_state_name(attn_state) if attn_state is not None else derived_attn_state(scheduler_output)
        )
        phase = phase_of(state, reqs)
        targets: list[str] = []
        if self.rule.is_all:
            run = True
        else:
            # every captured request whose whole prompt this step computes, each in a lane of
            # its own, in packing order (request_scope.dump_targets, msprobe_lanes)
            targets = request_scope.dump_targets(in_batch_order(reqs, batch_order), phase, self.rule)
            run = bool(targets)

        service = debugger.service
        if run:
            level = str(getattr(getattr(debugger, "config", None), "level", "L1")).upper()
            kwargs: dict[str, Any] = {"model": model} if level in DUMP_MODEL_LEVELS else {}
            if not targets:
                msprobe_lanes.uninstall(service)
                debugger.start(**kwargs)
            else:
                tokens = dict(scheduler_output.num_scheduled_tokens)
                order = list(batch_order) if batch_order is not None else list(tokens)
                lanes = msprobe_lanes.packed_lanes(tokens, order, targets, request_rows=True)
                request_scope.start_lanes(debugger, kwargs.get("model"), lanes)
            dumped = _dumped_now(service)
            step = int(service.current_iter)
        else:
            dumped = False
            # msprobe is not started, so its counter does not move: this is the N that the
            # next dumped step will get. No step{N} folder belongs to this record.
            step = int(service.loop + service.init_step)
        self._started = run

        self._writer.write(
            records.DispatchRecord(
                timestamp=records.now(),
                pid=self.pid,
                rank=dist_rank() or 0,
                step=step,
                dump_path=(
                    layout.relative_to_run(service.config.dump_path, self.run_dir) if dumped else None
                ),
                phase=phase,  # type: ignore[arg-type]
                attn_state=state,
                total_num_scheduled_tokens=int(scheduler_output.total_num_scheduled_tokens),
                requests=reqs,
                dumped=dumped,
                lane_request_ids=targets or None,
                runner_step=self.runner_step,
                weight_version=weight_sync.loaded_version(),
            )
        )
        self.runner_step += 1
        return run

    def finish(self) -> bool:
        """At a stop site: True exactly once after a started step (then stop+step it)."""
        started, self._started = self._started, False
        return started

    def close(self) -> None:
        self._writer.close()
