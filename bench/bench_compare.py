"""Compare stage: ``compare_pairs`` (in-process msprobe, parallel workers) against the ``msprobe
compare`` CLI called once per pair in sequence, on real msprobe dumps made in this run.

    python -m bench.bench_compare [--pairs N] [--jobs J]     (from the repository root)

The dumps are the test fixture's (tests/postprocess/realdumps.py: a tiny Qwen2, FSDP1 training
side, vLLM stand-in inference side, statistics mode). ``--pairs`` repeats the run's real pairs
under distinct ids, so both sides compare N pairs. Both sides produce msprobe's CSV; the CSVs are
asserted equal. Ours also runs msprobe's first-diff analysis (a second msprobe pass per pair)
and our summary, so it does strictly more work than the baseline.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.support import realdumps
from bench.support.hardware import hardware
from verl_consistency.postprocess.compare.msprobe_compare import compare_pairs

MSPROBE_CLI = [sys.executable, "-c", "import sys; from msprobe.msprobe import main; sys.exit(main())"]
"""The ``msprobe`` console script, run with this interpreter (the one that has mindstudio-probe)."""


def read_csv(path: Path) -> list[list[str]]:
    import pandas as pd

    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    return df.drop(columns=[c for c in df.columns if "Stack" in c]).values.tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8, help="pairs to compare (the real pairs, repeated)")
    ap.add_argument("--jobs", type=int, default=2, help="compare_pairs worker processes")
    args = ap.parse_args()
    print(f"hardware: {hardware()}")

    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.monotonic()
        runs = realdumps.build_runs(tmp / "dumps")
        print(f"made real msprobe dumps in {time.monotonic() - t0:.1f} s (not timed below)")
        spec = runs.stats
        real = realdumps.known_pairs(spec)
        pairs = [
            real[i % len(real)].model_copy(update={"pair_id": f"{real[i % len(real)].pair_id}.x{i}"})
            for i in range(args.pairs)
        ]

        t0 = time.monotonic()
        for i, p in enumerate(pairs):
            out = tmp / "cli" / f"{i}"
            proc = subprocess.run(
                [
                    *MSPROBE_CLI,
                    "compare",
                    "-tp",
                    str(spec.run_dir / p.actor.dir / "dump.json"),
                    "-gp",
                    str(spec.run_dir / p.rollout.dir / "dump.json"),
                    "-o",
                    str(out),
                    "--consistent_check",
                    "--backend",
                    p.backend,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise SystemExit(f"msprobe compare failed for {p.pair_id}:\n{proc.stderr[-3000:]}")
        t_cli = time.monotonic() - t0

        t0 = time.monotonic()
        res = compare_pairs(spec.run_dir, pairs, tmp / "ours", jobs=args.jobs)
        t_ours = time.monotonic() - t0

        for i, (p, c) in enumerate(zip(pairs, res, strict=True)):
            assert c.status == "ok", c.error
            assert c.csv is not None
            (cli_csv,) = (tmp / "cli" / f"{i}").glob("compare_result_*.csv")
            if read_csv(cli_csv) != read_csv(tmp / "ours" / c.csv):
                raise SystemExit(f"{p.pair_id}: our CSV differs from the msprobe CLI's")
            assert c.first_divergence == realdumps.CHANGED_MODULE, c.first_divergence

    n = len(pairs)
    print(f"pairs: {n} (statistics mode, {len(real)} real pairs repeated); CSVs identical to the CLI's")
    print(f"msprobe CLI, one call per pair, sequential: {t_cli:.2f} s ({t_cli / n:.2f} s/pair)")
    print(
        f"compare_pairs, in-process msprobe, {args.jobs} workers (+ -da pass + summary): "
        f"{t_ours:.2f} s ({t_ours / n:.2f} s/pair)"
    )
    print(f"RATIO compare speed-up vs sequential CLI: {t_cli / t_ours:.2f}x (goal >= 2x)")


if __name__ == "__main__":
    main()
