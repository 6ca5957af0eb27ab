"""The dumped training forward at the weights the rollout used (issue 41).

**Why.** In the async modes the rollout runs ahead of the trainer: a request generated with the
weights of sync ``v`` is trained at a later step, whose forward runs newer weights. Its prefill and
that forward differ by the optimizer steps in between, so the pairing refuses them
(``weights_differ``): on an H100 a fully-async run paired 16 of 144 requests, all of its first step.
A collection that compares one step in eight cannot see a sync fault, staleness or drift.

**What.** Each trainer rank keeps host copies of its weight shards, one per sync label, and the
dumped forward of a request rolled out at an older label runs again at that label's weights:

* :meth:`WeightStore.keep`: at the first ``forward_backward_batch`` after sync ``v`` (no optimizer
  step since, ``weight_sync.trainer_version() == (v, 0)``) the engine holds exactly what it sent as
  ``v``; its parameter shards are copied to the host under ``v``. At most ``KEEP_VERSIONS``
  (default :data:`DEFAULT_KEEP`, verl 0.9.1's own ``trainer.v1.sampler.max_off_policy_threshold``,
  beyond which verl drops a trajectory) are kept, the oldest dropped first. A request older than
  every kept version is dumped at the trainer's weights, as before, and pairs ``weights_differ``.
* The rollout's version of a request is verl's own ``min_global_steps``: the vLLM server stamps every
  output with the label of the weights it holds (``vllm_async_server.py`` ``extra_fields``), syncs
  abort requests in flight first, and the clients keep the first generate call's label
  (``llm_server.py``), i.e. the prefill's. The training hook reads it from the micro batch.
* :func:`replay`, after verl's loop: for each older version, the current shards go to the host, the
  kept ones are copied in, the engine's own ``forward_step`` runs each deferred micro batch under
  ``no_grad`` with the dumper started for the deferred requests' lanes, and the current shards are
  copied back. Every value verl returns was computed by its own loop before this: log-probs, loss and
  gradients are the same bits as without the dump (``tests/patches/test_training_fsdp.py``).

**Why not verl's own copies.** verl 0.9.1 keeps pi_old on the host for Decoupled PPO
(``DetachActorWorker.save_model_to_cpu``, ``fsdp2_sharded_save_to_cpu``), but (a) only on the
separate pools' worker and only inside ``_compute_old_log_prob``'s cycle, not per sync label, and
colocate_async's worker has no such method; (b) its ``tensor.cpu()`` returns the live tensor itself
when the parameter is already on the host (a CPU engine, or param offload), so such a copy follows
the optimizer. The copy here always copies (``to("cpu", copy=True)``) and restores with ``copy_``,
which is exact for every dtype.

**Cost.** One host copy of the rank's shards per version kept (FSDP: the model's parameter bytes
divided by the data-parallel size, in the master dtype), plus one more while a replay runs. The first
copy checks that ``KEEP_VERSIONS`` of them, for every rank of the node, fit the host's available
memory, and refuses with the figures otherwise: a trainer killed by the host's OOM killer at step 40
loses more than a clear error at step 1.

Imports torch only when called.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from verl_consistency.contracts import env

logger = logging.getLogger(__name__)

DEFAULT_KEEP = 8
"""verl 0.9.1's default ``trainer.v1.sampler.max_off_policy_threshold``: a trajectory spanning more
model versions than this is dropped by verl's replay buffer (strategy ``drop``)."""

HEADROOM = 0.8
"""The share of the host's available memory the kept copies of a node's ranks may take."""


class WeightsDoNotFit(RuntimeError):
    """Keeping the versions a collection needs would exhaust the host; the message says what to set."""


def keep_versions(environ: dict[str, str] | os._Environ[str] | None = None) -> int:
    """``$VERL_CONSISTENCY_KEEP_VERSIONS`` (default :data:`DEFAULT_KEEP`); 0 turns the replay off."""
    e = os.environ if environ is None else environ
    raw = e.get(env.KEEP_VERSIONS, "").strip()
    if not raw:
        return DEFAULT_KEEP
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"environment variable {env.KEEP_VERSIONS}={raw!r}: expected a non-negative integer")
    return n


def _shards(module: Any) -> Iterator[tuple[str, Any]]:
    """Each parameter's local data: the shard of an FSDP2 DTensor, FSDP1's flat parameter, else itself."""
    for name, param in module.named_parameters():
        local = getattr(param, "_local_tensor", None)
        yield name, (local if local is not None else param.data)


