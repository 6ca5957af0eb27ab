"""Request-scoped dumps with REAL mindstudio-probe 26.2.0 on CPU, around a packed forward.

The model is the vLLM-layout stand-in in ``tests/standins/vllm_qwen2.py`` (weights from a real transformers
Qwen2). Each msprobe task runs in its own process (``scenario.py``), because
``PrecisionDebugger`` is a per-process singleton, as in a vLLM worker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fixtures.subprocess_run import run_module_json
from tests.selective import scenario
from tests.selective.dump_stats import mismatches, tensors
from verl_consistency.patches.hooks.rollout.request_scope import (
    CAPTURED_SENTINEL,
    scoped_msprobe_config,
    scoped_tokens,
)

# pinset: the set's mindstudio-probe pin does the cutting, the set's transformers builds the
# stand-in's weights (4.x on current, 5.5.4 on next)
pytestmark = [pytest.mark.msprobe, pytest.mark.pinset]

LOGITS = "Module.logits_processor.LogitsProcessor.forward.0"
REPO = Path(__file__).resolve().parents[2]


def _run(task: str, out: Path) -> dict[str, Any]:
    return run_module_json("tests.selective.scenario", task, str(out), result=out / "result.json")


@pytest.fixture(scope="module")
def stats_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stats")
    result = _run("statistics", out)
    assert result["dumped"] == [True, False, True, True, True]
    return out


@pytest.fixture(scope="module")
def tensor_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tensor")
    _run("tensor", out)
    return out


def _dump(out: Path, step: int) -> tuple[dict[str, Any], Path]:
    (path,) = (out / "dump" / f"step{step}").glob("*/dump.json")
    return json.loads(path.read_text())["data"], path.parent


def _stat_mismatches(packed: dict[str, Any], alone: dict[str, Any]) -> list[str]:
    return mismatches(packed, alone, skip=LOGITS)


def test_decode_step_is_not_dumped_and_numbering_stays_aligned(stats_run: Path) -> None:
    assert sorted(p.name for p in (stats_run / "dump").iterdir()) == ["step0", "step2", "step3", "step4"]


def test_scoped_statistics_equal_a_forward_of_the_request_alone(stats_run: Path) -> None:
    packed, _ = _dump(stats_run, 0)
    alone, _ = _dump(stats_run, 2)
    assert packed.keys() == alone.keys()
    emb = packed["Module.model.embed_tokens.VocabParallelEmbedding.forward.0"]
    assert emb["output"][0]["shape"] == [scenario.LENGTHS[scenario.CAPTURED], 48]
    assert _stat_mismatches(packed, alone) == []


def test_logits_processor_rows_are_not_per_token_so_they_are_dumped_whole(stats_run: Path) -> None:
    packed, _ = _dump(stats_run, 0)
    assert packed[LOGITS]["output"][0]["shape"] == [len(scenario.PACKING), 96]


def test_scheduler_dict_order_without_packing_order_cuts_the_wrong_rows(stats_run: Path) -> None:
    wrong, _ = _dump(stats_run, 3)
    alone, _ = _dump(stats_run, 2)
    # Same row count (b's length), but msprobe took rows 12..23 (c, a, b offsets) of a, b, c.
    assert wrong["Module.model.embed_tokens.VocabParallelEmbedding.forward.0"]["output"][0]["shape"][0] == 11
    assert _stat_mismatches(wrong, alone) != []


def test_scope_survives_msprobe_config_hot_reload(stats_run: Path) -> None:
    after, _ = _dump(stats_run, 4)
    alone, _ = _dump(stats_run, 2)
    assert _stat_mismatches(after, alone) == []


def test_scoped_tensor_dump_equals_the_request_alone(tensor_run: Path, tmp_path: Path) -> None:
    packed, packed_dir = _dump(tensor_run, 0)
    alone, alone_dir = _dump(tensor_run, 2)
    compared = 0
    for key, entry in packed.items():
        if key == LOGITS:
            continue
        for tp, ta in zip(tensors(entry), tensors(alone[key]), strict=True):
            a = torch.load(packed_dir / "dump_tensor_data" / tp["data_name"], weights_only=True)
            b = torch.load(alone_dir / "dump_tensor_data" / ta["data_name"], weights_only=True)
            assert a.shape == b.shape, key
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=key)
            # the file holds the captured rows only, not the packed step's whole storage
            size = (packed_dir / "dump_tensor_data" / tp["data_name"]).stat().st_size
            own = tmp_path / tp["data_name"]  # same name: torch.save stores it in the archive
            torch.save(a.clone(), own)
            assert abs(size - own.stat().st_size) < 64, (key, size, own.stat().st_size)
            compared += 1
    assert compared > 50
    rows = torch.load(packed_dir / "dump_tensor_data" / f"{LOGITS}.output.0.pt", weights_only=True)
    assert rows.shape[0] == len(scenario.PACKING)


def test_scoped_tokens_renames_in_packing_order() -> None:
    got = scoped_tokens({"c": 5, "a": 7, "b": 11}, "b", ["a", "b", "c"])
    assert list(got.items()) == [("a", 7), (CAPTURED_SENTINEL, 11), ("c", 5)]


@pytest.mark.parametrize(
    ("sched", "rid", "order", "match"),
    [
        ({"a": 3}, "b", None, "not scheduled"),
        ({"a": 3, "b": 2}, "b", ["a"], "different requests"),
        ({"a": 0, "b": 2}, "b", None, "positive int"),
        ({"a": 1.0, "b": 2}, "b", None, "positive int"),
    ],
)
def test_scoped_tokens_rejects_what_msprobe_would_silently_dump_whole(sched, rid, order, match) -> None:
    with pytest.raises(ValueError, match=match):
        scoped_tokens(sched, rid, order)


def test_scoped_msprobe_config_copies_and_refuses_unscopable_levels() -> None:
    cfg = {"task": "tensor", "level": "L0", "tensor": {"list": []}}
    out = scoped_msprobe_config(cfg)
    assert out["tensor"]["request_id"] == CAPTURED_SENTINEL
    assert "request_id" not in cfg["tensor"]
    with pytest.raises(ValueError, match="level"):
        scoped_msprobe_config({"task": "statistics", "level": "L2"})
