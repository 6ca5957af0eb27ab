"""A constructed batch effect for the check test (named a stand-in: no real kernel is changed).

Put on ``PYTHONPATH`` of the check's vLLM process only. When vLLM imports its Qwen2 model, the
output of ``model.layers.0.mlp`` is scaled by :data:`SCALE` in every forward that holds more
tokens than the longest single prompt, i.e. in a step that packs several prompts; a prompt
computed alone is untouched. That is what a batch-variant kernel does, made large enough to see:
the check's batch variance (vLLM batched vs alone) must show it at that module, and its engine gap
(vLLM alone vs training) must not.

The longest prompt is read from the check's own rollout arguments
(``$VERL_CONSISTENCY_RUN_DIR/check/rollout-args.json``), so the test needs no tokenizer of its own.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

TARGET = "vllm.model_executor.models.qwen2"
MODULE = "model.layers.0.mlp"
SCALE = 1.5


def _longest() -> int:
    args = Path(os.environ["VERL_CONSISTENCY_RUN_DIR"]) / "check" / "rollout-args.json"
    return max(len(p) for p in json.loads(args.read_text())["prompts"])


def _patch(mod: Any) -> None:
    cls = mod.Qwen2MLP
    init, forward = cls.__init__, cls.forward
    longest = _longest()

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._vc_scaled = str(kwargs.get("prefix", "")).endswith(MODULE)

    def scaled(self: Any, x: Any) -> Any:
        out = forward(self, x)
        if getattr(self, "_vc_scaled", False) and x.shape[0] > longest:
            return out * SCALE
        return out

    cls.__init__, cls.forward = __init__, scaled


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("VERL_CONSISTENCY_RUN_DIR"):
    sys.meta_path.insert(0, _Finder())
