"""What the per-tensor weight check adds to a weight sync, on this machine (issue 42).

``python -m bench.bench_weight_check [--layers 4 --hidden 512 --vocab 8192 --reps 5] [--shape 0.5b]
[--device cuda]``: a random
Qwen2's ``state_dict`` stands for verl's export. The baseline is the least a sync does with each
tensor: one copy into a buffer of vLLM's dtype (bf16; verl's FSDP engine sends fp32). Against it,
per tensor, each print as the hooks take it: by default the trainer's export print cast to the held
dtype (``weights/fingerprint.Collector``, both sums) and vLLM's held print (``rollout/weight_held``);
with ``$VERL_CONSISTENCY_WEIGHT_CHECK_ARRIVALS=1`` the export as sent (row sums), vLLM's arrival print
(row sums) plus its print cast to the held dtype, and the held print. Prints the medians, each
ratio to the copy, both modes' sums a sync, the sizes and the hardware. Never asserted in a test;
the GPU form is ``bench/gpu/verl_gpu.sh synccost``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.support.hardware import hardware

BUCKET = 512 << 20
"""verl's default weight-sync bucket (``rollout.update_weights_bucket_megabytes``)."""

SHAPES = {"0.5b": {"layers": 24, "hidden": 896, "vocab": 151936, "intermediate": 4864, "kv_heads": 2}}
"""``--shape``: Qwen2-0.5B's (the GPU runs' model: ``verl_gpu.sh synccost``'s SYNC_MODEL=0.5b)."""


