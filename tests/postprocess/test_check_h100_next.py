"""``verl-consistency check --device cuda`` on an H100, on the model of the async ride-along runs,
its run folder re-paired on CPU.

``fixtures/h100-next-check.tar.xz`` is the run folder ``CHECK_MODEL=assets PROMPTS=16
bench/gpu/verl_gpu.sh check`` brought back from one NVIDIA H100 80GB on 2026-12-06 (main 493b466,
issue 41; the run id keeps the script's ``h200-next-`` prefix; the device's output:
``bench/results/gpu-2026-12-06b/check/``): ``verl-consistency check --model <the random bf16 Qwen2
of 4 layers and width 512 that the ride-along runs train> --device cuda --dtype bfloat16
--num-prompts 16`` on the ``next`` set (vLLM 0.23.0, verl 0.9.1's FSDP engine with SDPA), msprobe
statistics L0, every request dumped. The check took 125 s on the device (vLLM 56 s, FSDP 26 s,
postprocess 27 s) and ended in a verified bundle with the verdicts asserted here. The folder is
6.7 MB as it is and 0.07 MB as xz.

What it pins down on this model, at its step-0 weights (``test_async_h100_next.py`` shows what
a weight-sync fault does to it during RL, which this check cannot see):
- the **engine gap** (vLLM alone vs FSDP): 16 of 16 prompts paired; every layer within 0.002-0.004
  relative error; 14 ``healthy`` and 2 ``suspicious``. The two are suspicious only at the head: the
  top-1 token of the next-token distribution differs between the engines (total variation of the
  top-20 ~3e-5: a near-tie of a random model's flat distribution), while their layers agree as
  closely as the others';
- the **batch variance** (vLLM batched vs vLLM alone): 16 of 16 ``healthy``, and bit for bit the
  same (relative error exactly 0) whether a prompt was packed with 14 others or scheduled alone.
  On Qwen2-0.5B's shape on an H200 packing moved the statistics more than the change of engine
  (``test_check_h200_next.py``); on this small model on an H100 it moves nothing.
When the verdict thresholds change, the recorded verdicts below change with them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.subprocess_run import bundle_through_cli
from tests.postprocess.gpu_runs import unpack
from verl_consistency.postprocess.compare.verdict import HEALTHY_REL_ERR

pytestmark = pytest.mark.msprobe

FIXTURE = Path(__file__).parent / "fixtures" / "h100-next-check.tar.xz"
RUN_ID = "h200-next-check"
LAYERS = 4
PROMPTS = 16
SUSPICIOUS = 2
"""The device's verdicts: 14 healthy + 2 suspicious (its summary.json)."""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(FIXTURE.name, RUN_ID, tmp_path_factory.mktemp("h100-check"))


@pytest.fixture(scope="module")
def manifest(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = bundle_through_cli(run_dir, tmp_path_factory.mktemp("h100-check-bundle"))
    m = out.manifest()
    m["_report"] = (out.extracted / "results" / "report.html").read_text()
    return m


def test_fixture_is_a_cuda_bf16_check_of_the_ride_along_model(run_dir: Path) -> None:
    assert FIXTURE.stat().st_size <= 256 * 2**10, "a committed fixture stays small"
    check = json.loads((run_dir / "check.json").read_text())
    assert (check["kind"], check["device"], check["dtype"], check["engine"]) == (
        "check",
        "cuda",
        "bfloat16",
        "fsdp",
    )
    assert (check["micro_batch"], check["top_k"], len(check["prompts"])) == (1, 20, PROMPTS)
    assert check["model"] == check["training_model"], "both engines load the same folder"
    train = json.loads((run_dir / "check" / "train-out.json").read_text())
    assert (train["device"], train["dtype"], train["micro_batches"]) == ("cuda", "bfloat16", PROMPTS)
    assert train["log_probs_finite"] is True
    layers = {
        r.split(".layers.")[1].split(".")[0]
        for f in (run_dir / "actor").rglob("dump.json")
        for r in json.loads(f.read_text())["data"]
        if ".layers." in r
    }
    assert layers == {str(i) for i in range(LAYERS)}


def test_engine_gap_healthy_in_every_layer_two_heads_differ_at_top_1(manifest: dict[str, Any]) -> None:
    p = manifest["pairing"]
    assert (p["pairs"], p["dispatch_records"], p["actor_records"]) == (PROMPTS, 19, PROMPTS)
    assert p["unpaired_counts"]["request"] == {
        "decode_only": 0,
        "no_rollout_prefill": 0,
        "no_training_micro_batch": PROMPTS + 1,  # the batched pass, and the engine's warm-up
    }
    cs = manifest["comparisons"]
    assert Counter(c["verdict"] for c in cs) == {"healthy": PROMPTS - SUSPICIOUS, "suspicious": SUSPICIOUS}
    for c in cs:
        assert (c["status"], c["task"], c["backend"]) == ("ok", "statistics", "fsdp")
        assert c["first_divergence"] is None
        assert (c["rows_matched"], c["rows_unmatched"], c["rows_structural"]) == (114, 143, 24)
        assert 0.0020 < c["max_rel_err"] < 0.0040, "every pair's layers: a few bf16 roundings"
        assert [x["label"] for x in c["layer_profile"]] == ["embed", *(str(i) for i in range(LAYERS)), "head"]
        assert max(x["rel_err"] for x in c["layer_profile"]) <= HEALTHY_REL_ERR
        out = c["output"]
        assert out["abs_diff"] < 0.016, "|delta log p| of the next token: a bf16 ulp or two"
        assert out["topk_tv"] < 1e-4
        assert out["topk_max_abs_diff"] < 0.016
        if c["verdict"] == "suspicious":
            assert (out["status"], out["top1_same"]) == ("warn", False), "only the head's top-1 differs"
            assert "top-1 differs" in out["note"]
        else:
            assert (out["status"], out["top1_same"]) == ("ok", True)


def test_batch_variance_is_zero_on_this_model(manifest: dict[str, Any]) -> None:
    bv = manifest["batch_variance"]
    assert manifest["check_manifest"] == "check.json"
    assert len(bv) == PROMPTS
    assert Counter(b["verdict"] for b in bv) == {"healthy": PROMPTS}
    batched_steps = Counter(b["batched"]["step"] for b in bv)
    assert batched_steps == {1: 1, 2: PROMPTS - 1}, "prompt 0 alone in step 1, the rest packed"
    assert len({b["alone"]["step"] for b in bv}) == PROMPTS, "the alone pass: one step each"
    for b in bv:
        cmp = b["comparison"]
        assert (cmp["backend"], cmp["status"]) == ("vllm", "ok")
        assert (cmp["rows_matched"], cmp["rows_unmatched"]) == (201, 0), "the same engine"
        assert b["max_rel_err"] == 0.0, "packed or alone: bit for bit"
    gap = min(c["max_rel_err"] for c in manifest["comparisons"])
    assert gap > 0.0, "the engine gap is not zero where packing is"
    assert "Engine gap and batch variance" in manifest["_report"]
