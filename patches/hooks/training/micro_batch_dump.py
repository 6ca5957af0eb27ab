"""Training-side msprobe dumps: one msprobe step per micro batch (FSDP) or ``forward_step`` (Megatron).

The patched engines call only two things::

    dumper = micro_batch_dump.batch_dumper(self, backend="fsdp", forward_only=forward_only)
    for micro_batch in micro_batches:
        dumper.start(micro_batch, model=self.module)
        ...  # forward (and backward)
        dumper.stop(micro_batch)

Everything else lives here, where it is tested:

* only the **actor** engine dumps: the ref engine (``engine_config.forward_only``) and the critic
  (``model_type == "value_model"``) never do;
* ``DUMP_PHASE`` picks ``log_prob`` (forward-only calls: old log-probs), ``update_actor`` or ``all``;
* the msprobe config comes from ``$VERL_CONSISTENCY_ACTOR_CONFIG`` (the recipe hard-codes
  ``/home/config_actor.json``), and the dump goes to a per-process folder, ``actor/<pid>`` of the
  run (``$VERL_CONSISTENCY_RUN_DIR``), or ``<config dump_path>/<pid>`` without a run folder;
* each dumped micro batch appends one ``update_actor_log.jsonl`` record whose ``step`` is msprobe's
  own ``current_iter`` (the N of ``step{N}/``) and whose ``dump_path`` says where that step lies;
* in capture mode (``$VERL_CONSISTENCY_CAPTURE=fraction:F``) a micro batch is dumped only when one
  of its requests is captured; skipped micro batches consume no msprobe step.
* the request ids come from the micro batch's ``request_id`` column (verl 0.8.0) or, when there is
  none, from each row's ``extra_fields`` dict (verl 0.9.1's V1 TransferQueue path); verl 0.9.1's
  synthetic padding rows (``uid`` ``pad<32 hex>``) copy a real row's fields, so a micro batch of
  padding rows only is not dumped and a mixed one names its padding rows by their ``uid``;
* each captured request of an FSDP micro batch is its own msprobe dump (a lane) cut to its
  **prompt rows** (``prompt_rows.PackedLayout``): ride-along forwards cover prompt + response,
  and attention is causal, so the prompt's rows are what vLLM's prefill computed. A micro batch
  of one row whose forward covers the prompt only (PROMPTS_ONLY) is dumped whole, as before;
* each captured request of a Megatron micro batch is its lane too, cut to its prompt rows in
  Megatron's sequence-first tensors (``megatron_lanes``: the bshd layout; what it cannot cut is
  refused there, by name); a micro batch of one prompt-only row is dumped whole, as before.
* a dumped micro batch runs with Python's automatic garbage collector off, from ``start`` to the
  end of msprobe's write in ``stop``, and one young collection after it (``gc_pause``, issue 43).
* an FSDP micro batch's lane files are rendered and written by a helper process
  (``lanes/lane_writer``, issue 43) while the next micro batches run; ``replay`` (after the engine's
  loop) waits for them, and each record is appended once its step's files are on disk
  (``dump_session.Session.log``). ``VERL_CONSISTENCY_LANE_WRITE=inline`` writes them in ``stop``.

msprobe's ``PrecisionDebugger`` is one instance per process. In verl 0.8.0 the vLLM workers run in
their own processes (vLLM's ``mp`` executor under the ``vLLMHttpServer`` actor), so the actor's
process normally owns it. If something else in the process created it first (verl's own
``global_profiler.tool=precision_debugger``, a user's script), the dumper *borrows* the instance:
it switches msprobe's runtime config to the actor config and folder for the duration of each
micro batch and restores the owner's config afterwards, so neither side writes into the other's
folder. msprobe's step counter is shared then; the records carry the step and folder used.

Nothing here imports torch, verl or msprobe at import time.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from verl_consistency.contracts import env, records, weight_labels
from verl_consistency.contracts.batch_fields import PREFILL_ROWS
from verl_consistency.contracts.process_local import dist_rank
from verl_consistency.patches.hooks.lanes import msprobe_lanes
from verl_consistency.patches.hooks.training import (
    dump_session,
    gc_pause,
    megatron_lanes,
    next_token,
    older_weights,
    weight_sync,
)
from verl_consistency.patches.hooks.training.dump_session import TrainingDumpError
from verl_consistency.patches.hooks.training.prompt_rows import PackedLayout, PromptRowsError

Backend = Literal["fsdp", "megatron"]
Phase = Literal["log_prob", "update_actor"]


class _NoDump:
    """What the engines get when this call is not dumped: two cheap no-ops."""

    def start(self, micro_batch: Any, model: Any) -> None:
        return None

    def stop(self, micro_batch: Any) -> None:
        return None

    def replay(self, engine: Any, loss_function: Any) -> None:
        return None


NO_DUMP = _NoDump()


def is_actor_engine(engine: Any) -> bool:
    """True for the policy's training engine; False for the ref engine and the critic."""
    engine_config = getattr(engine, "engine_config", None)
    if engine_config is None or bool(getattr(engine_config, "forward_only", False)):
        return False
    model_type = getattr(getattr(engine, "model_config", None), "model_type", "language_model")
    return model_type != "value_model"


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if hasattr(value, "tolist"):
        out = value.tolist()
        return out if isinstance(out, list) else [out]
    return [value]


