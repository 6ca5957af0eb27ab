"""``bench/gpu/fsdp_cost.py`` (issue 21's training cost): its checks must catch a missing or wrong lane.

The bench runs once on the device, by hand, so what it checks is tested here: the request set,
the argument checks, and the per-pass dump check (every request in exactly one dump holding its
own rows) against dumps laid out as the training hook lays them out, written with the real
record model. The last test runs the whole bench on CPU in the demo venv (skipped without
``$VERL_CONSISTENCY_DEMO_VENV``): verl's real FSDP engine, real msprobe, micro batches 1, 4 and 8;
dumps change no log-prob at the same micro batch (exactly), other micro batches move them by fp32
rounding at most (:data:`ACROSS_MICRO_BATCHES`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.gpu import fsdp_cost, fsdp_cost_checks
from verl_consistency.contracts import layout, records


def test_requests_are_fixed_spread_and_uniquely_named():
    a = fsdp_cost.make_requests(16, 8, 64, 512, seed=3)
    assert a == fsdp_cost.make_requests(16, 8, 64, 512, seed=3)
    lengths = sorted(len(r["prompt_ids"]) for r in a)
    assert lengths[0] == 8
    assert lengths[-1] == 64
    assert len(set(lengths)) == 16
    assert len({r["request_id"] for r in a}) == 16
    assert all(len(r["response_ids"]) == 1 and min(r["prompt_ids"]) > 0 for r in a)
    assert a != fsdp_cost.make_requests(16, 8, 64, 512, seed=4)


@pytest.mark.parametrize(
    "argv",
    [
        ["--requests", "17", "--micro-batches", "1,8"],  # verl asserts divisibility
        ["--micro-batches", "8,1"],  # the ratios are against micro batch 1
        ["--micro-batches", "1,x"],
        ["--min-len", "1"],  # PROMPTS_ONLY needs two prompt tokens
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        fsdp_cost.parse_args(argv)
    assert exc.value.code == 2
    assert "--" in capsys.readouterr().err


def _write_pass(
    run_dir: Path, tokens: dict[str, int], micro_batch: int, first_step: int = 0
) -> layout.RunLayout:
    """One pass's dumps as the hook writes them: step{N}/rank0/ per micro batch, req{k}/ per lane."""
    lay = layout.RunLayout.from_run_dir(run_dir)
    dump_dir = layout.process_dump_dir(lay.actor_dir)
    writer = records.JsonlWriter(dump_dir / records.UPDATE_ACTOR_LOG)
    ids = list(tokens)
    for n, i in enumerate(range(0, len(ids), micro_batch)):
        chunk, step = ids[i : i + micro_batch], first_step + n
        lanes = chunk if len(chunk) > 1 else None
        for k, rid in enumerate(lanes or chunk):
            folder = dump_dir / f"step{step}" / "rank0" / (f"req{k}" if lanes else "")
            folder.mkdir(parents=True, exist_ok=True)
            shape = [1, tokens[rid], 64]
            row = {"input_args": [{"type": "torch.Tensor", "shape": shape}], "output": []}
            data = {"Module.model.layers.0.input_layernorm.Qwen2RMSNorm.forward.0": row}
            (folder / "dump.json").write_text(json.dumps({"task": "statistics", "data": data}))
        writer.write(
            records.UpdateActorRecord(
                timestamp=records.now(),
                pid=os.getpid(),
                rank=0,
                step=step,
                dump_path=layout.relative_to_run(dump_dir, run_dir),
                phase="log_prob",
                backend="fsdp",
                request_ids=chunk,
                num_requests=len(chunk),
                **({"lane_request_ids": lanes} if lanes else {}),
            )
        )
    writer.close()
    return lay


TOKENS = {f"{i:032x}": 10 + i for i in range(8)}


