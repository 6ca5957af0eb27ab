"""The report of ``bench/gpu/fsdp_cost.py``: medians, ratios, log-prob agreement, hardware, the table.

Apart from the bench so that each stays a readable size; nothing here imports torch at import time.
"""

from __future__ import annotations

import os
import platform
import statistics
from typing import Any


def summarize(b: Any, tokens: int) -> dict[str, Any]:
    n = len(b.ids)
    rows, medians = [], {}
    for label in ("off", "dumps", "dumps-inline", "off-after"):
        for mb in b.args.micro_batches:
            mine = [r for r in b.reps if r.label == label and r.micro_batch == mb]
            walls = [r.wall_s for r in mine if r.wall_s is not None]
            if not mine:
                continue
            med = statistics.median(walls) if walls else None
            medians[(label, mb)] = med
            dumped = [r for r in mine if r.wall_s is not None]
            rows.append(
                {
                    "label": label,
                    "micro_batch": mb,
                    "walls_s": walls,
                    "median_s": None if med is None else round(med, 4),
                    "seq_per_s": None if not med else round(n / med, 2),
                    "tok_per_s": None if not med else round(tokens / med, 1),
                    "bytes_dumped": dumped[0].bytes_dumped if dumped else 0,
                    "steps": dumped[0].steps if dumped else 0,
                    "lane_folders": dumped[0].lane_folders if dumped else 0,
                    "requests_dumped": dumped[0].requests_dumped if dumped else 0,
                    "peak_gib": max((r.peak_gib for r in dumped if r.peak_gib is not None), default=None),
                    "failed_or_skipped": len(mine) - len(walls),
                }
            )
    ratios: dict[str, float | None] = {}
    for label in ("dumps", "off"):
        for mb in b.args.micro_batches[1:]:
            one, many = medians.get((label, 1)), medians.get((label, mb))
            ratios[f"{label} mb1/mb{mb}"] = round(one / many, 3) if one and many else None
    for mb in b.args.micro_batches:
        on, off = medians.get(("dumps", mb)), medians.get(("off", mb))
        ratios[f"mb{mb} dumps/off"] = round(on / off, 3) if on and off else None
        inline = medians.get(("dumps-inline", mb))
        if inline:
            ratios[f"mb{mb} dumps-inline/off"] = round(inline / off, 3) if off else None
    return {"rows": rows, "ratios": ratios, "log_prob_max_abs_diff": logprob_diffs(b)}


def logprob_diffs(b: Any) -> dict[str, float]:
    """Same requests, same weights: micro batch 1 vs others (packing, bf16 kernels), dumped vs not (0)."""
    out = {}
    ref = b.log_probs.get("off-mb1")
    for key, lp in b.log_probs.items():
        other = f"off-mb{key.rsplit('mb', 1)[1]}"
        if key.startswith("dumps") and other in b.log_probs:
            out[f"{key} vs {other}"] = float((lp - b.log_probs[other]).abs().max())
        elif key.startswith("off-mb") and key != "off-mb1" and ref is not None:
            out[f"{key} vs off-mb1"] = float((lp - ref).abs().max())
    return out


def hardware(device: str) -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    def version(dist: str) -> str:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "?"

    hw = {
        "device": torch.cuda.get_device_name(0)
        if device == "cuda"
        else f"cpu ({platform.processor() or 'x86_64'})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "verl": version("verl"),
        "transformers": version("transformers"),
        "mindstudio-probe": version("mindstudio-probe"),
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
    }
    return hw


LANE_PATHS = {
    "auto": "in one pass (hooks/lanes/lane_collector.py, issue 32)",
    "fanout": "fanned out, one msprobe collector per lane (before issue 32)",
}
RATIO_NOTES = {
    "dumps": "  (wall at micro batch 1 / wall at the other, both dumping every request: issue 21's figure)",
    "off": "  (the same without dumps)",
    "dumps/off": "  (dump overhead at this micro batch)",
    "dumps-inline/off": "  (the same, the lanes' files written in the training process, not the lane writer)",
}


def table(result: dict[str, Any]) -> str:
    c, s, hw = result["config"], result.get("summary") or {}, result["hardware"]
    lines = [
        f"# verl {hw.get('verl')} FSDPEngineWithLMHead.infer_batch (log_prob, PROMPTS_ONLY, THD), "
        f"{c.get('requests')} requests, prompts {c.get('min_len')}-{c.get('max_len')} tokens "
        f"({c.get('tokens')} in all), model {c.get('shape')} {c.get('dtype')}, attention {c.get('attn')}; "
        f"msprobe statistics L0, capture fraction:1, lanes {LANE_PATHS.get(c.get('lanes_path', 'auto'))}",
        f"hardware: {hw.get('device')}, torch {hw.get('torch')} (cuda {hw.get('cuda')}), "
        f"transformers {hw.get('transformers')}, mindstudio-probe {hw.get('mindstudio-probe')}, "
        f"{hw.get('cpu_cores')} CPU cores",
        f"command: {c.get('command')}",
        f"{'pass':<13}{'mb':>4}  {'wall s per repetition':<30}{'median s':>9}{'seq/s':>9}{'MB dumped':>10}"
        f"{'steps':>7}{'lanes':>7}{'dumped':>7}{'peak GiB':>9}",
    ]
    for r in s.get("rows", []):
        walls = " ".join(f"{w:.3f}" for w in r["walls_s"]) + (" +fail" * r["failed_or_skipped"])
        med = "-" if r["median_s"] is None else f"{r['median_s']:.3f}"
        sps = "-" if r["seq_per_s"] is None else f"{r['seq_per_s']:.1f}"
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        lines.append(
            f"{r['label']:<13}{r['micro_batch']:>4}  {walls:<30}{med:>9}{sps:>9}"
            f"{r['bytes_dumped'] / 1e6:>10.1f}"
            f"{r['steps']:>7}{r['lane_folders']:>7}{r['requests_dumped']:>7}{peak:>9}"
        )
    for k, v in s.get("ratios", {}).items():
        note = RATIO_NOTES.get(k.split()[-1]) or RATIO_NOTES[k.split()[0]]
        lines.append(f"ratio {k}: {v}{note}")
    for k, v in s.get("log_prob_max_abs_diff", {}).items():
        lines.append(f"max |log p diff| {k}: {v:.3g}")
    lines += split_lines(s)
    lines.append(f"elapsed {result.get('elapsed_s')} s; " + ("OK" if result["ok"] else "NOT OK"))
    lines += [f"PROBLEM: {p}" for p in result["problems"]]
    lines += [f"SKIPPED (time budget): {p}" for p in result.get("skipped", [])]
    return "\n".join(lines)


def split_lines(summary: dict[str, Any]) -> list[str]:
    """``host split mbN:`` lines: where the last dumped pass's added time went (``split_passes``),
    against the undumped median of the same micro batch."""
    from collections import Counter

    from bench.support.host_clock import per_lane_line, split_line

    medians = {(r["label"], r["micro_batch"]): r["median_s"] for r in summary.get("rows", [])}
    lines = []
    for key, split in summary.get("host_split", {}).items():
        off = medians.get(("off", int(key[2:])))
        extra = split["wall_s"] - off if off else None
        parts = {k: v for k, v in split.items() if k not in ("wall_s", "steps", "per_lane", "calls")}
        lines.append(
            f"host split {key} (one more dumped pass, {split['wall_s']:.3f} s, clocks on): "
            + split_line(parts, extra, int(split["steps"]))
        )
        lines.append(f"host split {key}: " + per_lane_line(Counter(split.get("per_lane", {})), 1) + " a pass")
    return lines
