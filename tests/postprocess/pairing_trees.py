"""Build run folders in code: logs in the hooks' formats and msprobe-shaped dump folders.

The dump.json files are synthetic but shaped like msprobe 26.2.0's L0 statistics dumps (same
top-level keys, ``Module.<path>.<Class>.forward.<n>`` names, dtype/shape/Max/Min/Mean/Norm
records, bare NaN/Infinity allowed). The compare stage's end-to-end test uses real dumps; the
pairing only reads the header and the layout, which is what these reproduce.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from verl_consistency.contracts import layout, records

SUFFIX = "1a2b3c4d"


def vid(base: str, child: int | None = None, suffix: str = SUFFIX) -> str:
    """vLLM's internal id for the id verl sent."""
    return f"{child}_{base}-{suffix}" if child is not None else f"{base}-{suffix}"


def req(
    request_id: str,
    tokens: int = 16,
    *,
    type: str = "new",
    prompt: int | None = None,
    computed: int | None = 0,
) -> dict[str, Any]:
    out: dict[str, Any] = {"request_id": request_id, "type": type, "tokens": tokens}
    if type == "new":
        out["prompt_tokens"] = tokens if prompt is None else prompt
        if computed is not None:
            out["num_computed_tokens"] = computed
    return out


def _tensor(shape: list[int], seed: float) -> dict[str, Any]:
    return {
        "type": "torch.Tensor",
        "dtype": "torch.bfloat16",
        "shape": shape,
        "Max": 1.5 + seed,
        "Min": -1.25 - seed,
        "Mean": 0.01 * seed,
        "Norm": 12.0 + seed,
        "requires_grad": False,
    }


def dump_json(
    tokens: int = 16, layers: int = 2, *, task: str = "statistics", seed: float = 0.0, vllm: bool = False
) -> dict[str, Any]:
    hidden = 64
    data: dict[str, Any] = {}
    for i in range(layers):
        names = (
            [
                "self_attn.qkv_proj.QKVParallelLinear",
                "self_attn.o_proj.RowParallelLinear",
                "mlp.gate_up_proj.MergedColumnParallelLinear",
                "mlp.down_proj.RowParallelLinear",
            ]
            if vllm
            else [
                "self_attn.q_proj.Linear",
                "self_attn.k_proj.Linear",
                "self_attn.v_proj.Linear",
                "self_attn.o_proj.Linear",
                "mlp.gate_proj.Linear",
                "mlp.up_proj.Linear",
                "mlp.down_proj.Linear",
            ]
        )
        for name in names:
            data[f"Module.model.layers.{i}.{name}.forward.0"] = {
                "input_args": [_tensor([tokens, hidden], seed)],
                "input_kwargs": {},
                "output": [_tensor([tokens, hidden], seed + i)],
            }
    return {"task": task, "level": "L0", "framework": "pytorch", "dump_data_dir": None, "data": data}