EXTRA_FIELDS = "extra_fields"
"""verl 0.9's V1 data path keeps each sample's agent-loop ``extra_fields`` as one dict per row
(``agent_loop_tq.py`` stores ``AgentLoopOutput.as_dict()`` in TransferQueue unflattened), where
0.8.0's ``AgentLoopWorker._postprocess`` flattened them into top-level non-tensor columns."""

ROLLOUT_VERSION = "min_global_steps"
"""verl 0.9.1's label of the weights of a trajectory's first generate call (its prefill): the vLLM
server stamps ``global_steps`` on every output, ``LLMServerClient.generate`` and the fully-async
client's resume loop keep the first as ``min_global_steps`` in ``extra_fields``."""

_PADDING_UID = re.compile(r"^pad[0-9a-f]{32}$")
"""verl 0.9's ``upsample_batch_to_divisible_size`` (``trainer/ppo/padding_utils.py``) names its
synthetic rows ``uid = f"pad{uuid4().hex}"``; dataset uids are ``str(uuid4())``, never this."""


def request_ids_of(micro_batch: Any, key: str = "request_id") -> list[Any]:
    """The micro batch's per-sample values of ``key`` as a list (empty when absent).

    A top-level column wins (verl 0.8.0, and 0.9.1 once the agent loop writes one); otherwise the
    value is read from each row's ``extra_fields`` dict (verl 0.9.1's V1 TransferQueue path).
    """
    from verl.utils import tensordict_utils as tu

    value = tu.get(micro_batch, key=key, default=None)
    if value is not None:
        return _as_list(value)
    extra = _as_list(tu.get(micro_batch, key=EXTRA_FIELDS, default=None))
    if not extra or not all(isinstance(x, dict) for x in extra):
        return []
    values = [x.get(key) for x in extra]
    return [] if all(v is None for v in values) else values


def padding_rows(micro_batch: Any) -> list[bool]:
    """Which rows are verl 0.9's synthetic padding samples (empty when the batch has no ``uid``).

    Those rows copy every field of the batch's first real sample, its request id included, so
    their id must not be reported: the dump of a padding row is an EOS sequence, not that request.
    """
    from verl.utils import tensordict_utils as tu

    uids = _as_list(tu.get(micro_batch, key="uid", default=None))
    return [isinstance(u, str) and bool(_PADDING_UID.match(u)) for u in uids]


def reset_for_tests() -> None:
    """Forget the process-wide session and kept weights (tests run several configurations in one process)."""
    dump_session.reset_for_tests()
    older_weights.reset_for_tests()


def _rank(engine: Any) -> int:
    rank = dist_rank()
    return rank if rank is not None else int(getattr(engine, "rank", 0) or 0)


def check_megatron_prompt_only(micro_batch: Any, packed: PackedLayout | None) -> None:
    """Refuse a whole Megatron dump whose forward covers more than its prompts.

    Used where a Megatron micro batch is dumped whole: its ``input_ids`` are not verl's nested
    tensor, so its rows' lengths (and lanes) are unknown. A whole dump of a ride-along forward
    would hold response rows that vLLM's prefill never computed, so it is refused rather than
    paired wrongly.
    """
    from verl.utils import tensordict_utils as tu

    marked = tu.get(micro_batch, key=PREFILL_ROWS, default=None) is not None
    if packed.prompt_only if packed is not None else marked:
        return
    raise TrainingDumpError(
        "this Megatron micro batch is dumped whole (its input_ids are not verl's nested tensor, so "
        "its rows cannot be cut into lanes), and its forward covers each request's prompt and "
        "response (ride-along): vLLM's prefill computed the prompt rows only. Run the collection "
        "with --prompts-only (PROMPTS_ONLY=1)"
    )


