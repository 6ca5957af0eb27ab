"""The dump-root layout: decided here, by the entrypoints, and read by everyone else.

One collection run owns one folder on the dump volume::

    <dump_root>/<run_id>/
        run.json                          run manifest (entrypoints)
        config/msprobe_rollout.json       inference-side msprobe config (vLLM additional_config)
        config/msprobe_actor.json         training-side msprobe config ($VERL_CONSISTENCY_ACTOR_CONFIG)
        config/capture-prompts.txt        the --capture prompts:FILE list, when given (every worker reads it)
        data/train.parquet                the generated prompt set
        data/reward.py                    its rule-based reward (verl custom_reward_function)
        rollout/<pid>/dispatch_log.jsonl  one per vLLM worker process
        rollout/<pid>/step{N}/rank{R}/{dump,stack,construct}.json
        actor/<pid>/update_actor_log.jsonl   one per trainer process
        actor/<pid>/step{N}/rank{R}/{dump,stack,construct}.json
    <dump_root>/bundles/bundle-<run_id>.tar.zst   written by the postprocess

Both sides dump under a per-pid folder: msprobe numbers steps per process, so a restarted
worker would otherwise overwrite ``step0`` of its predecessor. The log records carry the
``dump_path`` they were written with (see ``verl_consistency.contracts.records``), relative to the
run folder, so the postprocess never has to guess where a step's dump lies.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DUMP_ROOT = Path("/dump")
"""Where the k8s manifests mount the shared volume, and the image's default."""


RUN_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")

RUN_MANIFEST = "run.json"
ROLLOUT_CONFIG = "config/msprobe_rollout.json"
ACTOR_CONFIG = "config/msprobe_actor.json"
CAPTURE_PROMPTS = "config/capture-prompts.txt"
"""Run-relative copy of the ``--capture prompts:FILE`` list: every Ray worker reads it from the run folder."""
TRAIN_DATA = "data/train.parquet"
REWARD_FN = "data/reward.py"
ROLLOUT_DIR = "rollout"
ACTOR_DIR = "actor"
BUNDLES_DIR = "bundles"


def bundle_name(run_id: str) -> str:
    """The bundle's file name under ``bundles/`` (what ``make download-bundle RUN=`` fetches)."""
    return f"bundle-{run_id}.tar.zst"


def new_run_id(mode: str, now: float | None = None) -> str:
    """``<mode>-<UTC yyyymmdd-HHMMSS>-<4 hex>``: sortable, unique, and safe as a k8s label."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    return f"{mode}-{stamp}-{secrets.token_hex(2)}"


def check_run_id(run_id: str) -> str:
    if not RUN_ID_RE.match(run_id):
        raise ValueError(
            f"run id {run_id!r} must match {RUN_ID_RE.pattern}: lower-case letters, digits, '.', '_', '-'"
        )
    return run_id


@dataclass(frozen=True)
class RunLayout:
    dump_root: Path
    run_id: str

    def __post_init__(self) -> None:
        check_run_id(self.run_id)

    @classmethod
    def from_run_dir(cls, run_dir: str | os.PathLike[str]) -> RunLayout:
        path = Path(run_dir)
        return cls(path.parent, path.name)

    @property
    def run_dir(self) -> Path:
        return self.dump_root / self.run_id

    @property
    def run_manifest(self) -> Path:
        return self.run_dir / RUN_MANIFEST

    @property
    def rollout_config(self) -> Path:
        return self.run_dir / ROLLOUT_CONFIG

    @property
    def actor_config(self) -> Path:
        return self.run_dir / ACTOR_CONFIG

    @property
    def train_data(self) -> Path:
        return self.run_dir / TRAIN_DATA

    @property
    def reward_fn(self) -> Path:
        return self.run_dir / REWARD_FN

    @property
    def rollout_dir(self) -> Path:
        return self.run_dir / ROLLOUT_DIR

    @property
    def actor_dir(self) -> Path:
        return self.run_dir / ACTOR_DIR

    @property
    def bundles_dir(self) -> Path:
        return self.dump_root / BUNDLES_DIR

    @property
    def bundle(self) -> Path:
        return self.bundles_dir / bundle_name(self.run_id)


def process_dump_dir(side_dir: str | os.PathLike[str], pid: int | None = None) -> Path:
    """The per-process msprobe dump_path under ``rollout/`` or ``actor/``."""
    return Path(side_dir) / str(os.getpid() if pid is None else pid)


def relative_to_run(path: str | os.PathLike[str], run_dir: str | os.PathLike[str] | None) -> str:
    """What the hooks store in a record's ``dump_path``: relative to the run folder when inside it.

    A path outside the run folder (a user's own msprobe config pointing elsewhere) is kept
    absolute, and the postprocess reports it rather than guessing.
    """
    p = Path(path)
    if run_dir is not None:
        try:
            return p.resolve().relative_to(Path(run_dir).resolve()).as_posix()
        except ValueError:
            pass
    return p.as_posix()
