"""A stand-in checkpoint engine for verl 0.9.1's separate_async trainer on ONE device (issue 33).

Test scaffolding, never in the image. verl's ``nccl`` backend broadcasts the trainer's weights to
the rollout workers over NCCL, which refuses two ranks on one device; a one-GPU run (two logical
Ray GPUs over device 0, see README.md) needs another way to move the weights. This backend moves
them through host memory: the trainer's rank 0 writes each bucket of weights to a file in a
per-sync folder under ``/dev/shm`` (a tmpfs: RAM, no disk), and every rollout worker reads the
buckets back, puts them on its own device and yields them to verl's server adapter, which loads
them into vLLM as it does for NCCL (CUDA IPC from the ``CheckpointEngineWorker``).

It is registered through verl's own plugin hook: ``actor_rollout_ref.rollout.checkpoint_engine.
custom_backend_module=one_gpu_ckpt`` (this folder on ``PYTHONPATH``) makes verl import this module
before it asks its registry for ``backend=one_gpu_shm`` (``verl/checkpoint_engine/base.py:336`` in
the rollout's ``CheckpointEngineWorker``, ``:417`` in ``CheckpointEngineManager``,
``verl/workers/engine_workers.py:685`` in the trainer's worker). Nothing of verl is changed.

The call sequence is verl's (``CheckpointEngineManager.update_weights``, base.py:510-565): every
sync, ``prepare`` on every worker, ``build_topology`` on the driver, ``init_process_group`` on
every worker, then ``send_weights`` (trainer) and ``receive_weights`` (rollout) at the same time,
then ``finalize``. Only the trainer's rank 0 writes (``is_master``, engine_workers.py:686-688); the
other trainer ranks walk their weight generator, since producing a full tensor is collective over
the trainer's ranks (as nccl's non-sending ranks do).

Flow control: at most :data:`IN_FLIGHT` buckets are written and not yet read by every rollout
worker (each leaves an ``ack`` file); so the folder holds at most ``IN_FLIGHT * bucket_size``
bytes, and a bucket is deleted once all have read it.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

BACKEND = "one_gpu_shm"
"""The name under which the backend registers: ``checkpoint_engine.backend=one_gpu_shm``."""
IN_FLIGHT = 2
"""Buckets written and not yet read by every rollout worker, at most."""
KWARGS = ("root", "timeout_s", "device", "poll_s")
"""What ``checkpoint_engine.engine_kwargs.one_gpu_shm`` may set (anything else is refused)."""
DEVICES = ("auto", "cpu", "cuda")
ALIGN = 16
"""Each tensor starts at a multiple of this in its bucket, so that a byte view can take any dtype."""
DONE = "done"


@dataclass(frozen=True)
class Entry:
    """One tensor's place in a bucket file."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int


def _bucket(session: Path, index: int) -> tuple[Path, Path]:
    return session / f"bucket-{index:06d}.bin", session / f"bucket-{index:06d}.meta"