@pytest.mark.parametrize("micro_batch", [1, 4, 8])
def test_a_complete_pass_is_counted_and_passes(tmp_path, micro_batch):
    lay = _write_pass(tmp_path / "run", TOKENS, micro_batch)
    rep = fsdp_cost.Rep("dumps", micro_batch, 0)
    offset = fsdp_cost.harvest(lay, tmp_path / "pass", 0, TOKENS, rep)
    assert rep.problems == []
    assert (rep.steps, rep.lane_folders, rep.requests_dumped) == (
        8 // micro_batch,
        0 if micro_batch == 1 else 8,
        8,
    )
    assert rep.bytes_dumped > 0
    # the next pass starts from an empty folder and reads only its own records
    assert not list(layout.process_dump_dir(lay.actor_dir).glob("step*"))
    _write_pass(tmp_path / "run", TOKENS, micro_batch, first_step=8)
    again = fsdp_cost.Rep("dumps", micro_batch, 1)
    fsdp_cost.harvest(lay, tmp_path / "pass", offset, TOKENS, again)
    assert again.problems == []
    assert again.requests_dumped == 8


def test_a_missing_lane_and_another_requests_rows_are_problems(tmp_path):
    lay = _write_pass(tmp_path / "run", TOKENS, 4)
    dump_dir = layout.process_dump_dir(lay.actor_dir)
    (dump_dir / "step1" / "rank0" / "req3" / "dump.json").unlink()
    (dump_dir / "step1" / "rank0" / "req3").rmdir()
    lane0 = dump_dir / "step0" / "rank0" / "req0" / "dump.json"  # holds request 1's rows
    lane0.write_text((dump_dir / "step0" / "rank0" / "req1" / "dump.json").read_text())
    rep = fsdp_cost.Rep("dumps", 4, 0)
    fsdp_cost.harvest(lay, tmp_path / "pass", 0, TOKENS, rep)
    text = "\n".join(rep.problems)
    assert "7 req* lane folders" in text
    assert "expected 8" in text
    assert f"11 tokens dumped for request {next(iter(TOKENS))}, its prompt has 10" in text
    assert "None tokens dumped" in text  # the record names a lane whose folder is gone


def test_a_pass_without_records_is_a_problem(tmp_path):
    lay = layout.RunLayout.from_run_dir(tmp_path / "run")
    rep = fsdp_cost.Rep("dumps", 8, 0)
    fsdp_cost.harvest(lay, tmp_path / "pass", 0, TOKENS, rep)
    assert any("0 dumps for 8 requests, 8 missing" in p for p in rep.problems)


ACROSS_MICRO_BATCHES = 1e-5
"""Bound on |log p| differences between micro batches (fp32, the tiny model). fp32 keeps 24
significant bits: one ulp is 4.8e-07 at |log p| in [4, 8), where the tiny model's log p sit
(about ln 512 = 6.2, its vocabulary), 9.5e-07 in [8, 16). Reordering a reduction (what a GEMM
blocked for another batch shape does) moves a result by a few ulp in practice; 1e-5 is 10-20 ulp
there, room for any blocking the CPU libraries choose, and three orders of magnitude below what
a packing fault (a wrong mask or position, another request's rows) does to log p."""


