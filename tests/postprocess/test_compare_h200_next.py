"""verl 0.9.1's own ``main_ppo`` on an H200, run by ``verl-consistency run``, re-paired on CPU.

The run folders in ``fixtures/h200-next/`` are what ``bench/gpu/verl_gpu.sh`` brought back from the
device (issue 25): ``VERL_CONSISTENCY_PIN_SET=next verl-consistency run {hybrid,colocate-async}
--device cuda --phase {log_prob,update_actor} --capture fraction:1`` (verl's V1 trainer, the vLLM
0.23.0 rollout with FlashAttention 3, the FSDP actor with SDPA, GRPO, 8 steps, a random bf16 Qwen2
of 4 layers and width 512), trimmed by ``bench/gpu/trim_run.py`` to the pairs with the shortest
prompts (the others' step folders are gone, hence ``dump_missing``). Each folder goes through the
real CLI: ``postprocess`` (pair, compare with msprobe, report, bundle), ``verify``, ``extract``.

What this pins down: the pairs and why the rest did not pair, the bundle's file layout, and the
verdicts of real bf16 kernels. Every pair is ``healthy`` under the tensor-mode thresholds of
``postprocess/compare/verdict.py`` (relative L2 error 0.0108-0.0116 <= 0.045, the bound cosine 0.999
allows; cosine >= 0.99993), which these runs set: under the statistics bound (0.01) all 71 pairs
of the four runs were ``suspicious``. See "Measured on real kernels" in
``postprocess/README-compare.md``. When the tensor-mode thresholds change, the recorded verdicts
below must change with them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.subprocess_run import bundle_through_cli

pytestmark = pytest.mark.msprobe

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "h200-next"


@dataclass(frozen=True)
class Expected:
    mode: str
    phase: str
    pairs: int
    scoped: int
    """Pairs cut out of a multi-request prefill step (request-scoped tensor dumps)."""
    dispatch_records: int
    unpaired: dict[str, dict[str, int]]
    verdicts: dict[str, int]
    unmatched_rows: int
    """msprobe rows with no counterpart: vLLM's inner ``attn.Attention`` (4), and in update_actor
    the training side's extra forward rows."""


def _unpaired(dump_missing: int, multi: int, decode_only: int) -> dict[str, dict[str, int]]:
    return {
        "actor_step": {"dump_missing": dump_missing},
        "request": {
            "decode_only": 0,
            "dump_missing": dump_missing,
            "multi_request_step": multi,
            "no_rollout_prefill": 0,
        },
        "rollout_step": {"decode_only": decode_only, "dump_missing": dump_missing},
    }


RUNS = {
    "h200-next-hybrid-log-prob": Expected(
        "hybrid", "log_prob", 4, 1, 144, _unpaired(12, 112, 128), {"healthy": 4}, 8
    ),
    "h200-next-hybrid-update-actor": Expected(
        "hybrid", "update_actor", 5, 3, 144, _unpaired(13, 110, 126), {"healthy": 5}, 20
    ),
    "h200-next-colocate-async-log-prob": Expected(
        "colocate-async", "log_prob", 5, 4, 162, _unpaired(14, 109, 143), {"healthy": 5}, 8
    ),
    "h200-next-colocate-async-update-actor": Expected(
        "colocate-async", "update_actor", 3, 1, 162, _unpaired(15, 110, 144), {"healthy": 3}, 20
    ),
}