def _write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Write then rename: a reader that sees ``path`` sees all of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes on the host, as a flat uint8 tensor (bf16 has no numpy dtype)."""
    host = tensor.detach().contiguous().cpu()
    return host.reshape(-1).view(torch.uint8)


@CheckpointEngineRegistry.register(BACKEND)
class OneGpuShmCheckpointEngine(CheckpointEngine):
    """Weights from the trainer to the rollout through files in host shared memory (a stand-in).

    Args:
        bucket_size: bytes per bucket (verl passes ``update_weights_bucket_megabytes << 20``). A
            tensor larger than a bucket travels alone in a bucket of its own size.
        is_master: the trainer's rank 0, the one that writes (verl passes it on the trainer side
            only; the rollout side leaves it False).
        root: folder of the per-sync folders; default ``/dev/shm`` when it has room for
            :data:`IN_FLIGHT` buckets, else the temporary folder.
        timeout_s: how long a side waits for the other before it gives up with a TimeoutError.
        device: where received tensors are put: ``auto`` (this process's CUDA device when there is
            one, else the host), ``cpu`` or ``cuda``.
        poll_s: the interval at which a side looks for the other's files.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, **engine_kwargs: Any) -> None:
        unknown = sorted(set(engine_kwargs) - set(KWARGS))
        if unknown:
            raise ValueError(
                f"checkpoint_engine.engine_kwargs.{BACKEND}: unknown key(s) {unknown}; "
                f"this stand-in backend takes {list(KWARGS)}"
            )
        if not isinstance(bucket_size, int) or bucket_size <= 0:
            raise ValueError(
                f"{BACKEND}: bucket_size must be a positive number of bytes, got {bucket_size!r} "
                "(checkpoint_engine.update_weights_bucket_megabytes)"
            )
        self.bucket_size = bucket_size
        self.is_master = bool(is_master)
        self.timeout_s = float(engine_kwargs.get("timeout_s", 600.0))
        self.poll_s = float(engine_kwargs.get("poll_s", 0.005))
        if self.timeout_s <= 0 or self.poll_s <= 0:
            raise ValueError(
                f"{BACKEND}: timeout_s and poll_s must be > 0, got {self.timeout_s}, {self.poll_s}"
            )
        self.device = str(engine_kwargs.get("device", "auto"))
        if self.device not in DEVICES:
            raise ValueError(f"{BACKEND}: device must be one of {list(DEVICES)}, got {self.device!r}")
        root = engine_kwargs.get("root")
        self.root = Path(root) if root else self.default_root(bucket_size)
        if not self.root.is_dir() or not os.access(self.root, os.W_OK):
            raise ValueError(f"{BACKEND}: root {str(self.root)!r} is not a writable folder")
        self.rank: int | None = None
        self.receivers = 0
        self.session: Path | None = None

    @staticmethod
    def default_root(bucket_size: int) -> Path:
        """``/dev/shm`` when it can hold the buckets in flight (a container's is often 64 MB)."""
        shm = Path("/dev/shm")
        try:
            st = os.statvfs(shm)
        except OSError:
            return Path(tempfile.gettempdir())
        if os.access(shm, os.W_OK) and st.f_bavail * st.f_frsize >= (IN_FLIGHT + 1) * bucket_size:
            return shm
        return Path(tempfile.gettempdir())

    # -- verl's CheckpointEngine interface ---------------------------------------------------

    def prepare(self) -> dict[str, Any]:
        """Rank 0 of the trainer makes this sync's folder; its path reaches all via build_topology."""
        if not self.is_master:
            return {"session": None}
        session = self.root / f"verl-one-gpu-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        session.mkdir(mode=0o700)
        self.session = session
        return {"session": str(session)}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Trainer rank 0 writes (rank 0), the other trainer ranks sit out (-1), rollout workers read."""
        if len(metadata) != actor_wg_world_size + rollout_world_size:
            raise ValueError(
                f"{BACKEND}: {len(metadata)} prepare() results for {actor_wg_world_size} trainer "
                f"and {rollout_world_size} rollout workers"
            )
        sessions = [m.get("session") if isinstance(m, dict) else None for m in metadata]
        if not sessions[0] or any(sessions[1:]):
            raise ValueError(
                f"{BACKEND}: exactly the trainer's rank 0 must be the writer (is_master); the "
                f"workers' prepare() gave sessions {sessions}"
            )
        session = sessions[0]
        actor = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "session": [session] * actor_wg_world_size,
            "receivers": [rollout_world_size] * actor_wg_world_size,
        }
        rollout = {
            "rank": list(range(1, rollout_world_size + 1)),
            "session": [session] * rollout_world_size,
            "receivers": [rollout_world_size] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, rank: int, session: str, receivers: int) -> None:
        self.rank, self.receivers, self.session = rank, receivers, Path(session)

    def finalize(self) -> None:
        """The writer removes the sync's folder (verl calls this after both sides are done)."""
        if self.is_master and self.session is not None:
            shutil.rmtree(self.session, ignore_errors=True)
        self.session, self.rank = None, None

    @torch.no_grad()
    async def send_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int | None = None
    ) -> dict:
        """Write the weights bucket by bucket; returns verl's per-sync metrics (sizes and time)."""
        if self.rank is None or self.session is None:
            raise RuntimeError(f"{BACKEND}: send_weights before init_process_group")
        if self.rank < 0:  # not the writer: walk the generator (its full tensors are collective)
            async for _ in ensure_async_iterator(weights):
                pass
            return {}
        start, index, total = time.perf_counter(), 0, 0
        entries: list[Entry] = []
        parts: list[torch.Tensor] = []
        offset = 0
        async for name, tensor in ensure_async_iterator(weights):
            data = _as_bytes(tensor)
            pad = -offset % ALIGN
            if parts and offset + pad + data.numel() > self.bucket_size:
                await self._write_bucket(index, entries, parts)
                index, entries, parts, offset, pad = index + 1, [], [], 0, 0
            if pad:
                parts.append(torch.zeros(pad, dtype=torch.uint8))
                offset += pad
            entries.append(Entry(name, tuple(tensor.shape), tensor.dtype, offset, data.numel()))
            parts.append(data)
            offset += data.numel()
            total += data.numel()
        if parts:
            await self._write_bucket(index, entries, parts)
            index += 1
        _write_atomically(self.session / DONE, pickle.dumps({"buckets": index, "global_steps": global_steps}))
        await self._wait_acks(index - 1)
        return {
            f"{BACKEND}/bytes": float(total),
            f"{BACKEND}/buckets": float(index),
            f"{BACKEND}/send_s": time.perf_counter() - start,
        }

    async def receive_weights(
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Yield (name, tensor) in the trainer's order, each tensor bit-equal to what was sent."""
        if self.rank is None or self.session is None or self.rank < 1:
            raise RuntimeError(
                f"{BACKEND}: receive_weights on a worker that is not a reader (rank {self.rank})"
            )
        device = self._target_device()
        index = 0
        while True:
            found = await self._wait_bucket(index)
            if found is None:
                return
            blob, meta = found
            for e in meta:
                t = blob[e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape)
                yield e.name, (t.to(device) if device.type != "cpu" else t)
            (self.session / f"bucket-{index:06d}.ack-{self.rank}").touch()
            index += 1

    # -- the file protocol ---------------------------------------------------------------------

    async def _write_bucket(self, index: int, entries: list[Entry], parts: list[torch.Tensor]) -> None:
        assert self.session is not None
        await self._wait_acks(index - IN_FLIGHT)
        self._drop(index - IN_FLIGHT)
        bin_path, meta_path = _bucket(self.session, index)
        _write_atomically(bin_path, torch.cat(parts).numpy().data)
        _write_atomically(meta_path, pickle.dumps(entries))  # the meta last: it says the bucket is whole

    def _drop(self, index: int) -> None:
        if index < 0 or self.session is None:
            return
        for p in _bucket(self.session, index):
            p.unlink(missing_ok=True)

    async def _wait_acks(self, index: int) -> None:
        """Wait until every rollout worker has read bucket ``index`` (nothing to wait for below 0)."""
        if index < 0:
            return
        assert self.session is not None
        acks = [self.session / f"bucket-{index:06d}.ack-{r}" for r in range(1, self.receivers + 1)]
        await self._until(
            lambda: all(a.exists() for a in acks), f"the rollout workers to read bucket {index}"
        )

    async def _wait_bucket(self, index: int) -> tuple[torch.Tensor, list[Entry]] | None:
        """Bucket ``index`` once whole, or None when the writer said there are no more."""
        assert self.session is not None
        bin_path, meta_path = _bucket(self.session, index)
        done = self.session / DONE

        def ready() -> bool:
            if meta_path.exists():
                return True
            return done.exists() and pickle.loads(done.read_bytes())["buckets"] <= index

        await self._until(ready, f"bucket {index} from the trainer")
        if not meta_path.exists():
            return None
        meta: list[Entry] = pickle.loads(meta_path.read_bytes())
        raw = bytearray(bin_path.read_bytes())
        blob = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return blob, meta

    async def _until(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{BACKEND}: waited {self.timeout_s:.0f} s for {what} in {self.session}")
            await asyncio.sleep(self.poll_s)

    def _target_device(self) -> torch.device:
        if self.device == "cpu" or (self.device == "auto" and not torch.cuda.is_available()):
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())