def _qwen2_shapes(
    layers: int, hidden: int, vocab: int, intermediate: int | None = None, kv_heads: int | None = None
) -> dict[str, tuple[int, ...]]:
    """Qwen2's ``state_dict`` names and shapes (tied ``lm_head`` included, as torch lists it), for a
    machine without transformers: the device's bare image, where this bench runs in one call
    before anything is staged. Equal to the model's own (``tests/bench/test_bench_weight_check.py``)."""
    inter, kv = intermediate or hidden * 3, (kv_heads or max(hidden // 256, 1)) * 64
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        at = f"model.layers.{i}."
        shapes |= {
            f"{at}self_attn.q_proj.weight": (hidden, hidden),
            f"{at}self_attn.q_proj.bias": (hidden,),
            f"{at}self_attn.k_proj.weight": (kv, hidden),
            f"{at}self_attn.k_proj.bias": (kv,),
            f"{at}self_attn.v_proj.weight": (kv, hidden),
            f"{at}self_attn.v_proj.bias": (kv,),
            f"{at}self_attn.o_proj.weight": (hidden, hidden),
            f"{at}mlp.gate_proj.weight": (inter, hidden),
            f"{at}mlp.up_proj.weight": (inter, hidden),
            f"{at}mlp.down_proj.weight": (hidden, inter),
            f"{at}input_layernorm.weight": (hidden,),
            f"{at}post_attention_layernorm.weight": (hidden,),
        }
    return shapes | {"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}


def _model_tensors(
    layers: int,
    hidden: int,
    vocab: int,
    intermediate: int | None = None,
    kv_heads: int | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    import torch

    if importlib.util.find_spec("transformers") is None:  # random tensors of the same names and shapes,
        torch.manual_seed(0)  # made where they are used (2.4 GB on a host CPU: seconds a run)
        shapes = _qwen2_shapes(layers, hidden, vocab, intermediate, kv_heads)
        return {n: torch.randn(s, device=device) for n, s in shapes.items()}
    from verl_consistency.entrypoints.engines.tiny_model import tiny_qwen2, tiny_qwen2_config

    config = tiny_qwen2_config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        num_key_value_heads=kv_heads or max(hidden // 256, 1),
        tie_word_embeddings=True,
    )
    with torch.no_grad():
        return {n: t.detach().float().contiguous() for n, t in tiny_qwen2(config).state_dict().items()}


def _timed(fn: Callable[[], object], reps: int) -> float:
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def main(argv: list[str] | None = None) -> int:
    import torch

    from verl_consistency.patches.hooks.weights.fingerprint import Collector

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shape", choices=sorted(SHAPES), help="a named model shape instead of the sizes")
    ap.add_argument("--device", default="cpu", help="where the tensors live (cuda: the GPU form)")
    ap.add_argument(
        "--alone-mb",
        type=float,
        help="sum a piece this large alone instead of grouping it (word_groups.ALONE_BYTES; to compare)",
    )
    ap.add_argument(
        "--waiting-copies",
        action="store_true",
        help="copy the segment sums' lengths to the device as before 60a8768 (a pageable copy, which "
        "synchronises the stream), to compare",
    )
    args = ap.parse_args(argv)
    if args.waiting_copies:
        from verl_consistency.patches.hooks.weights import fingerprint

        def waiting(values: list[int], device: Any) -> Any:
            return torch.tensor(values, dtype=torch.int64, device=device)

        fingerprint._ints_on = waiting
    if args.alone_mb is not None:
        from verl_consistency.patches.hooks.weights import word_groups

        word_groups.ALONE_BYTES["cpu" if args.device == "cpu" else "accelerator"] = int(args.alone_mb * 2**20)
    sizes = (
        dict(SHAPES[args.shape])
        if args.shape
        else {"layers": args.layers, "hidden": args.hidden, "vocab": args.vocab}
    )
    tensors = {n: t.to(args.device) for n, t in _model_tensors(**sizes, device=args.device).items()}
    held = {n: torch.empty_like(t, dtype=torch.bfloat16) for n, t in tensors.items()}

    def sync() -> None:
        for n, t in tensors.items():
            held[n].copy_(t)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    host: dict[str, list[float]] = {}

    def side(label: str, source: dict[str, Any], arrival: bool = False) -> Callable[[], object]:
        """One side as its hook runs it; ``host[label]``: the times until its sums were launched
        (``Collector.launch``), before the prints are read back: what the sync's own thread pays,
        since the hooks leave the read to their writer thread (``sync_log.write_later``)."""

        def run() -> object:
            t0 = time.perf_counter()
            if not arrival:
                c = Collector()
                # export (default): cast to the held dtype, both sums; as sent: row sums; held: both
                cast = torch.bfloat16 if label == "export" else None
                for n, t in source.items():
                    c.add(n, t, cast, cols=label != "as sent")
                pending = c.launch()
                host.setdefault(label, []).append(time.perf_counter() - t0)
                return pending.read()
            received, expected, bucket = Collector(), Collector(), 0
            for n, t in source.items():  # as rollout/weight_held.py: as sent, and cast as the loader casts
                received.add(n, t, cols=False)
                expected.add(n, t, torch.bfloat16)
                bucket += t.numel() * t.element_size()
                if bucket >= BUCKET:  # verl's bucket buffer is reused: flushed per bucket
                    received.flush()
                    expected.flush()
                    bucket = 0
            reads = received.launch(), expected.launch()
            host.setdefault(label, []).append(time.perf_counter() - t0)
            return [r.read() for r in reads]

        return run

    sides = {
        "export": side("export", tensors),
        "held": side("held", held),
        "as sent": side("as sent", tensors),
        "arrival": side("arrival", tensors, arrival=True),
    }
    for fn in (sync, *sides.values()):  # warm up: allocator, kernels
        fn()
    host.clear()
    base = _timed(sync, args.reps)
    walls = {label: _timed(fn, args.reps) for label, fn in sides.items()}
    mib = sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20
    gpu = f"{torch.cuda.get_device_name()}, " if args.device.startswith("cuda") else ""
    where = f"{gpu}{hardware()}"
    alone = f"; pieces summed alone from {args.alone_mb} MiB" if args.alone_mb is not None else ""
    alone += "; lengths copied by a waiting copy" if args.waiting_copies else ""
    print(
        f"weight check per sync: {len(tensors)} tensors, {mib:.0f} MiB fp32 sent, bf16 held{alone}; {where}"
    )
    print(f"baseline (one copy of each tensor into bf16): {base * 1e3:.1f} ms")
    names = {
        "export": "export print (bf16)",
        "held": "held print",
        "as sent": "export print as sent",
        "arrival": "arrival + cast print",
    }
    for label, secs in walls.items():
        print(
            f"{names[label]:<22} {secs * 1e3:8.1f} ms  = {secs / base:.2f}x the copy"
            f"  (on the sync's path, until launched: {statistics.median(host[label]) * 1e3:.1f} ms)"
        )
    modes = {
        "default (export in bf16 + held)": walls["export"] + walls["held"],
        "with arrivals (as sent + arrival + held)": walls["as sent"] + walls["arrival"] + walls["held"],
    }
    path = {
        "default (export in bf16 + held)": ("export", "held"),
        "with arrivals (as sent + arrival + held)": ("as sent", "arrival", "held"),
    }
    for mode, secs in modes.items():
        on_path = sum(statistics.median(host[label]) for label in path[mode])
        print(
            f"{mode:<42} {secs * 1e3:8.1f} ms a sync = {secs / base:.2f}x the copy;"
            f" on the sync's path {on_path * 1e3:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