LAYERS = 4
MODULES = ("mlp.Qwen2MLP", "self_attn.Qwen2Attention")
BUNDLE_SHAPE = sorted(
    [
        "manifest.schema.json",
        "run.json",
        "rollout/<pid>/dispatch_log.jsonl",
        "actor/<pid>/update_actor_log.jsonl",
        "results/report.html",
        "results/summary.md",
        "results/summary.json",
        "results/token/<pid>-next_token.jsonl",
        *(f"results/compare/<pair>/{f}" for f in ("compare.log", "compare_result.csv", "comparison.json")),
        *(f"results/compare/<pair>/{f}" for f in ("first_diff.json", "rows.csv")),
        *(
            f"{side}/<pid>/step<n>/rank0/{f}"
            for side in ("rollout", "actor")
            for f in ("construct.json", "dump.json")
        ),
        *(f"{side}/<pid>/step<n>/rank0/stack.json" for side in ("rollout", "actor")),
        *(
            f"actor/<pid>/step<n>/rank0/dump_tensor_data/Module._fsdp_wrapped_module.model.layers.{i}."
            f"_fsdp_wrapped_module.{m}.forward.0.output.0.pt"
            for i in range(LAYERS)
            for m in MODULES
        ),
        *(
            f"rollout/<pid>/step<n>/rank0/dump_tensor_data/Module.model.layers.{i}.{m}.forward.0.output.0.pt"
            for i in range(LAYERS)
            for m in (*MODULES, "self_attn.attn.Attention")
        ),
    ]
)


# update_actor: the training side also dumps a second call of every attention module
# (``Qwen2Attention.forward.1``, not the MLP's; most likely the recompute of verl's default
# gradient checkpointing in the backward). Pairing and compare use ``forward.0``, the forward
# that made the loss; the extra rows are among the unmatched ones.
RECOMPUTED = sorted(
    f"actor/<pid>/step<n>/rank0/dump_tensor_data/Module._fsdp_wrapped_module.model.layers.{i}."
    "_fsdp_wrapped_module.self_attn.Qwen2Attention.forward.1.output.0.pt"
    for i in range(LAYERS)
)


def _shape(path: str) -> str:
    path = re.sub(r"[0-9a-f]{32}\.r0\.a0", "<pair>", path)
    path = re.sub(r"^(rollout|actor)/\d+/", r"\1/<pid>/", path)
    path = re.sub(r"^results/token/\d+-", "results/token/<pid>-", path)
    return re.sub(r"/step\d+/", "/step<n>/", path)


@pytest.fixture(scope="module", params=sorted(RUNS))
def bundle(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Any]]:
    name: str = request.param
    tmp = tmp_path_factory.mktemp(name)
    return name, bundle_through_cli(FIXTURES / name, tmp).manifest()


def test_fixtures_are_the_runs_of_verls_own_driver() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == sorted(RUNS)
    for name, exp in RUNS.items():
        run = json.loads((FIXTURES / name / "run.json").read_text())
        text = json.dumps(run)
        assert "verl.trainer.main_ppo" in text, name
        assert f"trainer.v1.trainer_mode={exp.mode.replace('-', '_').replace('hybrid', 'sync')}" in text
        assert f"DUMP_PHASE={exp.phase}" in text or f'"{exp.phase}"' in text, name
        size = sum(f.stat().st_size for f in (FIXTURES / name).rglob("*") if f.is_file())
        assert size <= 8 * 2**20, f"{name}: {size} bytes, over the 8 MiB a committed run folder may take"


def test_at_least_eight_pairs_per_mode() -> None:
    per_mode = Counter[str]()
    for exp in RUNS.values():
        per_mode[exp.mode] += exp.pairs
    assert per_mode == {"hybrid": 9, "colocate-async": 8}
    assert min(per_mode.values()) >= 8


def test_pairs_and_unpaired_reasons(bundle: tuple[str, dict[str, Any]]) -> None:
    name, m = bundle
    exp = RUNS[name]
    assert m["pairing"]["pairs"] == exp.pairs
    assert m["pairing"]["dispatch_records"] == exp.dispatch_records
    assert m["pairing"]["actor_records"] == 128, "8 steps of 8 prompts x n=2, one micro batch each"
    assert m["pairing"]["requests_seen"] == 128
    assert m["pairing"]["unpaired_counts"] == exp.unpaired
    assert sum(p["scoped"] for p in m["pairs"]) == exp.scoped
    assert {p["backend"] for p in m["pairs"]} == {"fsdp"}