def reshard_all(module: Any) -> None:
    """Free every gathered (unsharded) parameter, so that the local shards are what the next forward uses.

    FSDP keeps the root unit's parameters gathered after a forward (FSDP2: "will not
    reshard_after_forward for root module", verl's ``apply_fsdp2``; FSDP1: ``_post_forward_reshard``
    frees non-root units only), and a forward under ``no_grad`` has no backward to reshard them.
    Shards copied in then would not reach that forward, and shards copied out could be the gathered
    buffer. FSDP2's ``FSDPModule.reshard`` is public; FSDP1 has no public call, so its own
    ``_runtime_utils._reshard`` is used for a handle that is gathered now (a world of one runs
    FSDP1 as NO_SHARD: nothing to do).
    """
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp._runtime_utils import _reshard
    except ImportError:  # pragma: no cover - every torch verl supports has both
        return
    for m in module.modules():
        handle = getattr(m, "_handle", None) if isinstance(m, FullyShardedDataParallel) else None
        if handle is not None and handle.uses_sharded_strategy and not handle.needs_unshard():
            _reshard(m, handle, True)


def host_copy(module: Any) -> dict[str, Any]:
    """A host copy of the module's local shards (always a copy, also of a tensor already on the host)."""
    return {name: t.detach().to("cpu", copy=True) for name, t in _shards(module)}


def load(module: Any, saved: dict[str, Any]) -> None:
    """Copy ``saved`` into the module's local shards, in place (no new storage, no autograd record)."""
    import torch

    with torch.no_grad():
        for name, t in _shards(module):
            t.copy_(saved[name], non_blocking=False)


def nbytes(saved: dict[str, Any]) -> int:
    return sum(int(t.numel()) * int(t.element_size()) for t in saved.values())


def _available_host_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return None


def _ranks_on_node() -> int:
    """How many trainer ranks share this host (verl's workers set ``LOCAL_WORLD_SIZE``)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def check_fits(one_copy: int, keep: int, ranks: int, available: int | None) -> None:
    """Refuse when ``keep`` copies for each of ``ranks`` ranks exceed :data:`HEADROOM` of ``available``."""
    if available is None:
        return
    need = one_copy * (keep + 1) * ranks  # +1: the current shards, copied out while a replay runs
    if need <= HEADROOM * available:
        return
    gib = 1024**3
    raise WeightsDoNotFit(
        f"keeping {keep} weight versions for the dumped forward at the rollout's weights needs "
        f"{need / gib:.1f} GiB of host memory on this node ({one_copy / gib:.2f} GiB a version per rank "
        f"x {keep + 1} x {ranks} rank(s)), and {available / gib:.1f} GiB is available. Set "
        f"{env.KEEP_VERSIONS} to fewer versions (requests staler than that pair weights_differ), "
        f"or 0 to dump every request at the trainer's weights, or lower verl's "
        "trainer.v1.sampler.max_off_policy_threshold so that less staleness is allowed"
    )


@dataclass
class WeightStore:
    """This rank's host copies of its weight shards, by sync label (oldest first)."""

    keep_n: int
    versions: OrderedDict[int, dict[str, Any]] = field(default_factory=OrderedDict)
    checked: bool = False

    def keep(self, module: Any, version: int) -> None:
        """Copy the module's shards under ``version`` once; drop the oldest beyond ``keep_n``."""
        if self.keep_n <= 0 or version in self.versions:
            return
        reshard_all(module)
        saved = host_copy(module)
        if not self.checked:
            check_fits(nbytes(saved), self.keep_n, _ranks_on_node(), _available_host_bytes())
            self.checked = True
        self.versions[version] = saved
        while len(self.versions) > self.keep_n:
            dropped, _ = self.versions.popitem(last=False)
            logger.info("verl-consistency: dropped the host copy of weight version %s", dropped)

    def has(self, version: int) -> bool:
        return version in self.versions

    @contextmanager
    def swapped(self, module: Any, version: int) -> Iterator[None]:
        """The module at ``version``'s weights inside, its own weights (the same bits) after.

        Resharded on the way in and out (:func:`reshard_all`): the forward inside gathers the kept
        shards, and the engine's next forward gathers its own again.
        """
        reshard_all(module)
        current = host_copy(module)
        load(module, self.versions[version])
        try:
            yield
        finally:
            reshard_all(module)
            load(module, current)


_STORE: WeightStore | None = None
_STORE_PID: int | None = None


def store() -> WeightStore:
    """This process's store (a forked child starts with none: its parent's copies are not its engine's)."""
    global _STORE, _STORE_PID
    if _STORE is None or os.getpid() != _STORE_PID:
        _STORE = WeightStore(keep_versions())
        _STORE_PID = os.getpid()
    return _STORE


def reset_for_tests() -> None:
    global _STORE, _STORE_PID
    _STORE = None
    _STORE_PID = None
