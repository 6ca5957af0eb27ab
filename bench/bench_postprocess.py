"""Postprocess benchmark: pairing throughput, and archiving against ``tar --zstd``.

Run: ``python -m bench.bench_postprocess`` (defaults: 1,000,000 dispatch records, 100,000
training records; about 1 GB of scratch in a temp dir, removed afterwards). Scale flags:
``--dispatch-records``, ``--actor-records``, ``--pairs``, ``--extra-dumps``, ``--layers``,
``--max-reqs-per-step``.

The synthetic run folder is shaped like a real collection run (nothing in it is fed to msprobe;
the compare stage's own benchmark uses real dumps):

* rollout: 16 replicas of TP=2 (32 vLLM worker pids), records as the dispatch hook writes them.
  Steps are mostly decode (85 %), then multi-request prefills; ~``--pairs`` single-request whole
  prompt prefills pair, plus as many again with no training micro batch.
* actor: 8 FSDP ranks; 85 % of micro batches hold several requests.
* dumps: msprobe 26.2.0 L0 statistics layout for a ``--layers``-layer Qwen2 (vLLM module names on
  the rollout side, HF names on the training side; dump.json pretty-printed like msprobe's,
  stack.json and construct.json beside it), for every paired step on both TP ranks, and
  ``--extra-dumps`` more (decode / multi-request steps, which the recipe also dumps).

Measured in the same run:

* pairing: records per second of ``pairing.pair_run`` (reads every log line, locates and parses
  the paired dumps). Goal >= 100,000 records/s.
* archiving: ``bundle.write_bundle`` of the paired files + logs against ``tar --zstd`` (zstd -3
  -T1, the same level and one worker thread) of the SAME files. Goal <= 1.1x.
* bundle size against a ``tar --zstd`` of the whole run folder.
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import orjson

from bench.support.hardware import hardware
from verl_consistency.contracts import records
from verl_consistency.postprocess.output import bundle
from verl_consistency.postprocess.output.bundle_manifest import BundleManifest, PairingSummary, Source
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing import pair as pairing

REPLICAS, TP, TRAIN_RANKS = 16, 2, 8

VLLM_MODULES = [
    ("self_attn.qkv_proj", "QKVParallelLinear", 3),
    ("self_attn.attn", "Attention", 1),
    ("self_attn.o_proj", "RowParallelLinear", 1),
    ("self_attn", "Qwen2Attention", 1),
    ("input_layernorm", "RMSNorm", 1),
    ("post_attention_layernorm", "RMSNorm", 1),
    ("mlp.gate_up_proj", "MergedColumnParallelLinear", 2),
    ("mlp.act_fn", "SiluAndMul", 1),
    ("mlp.down_proj", "RowParallelLinear", 1),
    ("mlp", "Qwen2MLP", 1),
]
HF_MODULES = [
    ("self_attn.q_proj", "Linear", 1),
    ("self_attn.k_proj", "Linear", 1),
    ("self_attn.v_proj", "Linear", 1),
    ("self_attn.o_proj", "Linear", 1),
    ("self_attn", "Qwen2Attention", 1),
    ("input_layernorm", "Qwen2RMSNorm", 1),
    ("post_attention_layernorm", "Qwen2RMSNorm", 1),
    ("mlp.gate_proj", "Linear", 1),
    ("mlp.up_proj", "Linear", 1),
    ("mlp.act_fn", "SiLU", 1),
    ("mlp.down_proj", "Linear", 1),
    ("mlp", "Qwen2MLP", 1),
]


def _stat(rng: random.Random, shape: list[int]) -> dict:
    m = rng.uniform(0.5, 8.0)
    return {
        "type": "torch.Tensor",
        "dtype": "torch.bfloat16",
        "shape": shape,
        "Max": m,
        "Min": -m * rng.random(),
        "Mean": rng.gauss(0, 0.05),
        "Norm": m * rng.uniform(20, 60),
        "requires_grad": False,
    }


def dump_files(rng: random.Random, layers: int, tokens: int, vllm: bool) -> dict[str, bytes]:
    """dump.json, stack.json and construct.json of one msprobe L0 statistics step."""
    hidden, data, construct = 896, {}, {}
    mods = VLLM_MODULES if vllm else HF_MODULES
    keys = [
        "Module.model.embed_tokens.VocabParallelEmbedding.forward.0"
        if vllm
        else "Module.model.embed_tokens.Embedding.forward.0"
    ]
    data[keys[0]] = {
        "input_args": [_stat(rng, [tokens])],
        "input_kwargs": {},
        "output": [_stat(rng, [tokens, hidden])],
    }
    for i in range(layers):
        layer_key = f"Module.model.layers.{i}.Qwen2DecoderLayer.forward.0"
        for name, cls, outs in mods:
            key = f"Module.model.layers.{i}.{name}.{cls}.forward.0"
            data[key] = {
                "input_args": [_stat(rng, [tokens, hidden])],
                "input_kwargs": {},
                "output": [_stat(rng, [tokens, hidden * outs])],
            }
            keys.append(key)
            construct[key] = layer_key
        data[layer_key] = {
            "input_args": [_stat(rng, [tokens, hidden])],
            "input_kwargs": {},
            "output": [_stat(rng, [tokens, hidden])],
        }
        keys.append(layer_key)
        construct[layer_key] = None
    dump = {"task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": None, "data": data}
    stack = {
        str(i): [
            [k],
            [
                f"File /usr/local/lib/python3.11/site-packages/model.py, line {100 + i}, in forward, "
                "\n hidden_states = self.mlp(hidden_states)"
            ],
        ]
        for i, k in enumerate(keys)
    }
    return {
        "dump.json": orjson.dumps(dump, option=orjson.OPT_INDENT_2),
        "stack.json": orjson.dumps(stack, option=orjson.OPT_INDENT_2),
        "construct.json": orjson.dumps(construct, option=orjson.OPT_INDENT_2),
    }


def write_dump(folder: Path, files: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def build_tree(run: Path, args: argparse.Namespace) -> dict[str, int]:
    rng = random.Random(7)
    roll, act = run / "rollout", run / "actor"
    pid_of = {(rep, r): 10_000 + rep * 10 + r for rep in range(REPLICAS) for r in range(TP)}
    logs = {k: (roll / str(p) / records.DISPATCH_LOG) for k, p in pid_of.items()}
    for p in logs.values():
        p.parent.mkdir(parents=True)
    fhs = {k: p.open("wb") for k, p in logs.items()}
    steps_per_replica = args.dispatch_records // (REPLICAS * TP)
    n_pairs_per_rep = max(1, args.pairs // REPLICAS)
    pair_ids: list[tuple[str, int, int]] = []  # (base, replica, step)
    decoy_ids: list[str] = []
    dump_proto = {v: dump_files(rng, args.layers, 64, v) for v in (True, False)}
    n_dumped = 0
    for rep in range(REPLICAS):
        special = set(rng.sample(range(steps_per_replica), 2 * n_pairs_per_rep))
        pairable = set(list(special)[:n_pairs_per_rep])
        running: list[str] = [f"{rng.getrandbits(128):032x}-{rng.getrandbits(32):08x}" for _ in range(4)]
        for step in range(steps_per_replica):
            u = rng.random()
            if step in special:
                base = f"{rng.getrandbits(128):032x}"
                vid = f"{base}-{rng.getrandbits(32):08x}"
                tok = rng.randint(64, 2048)
                reqs = [
                    {
                        "request_id": vid,
                        "type": "new",
                        "tokens": tok,
                        "prompt_tokens": tok,
                        "num_computed_tokens": 0,
                    }
                ]
                phase, attn = "prefill", "PrefillNoCache"
                (pair_ids.append((base, rep, step)) if step in pairable else decoy_ids.append(base))
            elif u < 0.85:
                k = rng.randint(1, args.max_reqs_per_step)
                reqs = [
                    {"request_id": rid, "type": "cached", "tokens": 1}
                    for rid in rng.sample(running, min(k, len(running)))
                ]
                phase, attn = "decode", "DecodeOnly"
            else:
                k = rng.randint(2, args.max_reqs_per_step)
                new = [f"{rng.getrandbits(128):032x}-{rng.getrandbits(32):08x}" for _ in range(k)]
                reqs = [
                    {
                        "request_id": rid,
                        "type": "new",
                        "tokens": 100,
                        "prompt_tokens": 100,
                        "num_computed_tokens": 0,
                    }
                    for rid in new
                ]
                running = (running + new)[-args.max_reqs_per_step * 4 :]
                phase, attn = "prefill", "PrefillNoCache"
            for r in range(TP):
                pid = pid_of[(rep, r)]
                rec = {
                    "schema_version": 1,
                    "source": "dispatch_logger",
                    "timestamp": "2026-11-29T08:00:00",
                    "pid": pid,
                    "rank": r,
                    "step": step,
                    "dump_path": f"rollout/{pid}",
                    "phase": phase,
                    "attn_state": attn,
                    "total_num_scheduled_tokens": sum(q["tokens"] for q in reqs),
                    "requests": reqs,
                }
                fhs[(rep, r)].write(orjson.dumps(rec) + b"\n")
    for fh in fhs.values():
        fh.close()

    # paired rollout dumps on both TP ranks (the byte content differs per file)
    for base, rep, step in pair_ids:
        for r in range(TP):
            write_dump(
                roll / str(pid_of[(rep, r)]) / f"step{step}" / f"rank{r}", _vary(dump_proto[True], base, r)
            )
            n_dumped += 1
    # extra dumps of steps that do not pair (the recipe dumps every step)
    for i in range(args.extra_dumps):
        rep = i % REPLICAS
        write_dump(
            roll / str(pid_of[(rep, 0)]) / f"step{steps_per_replica + i}" / "rank0",
            _vary(dump_proto[True], f"x{i}", 0),
        )
        n_dumped += 1

    # training side
    per_rank = args.actor_records // TRAIN_RANKS
    pair_at = {i * (args.actor_records // max(1, len(pair_ids))): b for i, (b, _, _) in enumerate(pair_ids)}
    decoys = iter(decoy_ids)
    for rank in range(TRAIN_RANKS):
        pid = 20_000 + rank
        path = act / str(pid) / records.UPDATE_ACTOR_LOG
        path.parent.mkdir(parents=True)
        with path.open("wb") as fh:
            for step in range(per_rank):
                g = step * TRAIN_RANKS + rank
                if g in pair_at:
                    ids = [pair_at[g]]
                    write_dump(
                        act / str(pid) / f"step{step}" / f"rank{rank}", _vary(dump_proto[False], ids[0], rank)
                    )
                    n_dumped += 1
                elif rng.random() < 0.15:
                    ids = [next(decoys, None) or f"{rng.getrandbits(128):032x}"]
                else:
                    ids = [f"{rng.getrandbits(128):032x}" for _ in range(rng.randint(2, 8))]
                rec = {
                    "source": "update_actor",
                    "timestamp": "2026-11-29T08:10:00",
                    "pid": pid,
                    "rank": rank,
                    "step": step,
                    "dump_path": f"actor/{pid}",
                    "phase": "log_prob",
                    "backend": "fsdp",
                    "request_ids": ids,
                    "num_requests": len(ids),
                }
                fh.write(orjson.dumps(rec) + b"\n")
    return {
        "pairs_planned": len(pair_ids),
        "dump_folders": n_dumped,
        "dispatch_records": steps_per_replica * REPLICAS * TP,
        "actor_records": per_rank * TRAIN_RANKS,
    }


def _vary(files: dict[str, bytes], salt: str, rank: int) -> dict[str, bytes]:
    """Per-file numbers differ (real dumps do), so compression cannot lean on identical files."""
    rng = random.Random(f"{salt}/{rank}")
    digits = b"0123456789"
    out = {}
    for name, data in files.items():
        if name != "dump.json":
            out[name] = data
            continue
        buf = bytearray(data)
        # rewrite the last digits of every float: same shape and size, different values
        i = buf.find(b".")
        while i != -1:
            for j in range(i + 1, min(i + 9, len(buf))):
                if buf[j] in digits:
                    buf[j] = digits[rng.randrange(10)]
                else:
                    break
            i = buf.find(b".", i + 9)
        out[name] = bytes(buf)
    return out


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dispatch-records", type=int, default=1_000_000)
    ap.add_argument("--actor-records", type=int, default=100_000)
    ap.add_argument("--pairs", type=int, default=160)
    ap.add_argument("--extra-dumps", type=int, default=320)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--max-reqs-per-step", type=int, default=8)
    ap.add_argument("--level", type=int, default=bundle.DEFAULT_LEVEL)
    ap.add_argument(
        "--workdir", type=Path, default=None, help="scratch parent (default: the system temp dir)"
    )
    args = ap.parse_args()
    if not shutil.which("tar") or not shutil.which("zstd"):
        raise SystemExit("needs GNU tar and zstd on PATH (Debian: apt-get install tar zstd)")

    print(f"hardware: {hardware()}")
    print("wall times on a shared machine include waiting for the CPU; the CPU-time ratios do not")
    scratch = Path(tempfile.mkdtemp(prefix="bench-postprocess-", dir=args.workdir))
    try:
        run = scratch / "dump" / "bench-run"
        t0 = time.perf_counter()
        info = build_tree(run, args)
        print(
            f"tree: {info['dispatch_records']:,} dispatch + {info['actor_records']:,} training records, "
            f"{info['dump_folders']:,} dump folders, {du(run) / 1e6:,.0f} MB, "
            f"built in {time.perf_counter() - t0:.1f} s"
        )

        # -- pairing ------------------------------------------------------------------------
        stages: dict[str, float] = {}

        def tick(stage: str, done: int, total: int) -> None:
            stages.setdefault(stage, time.perf_counter())

        t0, c0 = time.perf_counter(), time.process_time()
        result = pairing.pair_run(discover.Roots.open(run), progress=tick)
        t_pair, c_pair = time.perf_counter() - t0, time.process_time() - c0
        n = result.dispatch_records + result.actor_records
        t_check = time.perf_counter() - stages.get("check dumps", time.perf_counter())
        print(
            f"pairing: {n:,} records in {t_pair:.2f} s wall, {c_pair:.2f} s CPU ({t_check:.2f} s wall of it "
            f"parsing the paired dump.json); {len(result.pairs):,} pairs, "
            f"{len(result.unpaired):,} listed unpaired"
        )
        print(
            f"RATIO pairing records/s / goal (100,000) = {n / c_pair / 100_000:.2f}x per CPU-second "
            f"({n / c_pair:,.0f} records/s), {n / t_pair / 100_000:.2f}x wall ({n / t_pair:,.0f} records/s)"
        )

        # -- archiving: the same files, our writer vs tar --zstd ------------------------------
        items = bundle.collect(result)
        paired_bytes = sum(i.path.stat().st_size for i in items)
        filelist = scratch / "files.txt"
        filelist.write_text("".join(f"{i.arcname}\n" for i in items))

        def make_manifest(files):
            return BundleManifest(
                run_id="bench-run",
                source=Source(
                    run_dir=str(run),
                    rollout_dir=str(run / "rollout"),
                    actor_dir=str(run / "actor"),
                    layout="run",
                ),
                pairing=PairingSummary.of(result),
                pairs=result.pairs,
                unpaired=result.unpaired,
                files=files,
            )

        ours_t, tar_t, ours_c, tar_c = [], [], [], []
        ours_path, tar_path = (
            scratch / "out" / "bundle-bench-run.tar.zst",
            scratch / "out" / "same-files.tar.zst",
        )
        tar_cmd = [
            "tar",
            "-I",
            f"zstd -{args.level} -T1",
            "-cf",
            str(tar_path),
            "-C",
            str(run),
            "-T",
            str(filelist),
        ]
        for _ in range(3):  # alternate, keep the best of each (page cache warm for both)
            t0, c0 = time.perf_counter(), time.process_time()
            bundle.write_bundle(ours_path, items, make_manifest, level=args.level, threads=1)
            ours_t.append(time.perf_counter() - t0)
            ours_c.append(time.process_time() - c0)
            t0, c0 = time.perf_counter(), _children_cpu()
            subprocess.run(tar_cmd, check=True)
            subprocess.run(["sync", str(tar_path)], check=True)  # the bundle is fsynced too
            tar_t.append(time.perf_counter() - t0)
            tar_c.append(_children_cpu() - c0)
        ours, base = min(ours_t), min(tar_t)
        print(
            f"archiving {len(items):,} files, {paired_bytes / 1e6:,.1f} MB: bundle.write_bundle "
            f"{ours:.2f} s wall {min(ours_c):.2f} s CPU ({ours_path.stat().st_size / 1e6:,.1f} MB); "
            f"tar --zstd -{args.level} -T1 + sync {base:.2f} s wall {min(tar_c):.2f} s CPU "
            f"({tar_path.stat().st_size / 1e6:,.1f} MB)"
        )
        print(
            f"RATIO archiving time bundle / tar --zstd (same files, level {args.level}) = "
            f"{ours / base:.2f}x wall, {min(ours_c) / min(tar_c):.2f}x CPU "
            "(goal <= 1.10x; the bundle also sha256-hashes every file)"
        )
        assert bundle.verify(ours_path).ok

        whole = scratch / "out" / "whole-tree.tar.zst"
        t0 = time.perf_counter()
        subprocess.run(
            ["tar", "-I", f"zstd -{args.level} -T1", "-cf", str(whole), "-C", str(run.parent), run.name],
            check=True,
        )
        t_whole = time.perf_counter() - t0
        print(
            f"whole run folder: {du(run) / 1e6:,.0f} MB raw, tar --zstd {whole.stat().st_size / 1e6:,.1f} MB "
            f"in {t_whole:.2f} s"
        )
        print(
            f"RATIO bundle bytes / whole-tree tar.zst bytes = "
            f"{ours_path.stat().st_size / whole.stat().st_size:.3f}  "
            f"({ours_path.stat().st_size:,} / {whole.stat().st_size:,})"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
