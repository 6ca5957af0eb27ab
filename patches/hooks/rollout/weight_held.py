"""vLLM side of the weight check: what each worker received, and what its model holds after (issue 42).

verl's worker extension (``vLLMColocateWorkerExtension.update_weights_from_ipc``,
``workers/rollout/vllm_rollout/utils.py``, both pin sets) receives a sync bucket by bucket and
loads each with the model's own ``load_weights``; the checkpoint engine of the separate pools ends
in the same method. Patch 0007 wraps its bucket callback with :meth:`HeldCheck.receiving` (each
tensor fingerprinted as it arrived, before loading) and calls :meth:`HeldCheck.finish` after
vLLM's ``process_weights_after_loading``: the tensors as vLLM now serves them.

**Where vLLM holds an HF tensor.** vLLM fuses several HF tensors into one parameter:
``qkv_proj`` holds ``q_proj``, ``k_proj`` and ``v_proj``, ``gate_up_proj`` holds ``gate_proj`` and
``up_proj``, stacked along the output dimension in the order of the model class's own table,
``packed_modules_mapping`` (the table vLLM's LoRA and quantisation code read). :func:`locate` reads
that table, never a list of names written here: the region of ``k_proj`` is the rows of
``qkv_proj`` after ``q_proj``'s. A tensor that is a parameter by its own name (``get_parameter``,
which also follows a tied ``lm_head`` to the embedding) is its parameter's leading rows: vLLM
pads the vocabulary of an embedding, never the front.

**What is not mapped, and says so** (``unmapped`` in the record; the postprocess lists them as not
checked): a tensor no parameter of the model holds, a fused tensor whose parts have not all been
seen, a parameter whose shape cannot hold the tensor, and every tensor of a worker with tensor
parallelism (each rank holds a slice of each part, which this check does not cut yet), and MoE
experts fused by their own loaders. Nothing is compared by guess.

**What is printed.** By default, the region of each tensor alone, in the dtype vLLM holds it in:
the trainer printed what it sent cast to verl's ``rollout.dtype``, the dtype vLLM holds
(``training/weight_export.py``), so the two compare directly, and each arrival is recorded by its
shape and dtype only (``arrived``). With ``$VERL_CONSISTENCY_WEIGHT_CHECK_ARRIVALS=1``, each arrival
is also fingerprinted as it arrived (compared with what the trainer sent, in the sent dtype) and
cast to its parameter's dtype as the loader casts it (compared with what the model then holds), so
that a wrong tensor is said to have changed on the way or in the loading: two more prints a sync.

The names the worker has received are remembered across syncs: a tensor a sync leaves out is
still fingerprinted where vLLM holds it, which is how a stale tensor shows.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_consistency.contracts.process_local import ProcessLocal
from verl_consistency.contracts.records import now
from verl_consistency.contracts.weight_labels import label
from verl_consistency.contracts.weight_records import TensorMeta, WeightSyncRecord
from verl_consistency.patches.hooks.weights import sync_log
from verl_consistency.patches.hooks.weights.fingerprint import Collector


@dataclass
class _Seen:
    """Per worker process: each tensor name received so far, with its shape and dtype."""

    tensors: dict[str, tuple[tuple[int, ...], Any]] = field(default_factory=dict)


_SEEN = ProcessLocal(_Seen)


def _seen() -> _Seen:
    return _SEEN.get()


def tensor_parallel_size() -> int:
    """vLLM's tensor-parallel world size in this worker (1 where vLLM's state is not set up)."""
    try:
        from vllm.distributed import parallel_state

        return int(parallel_state.get_tensor_model_parallel_world_size())
    except Exception:  # vLLM absent or its groups not initialised: a single worker
        return 1


class _Params:
    """The model's parameters by name, read once per phase of a sync (one walk of the modules, then
    a dict lookup per tensor instead of ``get_parameter``'s walk: the host's time per tensor is
    most of the check's cost). Tied names (``lm_head.weight`` = the embedding) are kept; a name the
    walk does not list still goes through ``get_parameter``. Built again after
    ``process_weights_after_loading``, which may replace a parameter."""

    def __init__(self, model: Any) -> None:
        self.model = model
        try:
            self.by_name = dict(model.named_parameters(remove_duplicate=False))
        except (AttributeError, TypeError):  # no torch module: only get_parameter (tests' stand-ins)
            self.by_name = {}
        self.holders: dict[str, tuple[Any, tuple[str, int, list[str]] | None] | str] = {}

    def get(self, name: str) -> Any | None:
        param = self.by_name.get(name)
        if param is not None:
            return param
        try:
            return self.model.get_parameter(name)
        except (AttributeError, KeyError, TypeError):
            return None

    def holder(self, name: str) -> tuple[Any, tuple[str, int, list[str]] | None] | str:
        """:func:`_holder` of ``name``, found once per phase (a fused part's own name misses the
        index and ``get_parameter`` before its fused parameter is found: not again per call)."""
        if name not in self.holders:
            self.holders[name] = _holder(self, name)
        return self.holders[name]


def _fused_parts(model: Any, name: str) -> tuple[str, int, list[str]] | None:
    """(fused parameter name, this part's index, the sibling part names) from the model's table."""
    table = getattr(model, "packed_modules_mapping", None) or {}
    for fused, parts in table.items():
        for i, part in enumerate(parts):
            token = f".{part}."
            if token in f".{name}":

                def sibling(p: str, part: str = part) -> str:
                    return f".{name}".replace(f".{part}.", f".{p}.", 1)[1:]

                target = f".{name}".replace(token, f".{fused}.", 1)[1:]
                return target, i, [sibling(p) for p in parts]
    return None


def _holder(params: _Params, name: str) -> tuple[Any, tuple[str, int, list[str]] | None] | str:
    """The vLLM parameter that holds HF tensor ``name``, with its fused part (name, index, sibling
    parts) when it is one; or why there is none."""
    param = params.get(name)
    if param is not None:
        return param, None
    fused = _fused_parts(params.model, name)
    if fused is None:
        return "no parameter of vLLM's model holds it (not in packed_modules_mapping either)"
    param = params.get(fused[0])
    if param is None:
        return f"vLLM's model has no {fused[0]}"
    return param, fused


def locate(
    model: Any, name: str, seen: dict[str, tuple[tuple[int, ...], Any]], params: _Params | None = None
) -> Any | str:
    """The region of vLLM's parameter that holds HF tensor ``name`` (a tensor view), or why not."""
    found = (params or _Params(model)).holder(name)
    if isinstance(found, str):
        return found
    param, fused = found
    shape = seen[name][0]
    rows = shape[0] if shape else 1
    start = 0
    if fused is not None:
        target, index, siblings = fused
        missing = [s for s in siblings[:index] if s not in seen]
        if missing:
            return f"fused into {target} after {', '.join(missing)}, which never arrived"
        start = sum(seen[s][0][0] if seen[s][0] else 1 for s in siblings[:index])
    held = param.data
    if (
        tuple(held.shape[1:]) != tuple(shape[1:])
        or held.dim() != max(len(shape), 1)
        or start + rows > held.shape[0]
    ):
        return f"vLLM's parameter {tuple(held.shape)} cannot hold {tuple(shape)} at row {start}"
    return held.narrow(0, start, rows).reshape(shape)


def held_dtype(model: Any, name: str, params: _Params | None = None) -> Any | None:
    """The dtype of the vLLM parameter that will hold HF tensor ``name`` (None: no such parameter)."""
    found = (params or _Params(model)).holder(name)
    return None if isinstance(found, str) else found[0].dtype


class HeldCheck:
    """One sync's check in one vLLM worker: :meth:`receiving` while it loads, :meth:`finish` after.

    A tensor may arrive in another dtype than vLLM holds it in (verl's FSDP engine exports its fp32
    master weights; vLLM serves bf16, and its loader's ``copy_`` rounds). With arrival prints on,
    each arrival is printed twice: as it arrived (compared with what the trainer sent) and cast to
    the parameter's dtype, as the loader casts it (``expected``: compared with what the model then
    holds). Both are exact. Without them only each arrival's shape and dtype are kept."""

    def __init__(self, folder: Path, global_steps: object, model: Any | None) -> None:
        self.folder = folder
        self.version = label(global_steps)
        self.model = model
        self.printing = sync_log.arrivals_printed()
        self.arrived: dict[str, TensorMeta] = {}
        self.received = Collector()
        self.expected = Collector()

    def receiving(self, on_bucket: Callable[..., Any]) -> Callable[..., Any]:
        """verl's bucket callback, with each tensor recorded (or fingerprinted) before it is loaded."""
        seen = _seen().tensors
        if not self.printing:

            def recorded(weights: list[tuple[str, Any]], *args: Any, **kwargs: Any) -> Any:
                for name, tensor in weights:
                    shape, dtype = tuple(tensor.shape), tensor.dtype
                    self.arrived[name] = TensorMeta.model_construct(
                        shape=list(shape), dtype=str(dtype).removeprefix("torch.")
                    )
                    seen[name] = (shape, dtype)
                return on_bucket(weights, *args, **kwargs)

            return recorded
        params = _Params(self.model) if self.model is not None else None

        def fingerprinted(weights: list[tuple[str, Any]], *args: Any, **kwargs: Any) -> Any:
            for name, tensor in weights:
                target = None if params is None else held_dtype(self.model, name, params)
                cast = target is not None and target != tensor.dtype
                # an arrival that is what the model must hold gets both sums; one that is cast on
                # loading is compared only with what was sent (row sums), its cast copy with the model
                self.received.add(name, tensor, cols=not cast)
                if cast:
                    self.expected.add(name, tensor, target)
                seen[name] = (tuple(tensor.shape), tensor.dtype)
            # summed now: the tensors are views of verl's bucket buffer, which the next bucket reuses
            self.received.flush()
            self.expected.flush()
            return on_bucket(weights, *args, **kwargs)

        return fingerprinted

    def finish(self, model: Any) -> None:
        """Fingerprint what ``model`` holds for every tensor received so far, in the dtype it holds
        it in; the record is written once the prints are read back, off the sync's path
        (``sync_log.write_later``)."""
        reads = [self.received.launch(), self.expected.launch()]
        held = Collector()
        seen = _seen().tensors
        tp = tensor_parallel_size()
        unmapped: dict[str, str] = {}
        if tp > 1:
            unmapped = dict.fromkeys(
                seen, f"vLLM tensor parallel size {tp}: each worker holds a slice (not cut yet)"
            )
        else:
            params = _Params(model)
            for name in seen:
                region = locate(model, name, seen, params)
                if isinstance(region, str):
                    unmapped[name] = region
                else:
                    held.add(name, region)
        reads.append(held.launch())
        on_path = round(self.received.seconds + self.expected.seconds + held.seconds, 4)
        rank, printing, arrived = sync_log.process_rank(), self.printing, self.arrived

        def record(
            received: dict[str, Any], expected: dict[str, Any], tensors: dict[str, Any]
        ) -> WeightSyncRecord:
            return WeightSyncRecord(
                timestamp=now(),
                pid=os.getpid(),
                rank=rank,
                side="held",
                version=self.version,
                tensors=tensors,
                received=received if printing else None,
                expected=expected or None,
                arrived=None if printing else arrived,
                unmapped=unmapped,
                seconds=on_path,
                read_s=round(sum(r.seconds for r in reads), 4),
            )

        sync_log.write_later(self.folder, reads, record)


def begin(global_steps: object, model: Any | None = None, *, adapter_only: bool = False) -> HeldCheck | None:
    """The check of the sync starting now into ``model``, or None when it is off (or the sync
    carries a LoRA adapter, whose tensors are not the model's)."""
    folder = sync_log.weights_dir()
    if folder is None or adapter_only:
        return None
    return HeldCheck(folder, global_steps, model)


def reset_for_tests() -> None:
    _SEEN.reset()