@dataclass
class _Active:
    """The micro batch being dumped: msprobe's step and what its record will say."""

    step: int
    ids: list[str]
    ids_all: list[Any]
    lane_ids: list[str] | None
    version: tuple[int | None, int]
    elsewhere: list[str] = field(default_factory=list)


@dataclass
class _Deferred:
    """A micro batch whose requests of one older weight version are dumped by :meth:`BatchDumper.replay`."""

    micro_batch: Any
    request_ids: list[str]


class BatchDumper:
    """One ``forward_backward_batch`` call of the actor engine, dumped micro batch by micro batch."""

    def __init__(
        self,
        session: dump_session.Session,
        backend: Backend,
        phase: Phase,
        rank: int,
        version: tuple[int | None, int] = (None, 0),
        megatron: megatron_lanes.MegatronGeometry | None = None,
    ) -> None:
        self.session = session
        self.backend = backend
        self.megatron = megatron
        """Where a Megatron forward's rows lie (read from the engine once a call); None for FSDP."""
        self.phase = phase
        self.rank = rank
        self.version = version
        """The weights of this call (``weight_sync.trainer_version``), read before its update."""
        self._active: _Active | None = None
        self._next: next_token.NextTokenProbe | None = None
        self._deferred: dict[int, list[_Deferred]] = {}
        """Older rollout version -> the micro batches whose requests of it :meth:`replay` dumps."""

    def _captured(self, ids: list[str], padding: list[bool]) -> list[str]:
        """The micro batch's requests to dump, in row order: padding rows never, else by the rule."""
        rule = self.session.capture
        real = [i for i, pad in zip(ids, padding or [False] * len(ids), strict=False) if not pad]
        return [i for i in real if rule.is_all or rule.captures(records.base_request_id(i))]

    def _defer_older(self, micro_batch: Any, ids: list[str], captured: list[str]) -> list[str]:
        """Set aside the captured requests whose rollout ran other kept weights; return the rest.

        The rollout's version is verl's ``min_global_steps`` (:mod:`.older_weights`). A request
        whose version is unknown, is this call's own, or is no longer kept stays in this forward.
        """
        if self.backend != "fsdp" or not captured:
            return captured
        versions = request_ids_of(micro_batch, ROLLOUT_VERSION)
        if len(versions) != len(ids):
            return captured
        of = dict(zip(ids, versions, strict=True))
        store = older_weights.store()
        now: list[str] = []
        later: dict[int, list[str]] = {}
        for rid in captured:
            v = weight_labels.label(of.get(rid))
            if v is None or (v, 0) == self.version or not store.has(v):
                now.append(rid)
            else:
                later.setdefault(v, []).append(rid)
        for v, subset in later.items():
            self._deferred.setdefault(v, []).append(_Deferred(micro_batch, subset))
        return now

    def _lanes(
        self, micro_batch: Any, ids: list[str], captured: list[str]
    ) -> tuple[PackedLayout | None, list[msprobe_lanes.Lane] | None, list[int] | None]:
        """The micro batch's layout, its lanes (None: dump the micro batch whole) and each row's
        last prompt position in the flattened logits.

        One msprobe dump per captured request (``msprobe_lanes``), cut to its prompt rows out of
        the forward: FSDP's layout (``prompt_rows``), or Megatron's (``megatron_lanes``). A micro
        batch of one row whose forward is its prompt alone (PROMPTS_ONLY) is that request's dump
        whole, as before.
        """
        if not captured:
            return None, None, None
        try:
            packed = PackedLayout.of(micro_batch)
        except PromptRowsError as exc:
            raise TrainingDumpError(f"{exc}; or run the collection with --prompts-only") from None
        if packed is None or (len(ids) == 1 and packed.prompt_only):
            if self.backend == "megatron":
                check_megatron_prompt_only(micro_batch, packed)
            return packed, None, None
        if self.megatron is not None:
            try:
                lanes, last = self.megatron.lanes(micro_batch, packed, ids, captured)
            except megatron_lanes.MegatronLanesError as exc:
                raise TrainingDumpError(str(exc)) from None
            return packed, lanes, last
        return packed, packed.lanes(ids, captured), packed.last_positions()

    def start(self, micro_batch: Any, model: Any) -> None:
        self._begin(micro_batch, model, only=None, version=self.version)

    def _begin(
        self, micro_batch: Any, model: Any, only: list[str] | None, version: tuple[int | None, int]
    ) -> None:
        """Start msprobe for the micro batch's captured requests (``only``: a replay's subset)."""
        ids = [str(i) for i in request_ids_of(micro_batch)]
        ids_all = request_ids_of(micro_batch, "request_ids_all")
        padding = padding_rows(micro_batch)
        if any(padding) and len(padding) == len(ids):
            if all(padding):  # only synthetic rows: nothing to compare, no msprobe step used
                self._active = None
                return
            # a mixed micro batch names its padding rows by their uid: never a request's id
            uids = request_ids_of(micro_batch, "uid")
            ids = [str(u) if pad else rid for rid, pad, u in zip(ids, padding, uids, strict=True)]
            if len(ids_all) == len(padding):
                ids_all = [[] if pad else x for x, pad in zip(ids_all, padding, strict=True)]
        captured = self._captured(ids, padding)
        if only is None:
            every = captured
            captured = self._defer_older(micro_batch, ids, captured)
        else:
            every, captured = captured, [i for i in captured if i in only]
        elsewhere = [i for i in every if i not in captured]
        # 'all' dumps a micro batch that names no request too (the pairing lists it no_request_id)
        whole_ok = self.session.capture.is_all and not elsewhere
        if self.session.service.should_stop_service or not (captured or whole_ok):
            self._active = None
            return
        packed, lanes, last_positions = self._lanes(micro_batch, ids, captured)
        if elsewhere and not lanes:  # a whole dump would mix in the requests dumped elsewhere
            self._active = None
            return
        # no automatic collections until stop() (gc_pause.py: issue 43), msprobe's hooks' included
        gc_pause.pause(getattr(self.session.service, "hook_manager", None))
        try:
            self.session.enter()
            if lanes:
                front = msprobe_lanes.install(self.session.service, lanes)
                if self.backend == "fsdp" and isinstance(front, msprobe_lanes.LaneStats):
                    front.writer = self.session.lane_writer()  # drained after the loop: replay()
            else:
                msprobe_lanes.uninstall(self.session.service)
            self.session.debugger.start(model=model)
        except BaseException:
            gc_pause.resume()
            raise
        step = int(self.session.service.current_iter)
        lane_ids = [lane.request_id for lane in lanes] if lanes else None
        self._active = _Active(step, ids, ids_all, lane_ids, version, elsewhere)
        if self.megatron is not None and self.megatron.tp > 1:
            self._next = None  # its output layer's logits are split by vocabulary across the ranks
        elif lane_ids and packed is not None:
            self._next = next_token.NextTokenProbe.attach(
                micro_batch,
                model,
                wanted=[ids.index(rid) for rid in lane_ids],
                last_positions=last_positions,
            )
        elif self.megatron is not None and packed is not None and packed.prompt_only:
            # one whole row, padded by verl to more than its length: its last real position
            self._next = next_token.NextTokenProbe.attach(
                micro_batch, model, wanted=[0], last_positions=[packed.lengths[0] - 1]
            )
        elif packed is None or packed.prompt_only:
            # a whole dump's output row is its last position: a prompt-only forward's alone
            self._next = next_token.NextTokenProbe.attach(micro_batch, model)
        else:
            self._next = None

    def stop(self, micro_batch: Any) -> None:
        if self._active is None:
            return
        active, self._active = self._active, None
        probe, self._next = self._next, None
        try:
            self.session.debugger.stop()
            self.session.debugger.step()
        finally:
            self.session.leave()
            if probe is not None:
                probe.detach()
            gc_pause.resume()  # after msprobe's write: the step's young garbage, once
        # msprobe decides on its own whether a step is written (config step/rank lists, its
        # end of service, dump_enable); log exactly the steps that exist on disk.
        if not (self.session.dump_dir / f"step{active.step}").is_dir():
            return
        ids, lane_ids = active.ids, active.lane_ids
        if probe is not None:
            probe.write(
                self.session.dump_dir,
                step=active.step,
                dump_path=self.session.rel_dump_path,
                phase=self.phase,
                request_ids=list(lane_ids) if lane_ids else [ids[0] if ids else None],
            )
        self.session.log(
            records.UpdateActorRecord(
                timestamp=records.now(),
                pid=os.getpid(),
                rank=self.rank,
                step=active.step,
                dump_path=self.session.rel_dump_path,
                phase=self.phase,
                backend=self.backend,
                request_ids=ids,
                num_requests=len(ids),
                **self._record_extra(active),
            )
        )

    def _record_extra(self, active: _Active) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if active.ids_all:
            extra["request_ids_all"] = [[str(i) for i in (x or [])] for x in active.ids_all]
        if active.lane_ids is not None:
            extra["lane_request_ids"] = active.lane_ids
        if active.elsewhere:
            extra["lanes_elsewhere"] = active.elsewhere
        version, unsynced = active.version
        if version is not None:
            extra["weight_version"] = version
        if unsynced:
            extra["unsynced_updates"] = unsynced
        if active.version != self.version and self.version[0] is not None:
            extra["trainer_weight_version"] = self.version[0]
            if self.version[1]:
                extra["trainer_unsynced_updates"] = self.version[1]
        return extra

    def replay(self, engine: Any, loss_function: Any) -> None:
        """Dump the deferred requests' forwards at the weights their rollout used (``older_weights``).

        Called by the patched engine after its own loop, so every value verl returns is already
        computed. Each older version: its kept shards are copied in, the engine's own
        ``forward_step`` runs each deferred micro batch under ``no_grad`` (its output discarded),
        and the engine's own shards are copied back, bit for bit.
        """
        try:
            self._replay(engine, loss_function)
        finally:
            # the lanes' files of this call, written by the helper (lane_writer), and their records
            self.session.finish_writes()

    def _replay(self, engine: Any, loss_function: Any) -> None:
        if not self._deferred:
            return
        import torch

        deferred, self._deferred = self._deferred, {}
        store = older_weights.store()
        for version in sorted(deferred):
            with store.swapped(engine.module, version):
                for item in deferred[version]:
                    self._begin(item.micro_batch, engine.module, only=item.request_ids, version=(version, 0))
                    try:
                        with torch.no_grad():
                            engine.forward_step(
                                item.micro_batch, loss_function=loss_function, forward_only=True
                            )
                    finally:
                        self.stop(item.micro_batch)


