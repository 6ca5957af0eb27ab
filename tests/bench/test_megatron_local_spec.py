"""The Transformer Engine stand-in (bench/gpu/no_te/megatron_local_spec.py) reaches a process only
through verl's own ``VERL_USE_EXTERNAL_MODULES``, as ``verl_gpu.sh ride`` with ``ENGINE=megatron``
sets it for verl's ``main_ppo`` and its Ray workers, and only once that process imports mbridge.

Each case is a fresh interpreter of the venv in force with the stand-in's folder on ``PYTHONPATH``
(as on the device): importing verl with the variable set imports no megatron; importing mbridge
then swaps in megatron-core's local layer spec, the mask conversion and the two norm names; without
the variable nothing is swapped. Both sets' venvs hold verl, megatron-core 0.16.1 and mbridge 0.15.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
NO_TE = REPO / "bench" / "gpu" / "no_te"

pytestmark = [pytest.mark.verl, pytest.mark.pinset, pytest.mark.timeout(300)]

PROBE = """
import json, sys
import verl
seen = {"after_verl": sorted(m for m in ("megatron", "mbridge", "megatron_local_spec") if m in sys.modules)}
from verl.models.mcore.mbridge import AutoBridge  # what verl's engine imports with vanilla_mbridge
from mbridge.core.llm_bridge import LLMBridge
from mbridge.models.qwen2 import Qwen2Bridge
from megatron.core.transformer.dot_product_attention import DotProductAttention
spec = LLMBridge._get_transformer_layer_spec
seen["spec"] = f"{spec.__module__}.{spec.__qualname__}"
seen["attention_forward"] = DotProductAttention.forward.__module__
seen["norm_names"] = sorted(set(Qwen2Bridge._OTHER_MAPPING) | set(Qwen2Bridge._MLP_MAPPING))
print("PROBE " + json.dumps(seen))
"""


def _probe(external: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    env["PYTHONPATH"] = os.pathsep.join([str(NO_TE), env.get("PYTHONPATH", "")])
    env.update({"CUDA_VISIBLE_DEVICES": "", "VERL_USE_EXTERNAL_PLUGINS": "none"})
    if external is not None:
        env["VERL_USE_EXTERNAL_MODULES"] = external
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=280, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("PROBE "))
    return json.loads(line.removeprefix("PROBE "))  # type: ignore[no-any-return]


def test_named_by_verl_it_swaps_in_the_local_spec_when_mbridge_is_imported() -> None:
    seen = _probe("megatron_local_spec")
    assert seen["after_verl"] == ["megatron_local_spec"], "verl imported it, and it imported no megatron"
    assert seen["spec"] == "megatron_local_spec.apply.<locals>.local_spec"
    assert seen["attention_forward"] == "megatron_local_spec"
    assert {"input_layernorm.weight", "pre_mlp_layernorm.weight"} <= set(seen["norm_names"])


def test_not_named_nothing_is_swapped() -> None:
    seen = _probe(None)
    assert "megatron_local_spec" not in seen["after_verl"]
    assert seen["spec"] == "mbridge.core.llm_bridge.LLMBridge._get_transformer_layer_spec"
    assert seen["attention_forward"] == "megatron.core.transformer.dot_product_attention"
    assert "pre_mlp_layernorm.weight" not in seen["norm_names"]


def test_a_process_that_imported_mbridge_first_is_swapped_at_once() -> None:
    """``install`` in a process where mbridge is already loaded (no import left to hook)."""
    code = (
        "import sys, mbridge; sys.path.insert(0, sys.argv[1]); import megatron_local_spec as m; "
        "m.install(); from mbridge.core.llm_bridge import LLMBridge; "
        "print(LLMBridge._get_transformer_layer_spec.__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(NO_TE)],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "megatron_local_spec"
