"""STAND-IN for Transformer Engine (test scaffolding, never in the image): megatron-core's local layers.

Why it exists: no machine of this project has Transformer Engine (no wheel for CPU; none on the
GPU device machine either, and nothing can be installed there from a registry). mbridge 0.15.1
(verl 0.9.1's ``vanilla_mbridge`` flavour) hard-codes Transformer Engine's layer spec, so verl's
Megatron engine cannot build a model without it. This module swaps in megatron-core's own *local*
spec and the three things that follow from that swap, nothing else:

1. ``LLMBridge._get_transformer_layer_spec`` (``mbridge/core/llm_bridge.py``) makes the same
   ``get_gpt_decoder_block_spec`` call with ``use_transformer_engine=False``:
   ``ColumnParallelLinear``/``RowParallelLinear``/``DotProductAttention``/``WrappedTorchNorm``;
2. the attention mask: verl's bshd path passes a ``[b, s]`` mask that is True on real tokens
   (Transformer Engine's padding convention); the local ``DotProductAttention`` reads a mask as
   True = masked out and drops its causal mask when given one, so unconverted every score is
   masked (uniform, non-causal attention: the first Megatron-vs-vLLM compare found exactly this).
   :func:`megatron_mask` converts it to causal | padding;
3. the local spec keeps the RMSNorms as modules of their own (Transformer Engine fuses them into the
   next linear as ``layer_norm_weight``), so mbridge's Qwen2 name map gets their two local names
   (``input_layernorm``, ``pre_mlp_layernorm``), for loading the HF weights and for exporting them
   to vLLM under the HF names.

The local ``DotProductAttention`` refuses packed sequences, so the engine must run verl's bshd layout
(``use_remove_padding=False``); megatron-core's torch RMSNorm refuses sequence parallelism.

Two users, one copy:

* ``tests/patches/megatron_driver.py`` (CPU in CI, the H200 through ``bench/megatron_h200.sh``) calls
  :func:`apply` after its own imports;
* ``bench/gpu/verl_gpu.sh ride`` with ``ENGINE=megatron`` runs verl's ``main_ppo``, whose Megatron
  engine lives in Ray worker processes. It puts this folder on ``PYTHONPATH`` and sets
  ``VERL_USE_EXTERNAL_MODULES=megatron_local_spec``: verl's own ``verl/__init__.py`` imports the
  modules named there in every process that imports verl (the driver, each Ray worker, vLLM's
  server). Imported that way, this module only installs an import hook (:func:`install`): the swap
  happens when (and if) the process imports ``mbridge``, so a process that never builds a Megatron
  model (vLLM's) imports no megatron. Imported any other way (the driver, a test), it does nothing
  until :func:`apply` is called.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

NAME = "megatron_local_spec"
"""This module's name as verl's ``VERL_USE_EXTERNAL_MODULES`` names it (the folder on PYTHONPATH)."""
EXTERNAL_MODULES = "VERL_USE_EXTERNAL_MODULES"
"""verl's variable (``verl/__init__.py``): comma-separated modules imported when verl is imported."""
APPLIED = "_vc_megatron_local_spec"
"""Marker set on mbridge's ``LLMBridge`` once the swap is in place (the swap is done once)."""


def megatron_mask(valid: Any) -> Any:
    """verl's bshd ``[b, s]`` True-on-tokens mask -> megatron-core's ``[b, 1, s, s]`` True-masked one."""
    import torch

    if valid is None or valid.dtype != torch.bool or valid.dim() != 2:
        return valid
    s = valid.shape[1]
    future = torch.triu(torch.ones(s, s, dtype=torch.bool, device=valid.device), diagonal=1)
    return future[None, None] | ~valid[:, None, None, :]


def apply() -> None:
    """The swap (1-3 of the module docstring), once per process; imports mbridge and megatron-core."""
    from mbridge.core import llm_bridge

    if getattr(llm_bridge.LLMBridge, APPLIED, False):
        return
    from mbridge.models.qwen2 import Qwen2Bridge
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    def local_spec(self: Any, vp_stage: int | None = None) -> Any:
        assert self.config.normalization == "RMSNorm", "only RMSNorm is supported for now"
        extra = (
            {"vp_stage": vp_stage}
            if "vp_stage" in inspect.signature(get_gpt_decoder_block_spec).parameters
            else {}
        )
        return get_gpt_decoder_block_spec(self.config, use_transformer_engine=False, **extra)

    llm_bridge.LLMBridge._get_transformer_layer_spec = local_spec

    plain_forward = DotProductAttention.forward

    def forward(
        self: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any, **kw: Any
    ) -> Any:
        return plain_forward(self, query, key, value, megatron_mask(attention_mask), *args, **kw)

    DotProductAttention.forward = forward

    layer = "model.layers.{layer_number}."
    Qwen2Bridge._OTHER_MAPPING = {
        **Qwen2Bridge._OTHER_MAPPING,
        "input_layernorm.weight": [layer + "input_layernorm.weight"],
    }
    Qwen2Bridge._MLP_MAPPING = {
        **Qwen2Bridge._MLP_MAPPING,
        "pre_mlp_layernorm.weight": [layer + "post_attention_layernorm.weight"],
    }
    setattr(llm_bridge.LLMBridge, APPLIED, True)


class _AfterMbridge(importlib.abc.MetaPathFinder):
    """Finds ``mbridge`` through the other finders and runs :func:`apply` once it has loaded."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "mbridge":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None  # not installed: the import fails as it would without the stand-in
        loader = spec.loader
        plain_exec = loader.exec_module  # type: ignore[union-attr]

        def exec_module(module: ModuleType) -> None:
            plain_exec(module)
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterMbridge)]
            apply()

        loader.exec_module = exec_module  # type: ignore[method-assign,union-attr]
        return spec


def install() -> None:
    """The swap as soon as mbridge is imported (now, if it already is); megatron is not imported here."""
    if "mbridge" in sys.modules:
        apply()
    elif not any(isinstance(f, _AfterMbridge) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterMbridge())


def _named_by_verl() -> bool:
    return NAME in [m.strip() for m in os.environ.get(EXTERNAL_MODULES, "").split(",")]


if __name__ == NAME and _named_by_verl():
    install()