def batch_dumper(engine: Any, *, backend: Backend, forward_only: bool) -> BatchDumper | _NoDump:
    """The engines' entry point, called once per ``forward_backward_batch``.

    A training call (not ``forward_only``) is counted as an optimizer step to come
    (``weight_sync.note_update``) after its own weights are read: the call's forward runs the
    weights from before that step, and every later forward runs weights of no sync until the
    next one.
    """
    gc_pause.resume()  # a dumped step of an earlier call that never reached its stop (it raised)
    earlier = dump_session.existing()
    if earlier is not None:  # an earlier call that raised before its replay: its lanes' files
        earlier.finish_writes()
    if not env.flag(env.DUMP_ON) or not is_actor_engine(engine):
        return NO_DUMP
    version = weight_sync.trainer_version()
    if backend == "fsdp" and version[0] is not None and version[1] == 0:
        # the engine holds exactly what it sent as this version: keep a host copy of it, for the
        # dumped forwards of requests a later step trains (older_weights)
        older_weights.store().keep(engine.module, version[0])
    if not forward_only:
        weight_sync.note_update()
    phase: Phase = "log_prob" if forward_only else "update_actor"
    wanted = env.dump_phase()
    if wanted is not env.DumpPhase.ALL and wanted.value != phase:
        return NO_DUMP
    geometry = megatron_lanes.MegatronGeometry.of(engine) if backend == "megatron" else None
    return BatchDumper(dump_session.session(), backend, phase, _rank(engine), version, geometry)


def current(engine: Any) -> BatchDumper | _NoDump:
    """Megatron's ``forward_step`` runs inside Megatron's schedule: it finds the call's dumper here."""
    return getattr(engine, "_vc_dumper", NO_DUMP)
