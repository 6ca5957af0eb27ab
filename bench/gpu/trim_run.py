"""Copy a postprocessed GPU run folder to DEST, trimmed to what CI needs to pair and compare it again.

usage: python3 trim_run.py RUN_DIR DEST [--max-mib 8] [--min-pairs 8]

Why: a tensor-mode run dumps every captured micro batch on the training side (all of them with
``--capture fraction:1``) and every captured prefill on the vLLM side, but only the steps that
pair are ever compared, and a pair's tensors grow with its prompt (~16 KB a token for both sides
of a 4-layer, 512-wide model). Every record (JSONL) and the run's config are kept; then, until
the copy fits ``--max-mib``:

1. the tensor files of steps outside a pair are dropped;
2. those steps' folders go entirely (pairing then reports them ``dump_missing`` instead of their
   first reason; the pairs stay the same);
3. the pairs with the longest prompts go, step folders and all (they too become
   ``dump_missing``), keeping at least ``--min-pairs``.

The postprocess outputs are not copied: CI makes them. Prints what was kept; exit 1 if the copy
is still over ``--max-mib``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from verl_consistency.contracts import layout
from verl_consistency.postprocess.output.bundle_manifest import RESULTS_DIR
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.pair import pair_run

TENSOR_SUFFIXES = (".pt", ".npy")


def _in_step(rel: Path) -> bool:
    return any(p.startswith("step") and p[4:].isdigit() for p in rel.parts[:-1])


def _copy(run: Path, dest: Path, keep: set[Path], drop_steps: bool, drop: set[Path]) -> int:
    """Copy ``run`` to ``dest``; returns the bytes left out."""
    shutil.rmtree(dest, ignore_errors=True)
    dropped = 0
    for src in sorted(run.rglob("*")):
        rel = src.relative_to(run)
        if rel.parts[0] in (RESULTS_DIR, layout.BUNDLES_DIR) or not src.is_file():
            continue
        in_pair = any(k in src.parents for k in keep)
        gone = any(d in src.parents for d in drop)
        if gone or (not in_pair and (src.suffix in TENSOR_SUFFIXES or (drop_steps and _in_step(rel)))):
            dropped += src.stat().st_size
            continue
        dst = dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    return dropped


def _size(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--max-mib", type=float, default=8.0)
    ap.add_argument("--min-pairs", type=int, default=8)
    a = ap.parse_args(argv)
    run = a.run_dir.resolve()
    limit = a.max_mib * 2**20
    pairs = sorted(pair_run(discover.Roots.open(run)).pairs, key=lambda p: (p.prompt_tokens, p.pair_id))
    dirs = {p.pair_id: {run / p.rollout.dir, run / p.actor.dir} for p in pairs}
    kept = [p.pair_id for p in pairs]
    level = "tensors of unpaired steps"
    dropped = _copy(run, a.dest, set().union(*dirs.values()), False, set())
    if _size(a.dest) > limit:
        level = "unpaired step folders"
        dropped = _copy(run, a.dest, set().union(*dirs.values()), True, set())
    while _size(a.dest) > limit and len(kept) > a.min_pairs:
        level = "pairs with the longest prompts"
        kept.pop()
        drop = set().union(*(dirs[k] for k in dirs if k not in kept))
        shutil.rmtree(a.dest)
        dropped = _copy(run, a.dest, set().union(*(dirs[k] for k in kept)), True, drop)
    size = _size(a.dest)
    print(
        f"trimmed {run.name}: {len(pairs)} pairs on the device, {len(kept)} kept (level: {level}), "
        f"{size / 2**20:.2f} MiB kept, {dropped / 2**20:.2f} MiB left out; kept: {' '.join(kept)}"
    )
    return 0 if size <= limit else 1


if __name__ == "__main__":
    sys.exit(main())