@dataclass
class RunTree:
    """A run folder under ``root``. ``recipe=True`` lays it out the way the public recipe does:
    rollout dumps under ``<gen>/<pid>/``, actor dumps in ``<act>/step{N}/rank{R}``, pid folders
    holding only the actor log, and no ``dump_path`` in the records."""

    root: Path
    run_id: str = "hybrid-20260101-000000-abcd"
    recipe: bool = False
    written: list[Path] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.root / self.run_id

    @property
    def rollout_root(self) -> Path:
        return self.root / "dump_generate" if self.recipe else self.run_dir / layout.ROLLOUT_DIR

    @property
    def actor_root(self) -> Path:
        return self.root / "dump_actor" if self.recipe else self.run_dir / layout.ACTOR_DIR

    def __post_init__(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rollout_root.mkdir(parents=True, exist_ok=True)
        self.actor_root.mkdir(parents=True, exist_ok=True)

    def _append(self, path: Path, rec: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as fh:
            fh.write(orjson.dumps(rec) + b"\n")

    def write_dump(
        self,
        folder: Path,
        *,
        tokens: int = 16,
        task: str = "statistics",
        vllm: bool = False,
        seed: float = 0.0,
    ) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "dump.json").write_text(
            json.dumps(dump_json(tokens, task=task, seed=seed, vllm=vllm), indent=1)
        )
        keys = list(dump_json(tokens, vllm=vllm)["data"])
        (folder / "stack.json").write_text(json.dumps({"0": [keys, ["File model.py, line 1, in forward"]]}))
        (folder / "construct.json").write_text(json.dumps(dict.fromkeys(keys)))
        if task == "tensor":
            tdir = folder / "dump_tensor_data"
            tdir.mkdir()
            for k in keys[:3]:
                (tdir / f"{k}.output.0.pt").write_bytes(os.urandom(256))
        self.written.append(folder)
        return folder

    def rollout_step(
        self,
        pid: int,
        rank: int,
        step: int,
        reqs: list[dict[str, Any]],
        *,
        phase: str = "prefill",
        attn_state: str | None = None,
        dumped: bool = True,
        dump: bool = True,
        captured: str | None = None,
        task: str = "statistics",
        rank_folder: str | None = None,
        step_folder: str | None = None,
        weight_version: int | None = None,
    ) -> Path | None:
        proc_dir = self.rollout_root / str(pid)
        rec: dict[str, Any] = {
            "source": "dispatch_logger",
            "timestamp": f"2026-01-01T00:00:{step % 60:02d}",
            "pid": pid,
            "rank": rank,
            "step": step,
            "phase": phase,
            "total_num_scheduled_tokens": sum(r["tokens"] for r in reqs),
            "requests": reqs,
        }
        if attn_state:
            rec["attn_state"] = attn_state
        if not dumped:
            rec["dumped"] = False
        if captured:
            rec["scoped_request_id"] = captured
        if weight_version is not None:
            rec["weight_version"] = weight_version
        if not self.recipe:
            rec["dump_path"] = layout.relative_to_run(proc_dir, self.run_dir)
            rec["schema_version"] = records.SCHEMA_VERSION
        records.DispatchRecord.model_validate(rec)  # the fixture speaks the hooks' contract
        self._append(proc_dir / records.DISPATCH_LOG, rec)
        if dumped and dump:
            folder = proc_dir / (step_folder or f"step{step}") / (rank_folder or f"rank{rank}")
            tokens = (
                next((r["tokens"] for r in reqs if r["request_id"] == captured), None) if captured else None
            )
            return self.write_dump(
                folder, tokens=tokens or reqs[0]["tokens"] if reqs else 1, task=task, vllm=True
            )
        return None

    def actor_step(
        self,
        pid: int,
        rank: int,
        step: int,
        request_ids: list[str],
        *,
        phase: str = "log_prob",
        backend: str | None = "fsdp",
        dump: bool = True,
        task: str = "statistics",
        rank_folder: str | None = None,
        ts: str | None = None,
        weight_version: int | None = None,
        unsynced_updates: int = 0,
        lanes: list[str] | None = None,
        **fields: Any,
    ) -> Path | None:
        """One training record; ``lanes``: per-request lanes (a dump per lane), ``fields``: more record
        fields as the hooks write them (``lanes_elsewhere``, ``trainer_weight_version``)."""
        proc_dir = self.actor_root / str(pid)
        rec: dict[str, Any] = {
            "source": "update_actor",
            "timestamp": ts or f"2026-01-01T00:01:{step % 60:02d}",
            "pid": pid,
            "rank": rank,
            "step": step,
            "request_ids": request_ids,
            "num_requests": len(request_ids),
            "phase": phase,
        }
        if backend:
            rec["backend"] = backend
        if weight_version is not None:
            rec["weight_version"] = weight_version
        if unsynced_updates:
            rec["unsynced_updates"] = unsynced_updates
        if lanes is not None:
            rec["lane_request_ids"] = lanes
        rec.update(fields)
        if not self.recipe:
            rec["dump_path"] = layout.relative_to_run(proc_dir, self.run_dir)
        records.UpdateActorRecord.model_validate(rec)
        self._append(proc_dir / records.UPDATE_ACTOR_LOG, rec)
        if dump and lanes:
            folder = proc_dir / f"step{step}" / (rank_folder or f"rank{rank}")
            for k in range(len(lanes)):
                self.write_dump(folder / records.lane_folder(k), task=task)
            return folder
        if dump:
            base = self.actor_root if self.recipe else proc_dir
            return self.write_dump(base / f"step{step}" / (rank_folder or f"rank{rank}"), task=task)
        return None

    def run_json(self, **fields: Any) -> Path:
        path = self.run_dir / layout.RUN_MANIFEST
        path.write_text(json.dumps({"run_id": self.run_id, **fields}))
        return path

    def roots_args(self) -> dict[str, Path]:
        return {"rollout_dir": self.rollout_root, "actor_dir": self.actor_root} if self.recipe else {}


def tree_digest(*tops: Path, dir_mtimes: bool = True) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``tops``: type, mode, size, content hash or link target. Never opens a
    non-regular file (a fifo would block)."""
    out: dict[str, tuple[Any, ...]] = {}
    for top in tops:
        if not os.path.lexists(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                st = p.lstat()
                if stat.S_ISLNK(st.st_mode):
                    out[str(p)] = ("link", os.readlink(p))
                elif stat.S_ISREG(st.st_mode):
                    out[str(p)] = (
                        "file",
                        st.st_mode,
                        st.st_size,
                        st.st_mtime_ns,
                        hashlib.sha256(p.read_bytes()).hexdigest(),
                    )
                else:
                    out[str(p)] = ("other", st.st_mode, st.st_mtime_ns if dir_mtimes else 0)
    return out
