"""Copy a postprocessed GPU run folder to DEST, trimmed to what CI needs to pair and compare it again.

usage: python3 trim_run.py RUN_DIR DEST [--max-mib 8] [--min-pairs 8] [--max-pairs N] [--per-step N]

Why: a run dumps every captured micro batch on the training side (all of them with
``--capture fraction:1``) and every captured prefill on the vLLM side, but only the steps that
pair are ever compared, and a pair's files grow with its prompt (~16 KB a token for both sides of
a 4-layer, 512-wide model in tensor mode). Every record (JSONL) and the run's config are kept;
then, until the copy fits ``--max-mib`` (and holds at most ``--max-pairs`` pairs):

1. the tensor files of steps outside a pair are dropped;
2. those steps' folders go entirely (pairing then reports them ``dump_missing`` instead of their
   first reason; the pairs stay the same);
3. the pairs with the longest prompts go, step folders and all (they too become
   ``dump_missing``), keeping at least ``--min-pairs``.

``--per-step N`` first keeps only the N shortest prompts of each training step (the step the report
groups a pair by), so that a trim of a long run keeps every step at the fewest pairs: each kept pair
costs CI ~1.4 s of msprobe compare.

Sizes are summed once from the file list and the copy is made once (the first version copied the
whole run again for every pair it dropped: 400 s for 128 pairs on the device). The postprocess
outputs are not copied: CI makes them. Prints what was kept; exit 1 if the copy is still over
``--max-mib``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from verl_consistency.contracts import layout
from verl_consistency.postprocess.output.bundle_manifest import RESULTS_DIR
from verl_consistency.postprocess.output.per_step import training_version
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.pair import pair_run
from verl_consistency.postprocess.pairing.pair_types import Pair

TENSOR_SUFFIXES = (".pt", ".npy")


@dataclass(frozen=True)
class RunFile:
    rel: Path
    size: int
    owners: frozenset[str]
    """The pairs whose step folders hold this file (empty: a record, the config, or an unpaired step)."""
    in_step: bool


def _in_step(rel: Path) -> bool:
    return any(p.startswith("step") and p[4:].isdigit() for p in rel.parts[:-1])


def _files(run: Path, dirs: dict[str, set[Path]]) -> list[RunFile]:
    owner_of: dict[Path, set[str]] = {}
    for pair_id, ds in dirs.items():
        for d in ds:
            owner_of.setdefault(d, set()).add(pair_id)
    out = []
    for src in sorted(run.rglob("*")):
        rel = src.relative_to(run)
        if rel.parts[0] in (RESULTS_DIR, layout.BUNDLES_DIR) or not src.is_file():
            continue
        owners = set().union(*(owner_of.get(p, set()) for p in src.parents))
        out.append(RunFile(rel, src.stat().st_size, frozenset(owners), _in_step(rel)))
    return out


def _kept(f: RunFile, kept: set[str], drop_steps: bool) -> bool:
    if f.owners:
        return bool(f.owners & kept)
    return not (f.rel.suffix in TENSOR_SUFFIXES or (drop_steps and f.in_step))


def _plan(
    files: list[RunFile], order: list[str], limit: float, lo: int, hi: int
) -> tuple[str, list[str], bool]:
    """Which level and which pairs (the shortest prompts first) fit ``limit`` bytes."""

    def size(kept: set[str], drop_steps: bool) -> int:
        return sum(f.size for f in files if _kept(f, kept, drop_steps))

    every = set(order[:hi])
    if len(order) <= hi and size(every, False) <= limit:
        return "tensors of unpaired steps", order, False
    if len(order) <= hi and size(every, True) <= limit:
        return "unpaired step folders", order, True
    base = size(set(), True)
    own: dict[str, int] = {p: 0 for p in order}
    rank = {p: i for i, p in enumerate(order)}
    for f in files:
        if f.owners:
            first = min(f.owners, key=rank.__getitem__)  # a shared folder counts once, for its shortest pair
            own[first] += f.size
    kept: list[str] = []
    total = base
    for p in order:
        if len(kept) >= hi or (len(kept) >= lo and total + own[p] > limit):
            break
        kept.append(p)
        total += own[p]
    return "pairs with the longest prompts", kept, True


def per_step(pairs: list[Pair], n: int) -> list[Pair]:
    """The first ``n`` of each training step's pairs, in the given order (no known step: one group)."""
    seen: dict[int | None, int] = {}
    out = []
    for p in pairs:
        step = training_version(p)
        seen[step] = seen.get(step, 0) + 1
        if seen[step] <= n:
            out.append(p)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--max-mib", type=float, default=8.0)
    ap.add_argument("--min-pairs", type=int, default=8)
    ap.add_argument("--max-pairs", type=int, default=10**9)
    ap.add_argument(
        "--per-step", type=int, default=None, help="at most this many pairs of each training step"
    )
    a = ap.parse_args(argv)
    run = a.run_dir.resolve()
    pairs = sorted(pair_run(discover.Roots.open(run)).pairs, key=lambda p: (p.prompt_tokens, p.pair_id))
    dirs = {p.pair_id: {run / p.rollout.dir, run / p.actor.dir} for p in pairs}
    order = [p.pair_id for p in (per_step(pairs, a.per_step) if a.per_step else pairs)]
    files = _files(run, dirs)
    level, kept, drop_steps = _plan(files, order, a.max_mib * 2**20, a.min_pairs, a.max_pairs)
    keep = set(kept)
    shutil.rmtree(a.dest, ignore_errors=True)
    size = dropped = 0
    for f in files:
        if not _kept(f, keep, drop_steps):
            dropped += f.size
            continue
        dst = a.dest / f.rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(run / f.rel, dst)
        size += f.size
    print(
        f"trimmed {run.name}: {len(pairs)} pairs on the device, {len(kept)} kept (level: {level}), "
        f"{size / 2**20:.2f} MiB kept, {dropped / 2**20:.2f} MiB left out; kept: {' '.join(kept)}"
    )
    return 0 if size <= a.max_mib * 2**20 else 1


if __name__ == "__main__":
    sys.exit(main())