@pytest.mark.demo
@pytest.mark.timeout(900)
def test_the_bench_runs_on_cpu_in_the_demo_venv(tmp_path, repo):
    venv = os.environ.get("VERL_CONSISTENCY_DEMO_VENV")
    if not venv:
        pytest.skip("$VERL_CONSISTENCY_DEMO_VENV unset: no demo venv (make demo-venv)")
    out = tmp_path / "cost.json"
    res = subprocess.run(
        [
            *(str(Path(venv) / "bin" / "python"), "-m", "bench.gpu.fsdp_cost", "--device", "cpu", "--tiny"),
            *("--requests", "8", "--micro-batches", "1,4,8", "--reps", "1", "--work", str(tmp_path / "w")),
            *("--out", str(out), "--inline-write-too"),
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"]
    assert result["problems"] == []
    rows = {(r["label"], r["micro_batch"]): r for r in result["summary"]["rows"]}
    assert rows[("dumps", 1)]["steps"] == 8
    assert rows[("dumps", 1)]["lane_folders"] == 0
    assert rows[("dumps", 4)]["steps"] == 2
    assert rows[("dumps", 4)]["lane_folders"] == 8
    assert rows[("dumps", 8)]["steps"] == 1
    assert rows[("dumps", 8)]["lane_folders"] == 8
    # the same rows are dumped whatever the micro batch: per-request dumps of the same size
    assert rows[("dumps", 1)]["bytes_dumped"] == pytest.approx(rows[("dumps", 8)]["bytes_dumped"], rel=0.05)
    # --inline-write-too: the same passes with the lanes' files written in the training process
    # (before issue 43's lane writer), checked as the others are: the same lanes, the same records
    # (the bytes to a step number's digits: the step folders' names are in the files)
    for mb in (4, 8):
        inline = rows[("dumps-inline", mb)]
        assert (inline["steps"], inline["lane_folders"]) == (rows[("dumps", mb)]["steps"], 8)
        assert inline["bytes_dumped"] == pytest.approx(rows[("dumps", mb)]["bytes_dumped"], rel=0.005)
    assert ("dumps-inline", 1) not in rows
    assert result["summary"]["ratios"]["mb8 dumps-inline/off"] > 0
    assert result["summary"]["ratios"]["dumps mb1/mb8"] > 0
    diffs = result["summary"]["log_prob_max_abs_diff"]
    # dumps change nothing: at the same micro batch the same fp32 kernels run on the same shapes
    same = {k: v for k, v in diffs.items() if k.startswith("dumps")}
    inline = {f"dumps-inline-mb{mb} vs off-mb{mb}" for mb in (4, 8)}
    assert set(same) == {f"dumps-mb{mb} vs off-mb{mb}" for mb in (1, 4, 8)} | inline, diffs
    assert all(v == 0 for v in same.values()), diffs
    # across micro batches the rows are the same but the shapes are not: CPU GEMMs block and
    # order their reductions by shape, so log p may move by a few ulp (a CI machine: 4.77e-07,
    # one ulp, mb4 and mb8 against mb1; another: 0)
    across = {k: v for k, v in diffs.items() if k.startswith("off")}
    assert set(across) == {"off-mb4 vs off-mb1", "off-mb8 vs off-mb1"}, diffs
    assert all(v <= ACROSS_MICRO_BATCHES for v in across.values()), diffs
    assert out.with_suffix(".txt").read_text().count("ratio dumps mb1/mb") == 2
    # one more dumped pass per micro batch above 1 with the host clocks: the lanes' step and write
    # ran (one step at micro batch 8, two at 4), and the table says where the added time went
    split = result["summary"]["host_split"]
    assert set(split) == {"mb4", "mb8"}
    assert [split[k]["steps"] for k in ("mb4", "mb8")] == [2, 1]
    assert all(split[k]["_analyze_tensor"] > 0 and split[k]["write_json"] > 0 for k in split)
    assert all(split[k]["calls"]["add"] > 0 for k in split)
    # the shares and the rest are timing (a loaded machine may show none): only the lines are asserted
    splits = [
        line for line in out.with_suffix(".txt").read_text().splitlines() if line.startswith("host split mb")
    ]
    assert [line.split()[2] for line in splits] == ["mb4", "mb4:", "mb8", "mb8:"]
    assert all("lanes' per-tensor step (add included)" in line for line in splits[0::2])
    assert all("msprobe's per-lane path: none" in line for line in splits[1::2])


@pytest.mark.parametrize(
    ("label", "micro_batch", "fronts", "lanes_path", "problem"),
    [
        ("dumps", 8, {"LaneStats": 2}, "auto", False),
        ("dumps", 8, {"LaneFanout": 2}, "auto", True),  # the one-pass path did not run
        ("dumps", 8, {}, "auto", True),  # no lanes at all
        ("dumps", 8, {"LaneFanout": 2}, "fanout", False),
        ("dumps", 8, {"LaneStats": 1, "LaneFanout": 1}, "fanout", True),
        ("dumps", 1, {}, "auto", False),  # one row per micro batch: dumped whole, no lanes
        ("off", 8, {}, "auto", False),
    ],
)
def test_a_dumped_pass_must_use_the_lane_path_asked_for(label, micro_batch, fronts, lanes_path, problem):
    rep = fsdp_cost.Rep(label, micro_batch, 0, wall_s=1.0, fronts=fronts)
    fsdp_cost_checks.check_fronts(rep, lanes_path)
    assert bool(rep.problems) is problem, rep.problems
