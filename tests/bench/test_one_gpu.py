"""The one-GPU harness of issue 33 (bench/gpu/one_gpu/), proven on CPU against verl 0.9.1's real code.

* The stand-in checkpoint engine reaches verl only through verl's plugin hook: verl's own
  ``CheckpointEngineManager`` finds it once ``custom_backend_module`` names it, and not before.
* Driven through verl's ``CheckpointEngine`` interface in the order verl drives it (prepare,
  build_topology, init_process_group, send/receive at once, finalize), every weight arrives
  bit-equal, in order, with its name, dtype and shape; the trainer's other ranks only walk their
  weights; at most two buckets are ever in flight.
* A bad configuration stops with an error that names what to fix.
* On a real Ray cluster (the Ray test): with ``CUDA_VISIBLE_DEVICES=0,0`` and two declared GPUs,
  the trainer's and the rollout's pools, made by verl's own code, are both on device 0, and verl's
  real ``CheckpointEngineManager.update_weights`` moves the weights to a real
  ``CheckpointEngineWorker`` (tests/bench/one_gpu_driver.py).

verl 0.9.1 only: verl 0.8.0 (the current set) has no ``custom_backend_module``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from verl_consistency.contracts import pins

REPO = Path(__file__).resolve().parents[2]
ONE_GPU = REPO / "bench" / "gpu" / "one_gpu"
MODULE = "one_gpu_ckpt"
BACKEND = "one_gpu_shm"

pytestmark = [
    pytest.mark.verl,
    pytest.mark.pinset,
    pytest.mark.skipif(pins.get("set.name") != "next", reason="verl 0.9.1's checkpoint-engine plugin hook"),
]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """verl's registry without the stand-in, and the stand-in's folder on sys.path (as on the device)."""
    from verl.checkpoint_engine import CheckpointEngineRegistry

    monkeypatch.syspath_prepend(str(ONE_GPU))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    saved = dict(CheckpointEngineRegistry._registry)
    CheckpointEngineRegistry._registry.pop(BACKEND, None)
    yield CheckpointEngineRegistry
    CheckpointEngineRegistry._registry.clear()
    CheckpointEngineRegistry._registry.update(saved)


def _config(**kwargs: Any) -> Any:
    from verl.workers.config import CheckpointEngineConfig

    return CheckpointEngineConfig(backend=BACKEND, **kwargs)


def test_verl_finds_the_backend_only_through_custom_backend_module(registry: Any) -> None:
    from verl.checkpoint_engine import CheckpointEngineManager

    with pytest.raises(ValueError, match=f"Checkpoint engine {BACKEND} not registered") as e:
        CheckpointEngineManager(config=_config(), actor_wg=None, replicas=[])
    assert "nccl" in str(e.value) or "naive" in str(e.value), "verl's message lists what is registered"
    manager = CheckpointEngineManager(
        config=_config(custom_backend_module=MODULE), actor_wg=None, replicas=[]
    )
    assert manager.backend_cls is sys.modules[MODULE].OneGpuShmCheckpointEngine
    assert registry.get(BACKEND) is manager.backend_cls


def test_a_missing_plugin_module_stops_verl_at_once(registry: Any) -> None:
    from verl.checkpoint_engine import CheckpointEngineManager

    with pytest.raises(ModuleNotFoundError, match="one_gpu_ckpt_typo"):
        CheckpointEngineManager(
            config=_config(custom_backend_module="one_gpu_ckpt_typo"), actor_wg=None, replicas=[]
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"bucket_size": 1 << 20, "rot": "/tmp"},
            r"unknown key\(s\) \['rot'\].*\['root', 'timeout_s', 'device', 'poll_s'\]",
        ),
        ({"bucket_size": 0}, "bucket_size must be a positive number of bytes"),
        ({"bucket_size": 1 << 20, "device": "npu"}, r"device must be one of \['auto', 'cpu', 'cuda'\]"),
        ({"bucket_size": 1 << 20, "root": "/nonexistent/shm"}, "is not a writable folder"),
        ({"bucket_size": 1 << 20, "timeout_s": 0}, "timeout_s and poll_s must be > 0"),
    ],
)
def test_a_bad_engine_config_names_what_to_fix(registry: Any, kwargs: dict[str, Any], message: str) -> None:
    from verl.utils.import_utils import import_external_libs

    import_external_libs(MODULE)
    with pytest.raises(ValueError, match=message):
        registry.new(BACKEND, **kwargs)  # what verl does with engine_kwargs.one_gpu_shm (base.py:337)


def _weights(seed: int) -> list[tuple[str, Any]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    special = torch.tensor([float("nan"), -0.0, float("inf"), 1e-45], dtype=torch.float32)
    return [
        ("embed", torch.randn(64, 40, generator=g).to(torch.bfloat16)),  # 5120 B: larger than a bucket
        ("norm", torch.randn(3, generator=g)),
        ("odd_bf16", torch.randn(7, generator=g).to(torch.bfloat16)),  # 14 B: the next must be realigned
        ("fp32_after_odd", torch.randn(5, 3, generator=g)),
        ("fp16", torch.randn(9, 9, generator=g).to(torch.float16)),
        ("int_ids", torch.arange(11, dtype=torch.int64)),
        ("scalar", torch.tensor(3.5)),
        ("empty", torch.empty(0, 4)),
        ("special_bits", special),
    ] + [(f"layers.{i}.w", torch.randn(16, 16, generator=g)) for i in range(12)]  # 1 KiB each: many buckets


def _bits(t: Any) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(__import__("torch").uint8).numpy())


async def _sync(engines: dict[str, list[Any]], cls: Any, weights: list[tuple[str, Any]]) -> tuple[list, list]:
    """One weight sync as CheckpointEngineManager.update_weights drives it (base.py:510-565)."""
    actors, rollouts = engines["actor"], engines["rollout"]
    metadata = [e.prepare() for e in actors + rollouts]
    actor_kwargs, rollout_kwargs = cls.build_topology(len(actors), len(rollouts), metadata)
    for side, kw in ((actors, actor_kwargs), (rollouts, rollout_kwargs)):
        for i, engine in enumerate(side):
            engine.init_process_group(**{k: v[i] for k, v in kw.items()})
    walked: list[str] = []

    def walk() -> Iterator[tuple[str, Any]]:
        for name, t in weights:
            walked.append(name)
            yield name, t

    async def receive(engine: Any) -> list[tuple[str, Any]]:
        return [(n, t.clone()) async for n, t in engine.receive_weights(global_steps=7)]

    sends = [actors[0].send_weights(iter(weights), 7)] + [e.send_weights(walk(), 7) for e in actors[1:]]
    results = await asyncio.gather(*sends, *[receive(e) for e in rollouts])
    for e in actors + rollouts:
        e.finalize()
    return list(results[: len(actors)]), [results[len(actors) :], walked]


def test_weights_arrive_bit_equal_in_order_through_verls_interface(
    registry: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl.utils.import_utils import import_external_libs

    import_external_libs(MODULE)
    mod = sys.modules[MODULE]
    cls = registry.get(BACKEND)
    kw = {"bucket_size": 2048, "root": str(tmp_path), "device": "cpu", "timeout_s": 60.0}
    # the trainer side as engine_workers.py:686-688 builds it (is_master on rank 0), the rollout
    # side as CheckpointEngineWorker does (base.py:337: no is_master)
    engines = {
        "actor": [registry.new(BACKEND, is_master=r == 0, **kw) for r in range(2)],
        "rollout": [registry.new(BACKEND, **kw) for _ in range(2)],
    }
    peak: list[int] = []
    write = mod.OneGpuShmCheckpointEngine._write_bucket

    async def counting_write(self: Any, index: int, entries: Any, parts: Any) -> None:
        await write(self, index, entries, parts)
        peak.append(len(list(self.session.glob("bucket-*.meta"))))

    monkeypatch.setattr(mod.OneGpuShmCheckpointEngine, "_write_bucket", counting_write)
    weights = _weights(0)
    metrics, (received, walked) = asyncio.run(_sync(engines, cls, weights))
    assert walked == [n for n, _ in weights], "the trainer's other rank walked its whole weight generator"
    assert metrics[1] == {}, "only rank 0 sends"
    assert metrics[0][f"{BACKEND}/bytes"] == sum(t.nbytes for _, t in weights)
    assert metrics[0][f"{BACKEND}/buckets"] >= 8, "the weights span many buckets"
    assert max(peak) <= mod.IN_FLIGHT, f"at most {mod.IN_FLIGHT} buckets on the host at once, saw {max(peak)}"
    for got in received:
        assert [n for n, _ in got] == [n for n, _ in weights]
        for (name, sent), (_, arrived) in zip(weights, got, strict=True):
            assert (arrived.dtype, tuple(arrived.shape)) == (sent.dtype, tuple(sent.shape)), name
            assert _bits(arrived) == _bits(sent), f"{name} differs"
    assert not list(tmp_path.iterdir()), "finalize removed the sync's folder"
    # a second sync with other weights: a fresh folder, no stale bucket read
    _, (received2, _) = asyncio.run(_sync(engines, cls, _weights(1)))
    assert _bits(received2[0][0][1]) == _bits(_weights(1)[0][1]) != _bits(weights[0][1])


def test_a_reader_without_a_writer_times_out_naming_the_bucket(registry: Any, tmp_path: Path) -> None:
    from verl.utils.import_utils import import_external_libs

    import_external_libs(MODULE)
    engine = registry.new(BACKEND, bucket_size=1024, root=str(tmp_path), device="cpu", timeout_s=0.3)
    engine.init_process_group(rank=1, session=str(tmp_path), receivers=1)

    async def first() -> Any:
        return await anext(engine.receive_weights())

    with pytest.raises(TimeoutError, match="bucket 0 from the trainer"):
        asyncio.run(first())


def test_two_writers_are_refused_by_build_topology(registry: Any) -> None:
    from verl.utils.import_utils import import_external_libs

    import_external_libs(MODULE)
    with pytest.raises(ValueError, match="exactly the trainer's rank 0 must be the writer"):
        registry.get(BACKEND).build_topology(1, 1, [{"session": "/dev/shm/a"}, {"session": "/dev/shm/b"}])
    with pytest.raises(ValueError, match="exactly the trainer's rank 0 must be the writer"):
        registry.get(BACKEND).build_topology(1, 1, [{"session": None}, {"session": None}])


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_both_pools_land_on_device_0_and_verls_manager_moves_the_weights(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    work = tmp_path / "shm"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.bench.one_gpu_driver", str(result), str(work)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert result.is_file(), proc.stderr[-3000:]
    out = json.loads(result.read_text())
    # Ray's ids mapped through CUDA_VISIBLE_DEVICES=0,0 (ray/_private/worker.py:1061-1063): the
    # rollout's bundle holds Ray's GPU 1, and both verl's set_device (worker.py:279-281, under
    # NOSET) and vLLM's launch_servers (vllm_async_server.py:1348) read "0"
    for pool in ("trainer", "rollout"):
        assert out["placements"][pool]["accelerator_ids"] == ["0"], out["placements"]
        assert out["placements"][pool]["cuda_visible_devices"] == "0", out["placements"]
    assert out["leftover"] == [], "finalize removed every sync's folder"
    import torch

    from tests.bench.one_gpu_driver import make_weights

    for step in (1, 2):
        assert out["metrics"][str(step)][f"{BACKEND}/buckets"] >= 2
        saved = torch.load(work / f"sync-{step}.pt")
        assert saved["wire_format"] == "named_tensors"
        sent = make_weights(step)
        assert [n for n, _ in saved["weights"]] == [n for n, _ in sent]
        for (name, a), (_, b) in zip(saved["weights"], sent, strict=True):
            assert a.dtype == b.dtype, name
            assert _bits(a) == _bits(b), f"sync {step}: {name} differs"
