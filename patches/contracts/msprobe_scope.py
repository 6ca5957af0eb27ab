"""The msprobe config a request-scoped collection writes, and what the rollout hook reads back (issue 45).

``verl-consistency run`` writes the rollout's msprobe config (``entrypoints/msprobe/config.py``) and
the vLLM worker's hook (``patches/hooks/rollout/request_scope.py``) scopes each step by the same
sentinel id and reads the same module lists: one contract, so the command line never imports a
runtime hook to learn them. Pure data and one pure function; nothing here imports msprobe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CAPTURED_SENTINEL = "verl-consistency-captured"
"""The ``request_id`` that the msprobe config carries; the captured request is renamed to it."""

LAYER_TENSOR_LIST = ["DecoderLayer.forward", "Attention.forward", "MLP.forward"]
"""msprobe ``list`` for tensor mode at L0: decoder layers, attention and MLP blocks only.

msprobe matches ``list`` entries as substrings of the module's dump name, and the class names
are the same in vLLM and transformers (``Qwen2DecoderLayer``, ``Qwen2Attention``, ``Qwen2MLP``,
vLLM's ``Attention`` kernel module). These modules own no parameters of their own
(``named_parameters(recurse=False)``), so msprobe saves no weights each step, which it does
for every leaf module of the full L0 tree (about 1 GB per dumped step for Qwen2-0.5B in bf16).
Layer-level Cosine/MaxAbsErr still locate the first diverging layer and block. Use the same
list on the training side.
"""

BLOCK_TENSOR_LIST = ["Attention.forward", "MLP.forward"]
"""msprobe ``list`` for tensor mode at L0: attention and MLP blocks only (the run's default).

Their outputs mean the same thing in vLLM and transformers (the ``o_proj`` and ``down_proj``
outputs, ``[tokens, hidden]``), so a per-layer Cosine/MaxAbsErr locates the first diverging
block. A decoder layer's output does not: vLLM's ``Qwen2DecoderLayer`` returns
``(mlp_out, residual)`` and adds them in the next layer's norm, transformers' returns their sum;
so :data:`LAYER_TENSOR_LIST` spends a third of its bytes on a pair that does not compare. On
the vLLM side the substring ``Attention.forward`` also matches the attention kernel module
(``self_attn.attn.Attention``), which has no transformers counterpart (msprobe 26.2.0 matches
``list`` entries as plain substrings; its ``name-regex(...)`` is only validated, not applied).
"""

TENSOR_DATA_MODE = ["forward", "output"]
"""msprobe ``data_mode`` for tensor mode (the run's default): forward outputs only.

A block's input is the previous block's output after a norm, so inputs add bytes, not
localisation (``bench/bench_selective.py``: outputs alone halve the bytes per token).
``forward`` keeps a training-side ``update_actor`` dump from also saving gradients, which vLLM
never computes, and stops msprobe registering its parameter-gradient hooks. Statistics mode
keeps ``all``: its cost is per module call, not per token.
"""

SCOPED_TASKS = ("statistics", "tensor")
SCOPED_LEVELS = ("L0", "L1", "mix")


def scoped_msprobe_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an msprobe config dict with request scoping switched on (for whoever writes it).

    Adds ``"request_id": CAPTURED_SENTINEL`` to the section of the configured task, so that the
    scope survives msprobe's config hot-reload. Raises ``ValueError`` for a task or level that
    msprobe cannot scope. The input is not modified.
    """
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in config.items()}
    task = out.get("task", "statistics")
    level = out.get("level", "L1")
    if task not in SCOPED_TASKS or level not in SCOPED_LEVELS:
        raise ValueError(
            f"msprobe config task={task!r} level={level!r}: request-scoped dumps need task in "
            f"{SCOPED_TASKS} and level in {SCOPED_LEVELS}; change the config or turn selective mode off"
        )
    section = dict(out.get(task) or {})
    section["request_id"] = CAPTURED_SENTINEL
    out[task] = section
    return out