def test_verdicts_of_real_bf16_kernels(bundle: tuple[str, dict[str, Any]]) -> None:
    """FlashAttention 3 (vLLM) against SDPA (FSDP actor), both bf16: ~1 % relative L2 error."""
    name, m = bundle
    exp = RUNS[name]
    cs = m["comparisons"]
    assert len(cs) == exp.pairs
    assert Counter(c["verdict"] for c in cs) == exp.verdicts
    for c in cs:
        assert c["status"] == "ok", c["error"]
        assert c["task"] == "tensor"
        assert c["first_divergence"] is None, "no row diverged"
        assert (c["rows_matched"], c["rows_unmatched"], c["rows_structural"]) == (
            2 * LAYERS,
            exp.unmatched_rows,
            0,
        )
        assert 0.0100 < c["max_rel_err"] < 0.0120
        assert 0.99993 <= c["min_cosine"] < 0.99996
        assert c["max_abs_err"] < 0.005
        profile = [p["rel_err"] for p in c["layer_profile"]]
        assert [p["label"] for p in c["layer_profile"]] == [str(i) for i in range(LAYERS)]
        assert 0.006 < profile[0] < 0.0075, "layer 0 already differs: different attention kernels"
        assert profile == sorted(profile), "the error grows with depth"
        out = c["output"]
        assert out["status"] == "ok"
        assert out["abs_diff"] < 0.006, "|delta log p| of the next token"


def test_bundle_shape(bundle: tuple[str, dict[str, Any]]) -> None:
    name, m = bundle
    paths = [f["path"] for f in m["files"]]
    exp = RUNS[name]
    recomputed = exp.phase == "update_actor"
    assert sorted({_shape(p) for p in paths}) == sorted(BUNDLE_SHAPE + (RECOMPUTED if recomputed else []))
    tensors = 2 * LAYERS + (LAYERS if recomputed else 0) + 3 * LAYERS
    per_pair = 2 * 3 + tensors + 5  # 3 JSON a side, the tensors, 5 compare outputs
    assert len(paths) == exp.pairs * per_pair + 8


def _trim(src: Path, dest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """bench/gpu/trim_run.py SRC DEST ARGS, as the run script calls it."""
    return subprocess.run(
        [sys.executable, str(REPO / "bench/gpu/trim_run.py"), str(src), str(dest), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=dest.parent,
    )


def test_trim_keeps_the_shortest_prompt_pairs(tmp_path: Path) -> None:
    """bench/gpu/trim_run.py, as the run script calls it: under the size bound, the longest-prompt
    pairs go first (their step folders too, so they re-pair as ``dump_missing``)."""
    from verl_consistency.postprocess.pairing import discover
    from verl_consistency.postprocess.pairing.pair import pair_run

    src = FIXTURES / "h200-next-hybrid-update-actor"
    before = sorted(pair_run(discover.Roots.open(src)).pairs, key=lambda p: (p.prompt_tokens, p.pair_id))
    dest = tmp_path / "trimmed"
    proc = _trim(src, dest, "--max-mib", "3")
    assert proc.returncode == 1, "3 MiB cannot hold the 8 pairs --min-pairs asks for by default"
    proc = _trim(src, dest, "--max-mib", "3", "--min-pairs", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sum(f.stat().st_size for f in dest.rglob("*") if f.is_file()) <= 3 * 2**20
    after = pair_run(discover.Roots.open(dest))
    kept = [p.pair_id for p in after.pairs]
    assert 0 < len(kept) < len(before)
    assert sorted(kept) == sorted(p.pair_id for p in before[: len(kept)]), "the shortest prompts stay"
    gone = len(before) - len(kept)
    assert (
        after.counts["actor_step"]["dump_missing"]
        == RUNS[src.name].unpaired["actor_step"]["dump_missing"] + gone
    )
    assert (dest / "run.json").read_bytes() == (src / "run.json").read_bytes()
    # --max-pairs bounds the count under a size that would hold them all (the ride-along folders)
    capped = tmp_path / "capped"
    proc = _trim(src, capped, "--max-mib", "64", "--min-pairs", "1", "--max-pairs", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    two = sorted(p.pair_id for p in pair_run(discover.Roots.open(capped)).pairs)
    assert two == sorted(p.pair_id for p in before[:2])
