"""The weight check from records to verdicts (issue 42): the hooks write, the postprocess names.

The trainer side (``weight_export.exporting``) and the vLLM side (``weight_held``) run here on a
plain torch model standing in for vLLM's (the real pair runs in ``tests/demo/test_weight_sync.py``
and on the GPU); the loading is a ``copy_`` per tensor, as vLLM's default loader does it. Each kind
of fault is planted between the two and must be named with its kind and first version, and
nothing else. Every test runs twice: with the default prints (the trainer's in the dtype vLLM
holds, vLLM's of what it holds) and with ``$VERL_CONSISTENCY_WEIGHT_CHECK_ARRIVALS=1`` (each arrival
printed too)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from verl_consistency.contracts import env
from verl_consistency.contracts.weight_records import WEIGHTS_DIR, WeightSyncRecord
from verl_consistency.patches.hooks.rollout import weight_held
from verl_consistency.patches.hooks.training import weight_export
from verl_consistency.patches.hooks.weights import sync_log
from verl_consistency.postprocess.compare import weight_check
from verl_consistency.postprocess.compare.token_level import BadLine, read_models
from verl_consistency.postprocess.output import weight_section

Plant = Callable[[str, torch.Tensor], torch.Tensor | None]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))


def _sync(trainer: torch.nn.Module, vllm: torch.nn.Module, version: int, plant: Plant | None = None) -> None:
    """One sync: export through the hook (told vLLM's dtype, as patch 0007 passes verl's
    ``rollout.dtype``), plant, receive and load, then fingerprint what is held."""
    check = weight_held.begin(version, vllm)
    assert check is not None

    def load(weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            vllm.get_parameter(name).data.copy_(t)

    on_bucket = check.receiving(load)
    bucket = []
    for name, t in weight_export.exporting(
        ((n, p.detach().clone()) for n, p in trainer.named_parameters()), version, _dtype(vllm)
    ):
        planted = plant(name, t) if plant else t
        if planted is not None:
            bucket.append((name, planted))
    on_bucket(bucket)
    check.finish(vllm)
    sync_log.drain()  # the records are written off the sync's path


def _step(m: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.01)


def _dtype(m: torch.nn.Module) -> torch.dtype:
    return next(m.parameters()).dtype


def _folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arrivals: bool) -> Path:
    monkeypatch.setenv(env.RUN_DIR, str(tmp_path))
    monkeypatch.delenv(env.WEIGHT_CHECK, raising=False)
    monkeypatch.setenv(env.WEIGHT_CHECK_ARRIVALS, "1" if arrivals else "0")
    weight_held.reset_for_tests()
    return tmp_path


@pytest.fixture(params=["default", "arrivals"])
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Path:
    """A run folder, once with the default prints and once with each arrival printed too."""
    return _folder(tmp_path, monkeypatch, request.param == "arrivals")


@pytest.fixture
def arrivals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run folder whose syncs print each arrival too."""
    return _folder(tmp_path, monkeypatch, True)


@pytest.fixture
def lean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run folder whose syncs print only the trainer's export and vLLM's model (the default)."""
    return _folder(tmp_path, monkeypatch, False)


def _story(plant_at_2: Plant | None, held: torch.dtype = torch.float32) -> None:
    """Three syncs with a step before each later one; ``held``: the dtype "vLLM" serves in (the
    trainer always exports its fp32 weights, as verl's FSDP engine does)."""
    trainer, vllm = _model(), _model().to(held)
    with torch.no_grad():
        for p in vllm.parameters():
            p.zero_()  # vLLM starts on dummy weights, as verl's does
    _sync(trainer, vllm, 0)
    _step(trainer)
    _sync(trainer, vllm, 1)
    _step(trainer)
    _sync(trainer, vllm, 2, plant_at_2)


def _named(run: Path) -> dict[int | None, list[tuple[str, str]]]:
    checked = weight_check.check(run)
    assert checked.present
    assert not checked.warnings
    return {v.version: [(d.tensor, d.kind) for d in v.diffs] for v in checked.versions}


def test_healthy_syncs_name_nothing(run: Path) -> None:
    _story(None)
    assert _named(run) == {0: [], 1: [], 2: []}
    assert len(list((run / WEIGHTS_DIR).glob("*.jsonl"))) == 2  # one export log, one held log (one process)


def test_a_tensor_left_out_is_stale_since_the_last_sync_that_had_it(run: Path) -> None:
    _story(lambda n, t: None if n == "1.weight" else t)
    assert _named(run)[2] == [("1.weight", "stale")]
    diff = weight_check.check(run).versions[2].diffs[0]
    assert diff.detail.startswith("holds version 1's values; it was not in this sync")


def test_a_tensor_changed_on_the_way_is_wrong_values_in_transport(run: Path) -> None:
    _story(lambda n, t: t * 2 if n == "0.bias" else t)
    checked = weight_check.check(run)
    assert [(d.tensor, d.kind) for d in checked.versions[2].diffs] == [("0.bias", "wrong_values")]
    detail = checked.versions[2].diffs[0].detail
    if os.environ[env.WEIGHT_CHECK_ARRIVALS] == "1":
        assert detail == "changed on the way: what arrived is not what was sent"
    else:  # the arrival was not printed: either place, and how to tell which
        assert "on the way or in vLLM's loading" in detail
        assert env.WEIGHT_CHECK_ARRIVALS in detail
    assert checked.first_version == {"0.bias": 2}


def test_a_tensor_of_another_shape_or_dtype_is_named_so(run: Path) -> None:
    _story(lambda n, t: t.to(torch.float64) if n == "1.bias" else t)
    assert _named(run)[2] == [("1.bias", "wrong_dtype")]


def test_the_check_is_off_without_a_run_folder_or_when_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(env.RUN_DIR, raising=False)
    assert weight_held.begin(0) is None
    stream = [("a", torch.ones(2))]
    assert list(weight_export.exporting(iter(stream), 0)) == stream
    monkeypatch.setenv(env.RUN_DIR, str(tmp_path))
    monkeypatch.setenv(env.WEIGHT_CHECK, "0")
    assert weight_held.begin(0) is None
    assert not (tmp_path / WEIGHTS_DIR).exists()


def test_the_section_sets_the_weights_beside_the_layer_view(run: Path) -> None:
    _story(lambda n, t: None if n == "1.weight" else t)
    summary = weight_section.build(weight_check.check(run), [], [])
    assert summary is not None
    assert summary.differing_tensors == ["1.weight"]
    assert summary.verdict == "1.weight stale from version 2"
    assert [r.version for r in summary.versions] == [0, 1, 2]
    assert weight_section.csv_text(summary).splitlines()[1].startswith("2,1.weight,stale,2,")


def test_an_unreadable_record_is_named_and_skipped(run: Path) -> None:
    _story(None)
    log = next((run / WEIGHTS_DIR).glob("held-*.jsonl"))
    before = log.read_bytes()
    log.write_bytes(before + b"{not json\n")
    checked = weight_check.check(run)
    assert [w.split(": ")[0] for w in checked.warnings] == [f"{log}:4"]
    assert log.read_bytes() == before + b"{not json\n"  # the input is left as it was


def test_fp32_sent_and_bf16_held_compare_after_the_loaders_rounding(run: Path) -> None:
    """verl's FSDP engine sends fp32 master weights and vLLM holds bf16: after a step the two differ
    in every tensor by the rounding alone. Each is compared in the dtype vLLM holds it in."""
    _story(None, held=torch.bfloat16)
    assert _named(run) == {0: [], 1: [], 2: []}
    held = next((run / WEIGHTS_DIR).glob("held-*.jsonl")).read_text()
    export = next((run / WEIGHTS_DIR).glob("export-*.jsonl")).read_text()
    if os.environ[env.WEIGHT_CHECK_ARRIVALS] == "1":
        assert '"expected"' in held  # the arrivals printed again in bf16
    else:
        assert '"expected"' not in held
        assert '"received"' not in held
        assert '"sent_dtype":"float32"' in export
        assert '"dtype":"bfloat16"' in export


def test_a_tensor_left_out_is_stale_in_bf16_too(run: Path) -> None:
    _story(lambda n, t: None if n == "0.weight" else t, held=torch.bfloat16)
    named = _named(run)
    assert named[2] == [("0.weight", "stale")]
    assert named[0] == named[1] == []


def test_a_tensor_not_resent_and_unchanged_is_not_a_difference(run: Path) -> None:
    """A sync that leaves out a tensor the trainer has not changed since (delta syncs do) is exact."""
    trainer, vllm = _model(), _model()
    _sync(trainer, vllm, 0)
    _sync(trainer, vllm, 1, lambda n, t: None if n == "1.bias" else t)
    assert _named(run) == {0: [], 1: []}


def test_a_log_that_is_no_readable_file_is_named_not_read(run: Path) -> None:
    """A folder (or a fifo, which would block a read) under the export name is named and passed by."""
    _story(None)
    (run / WEIGHTS_DIR / "export-99.jsonl").mkdir()
    checked = weight_check.check(run)
    assert checked.warnings == [
        f"{run / WEIGHTS_DIR / 'export-99.jsonl'}: not a readable file; its weight records are not checked"
    ]
    assert [v.version for v in checked.versions] == [0, 1, 2]


def test_a_cast_arrival_is_printed_for_its_transport_and_its_cast_copy_for_the_model(arrivals: Path) -> None:
    """fp32 sent, bf16 held: the export and the arrival carry row sums alone (a transport check,
    one reduction each), the arrival cast as the loader casts it carries both sums, and so does the
    held print; an arrival held in its own dtype is the model's expected print and carries both."""
    _story(None, held=torch.bfloat16)
    bad: list[BadLine] = []
    records = [
        r
        for log in sorted((arrivals / WEIGHTS_DIR).glob("*.jsonl"))
        for r in read_models(log, WeightSyncRecord, bad)
    ]
    assert bad == []
    export = next(r for r in records if r.side == "export")
    held = next(r for r in records if r.side == "held")
    assert all(p.cols is None for p in export.tensors.values())
    assert held.received is not None
    assert held.expected is not None
    assert all(p.cols is None for p in held.received.values())
    assert all(p.cols is not None and p.dtype == "bfloat16" for p in held.expected.values())
    assert all(p.cols is not None for p in held.tensors.values())


def test_a_row_swapped_within_itself_on_loading_is_named_by_the_column_sums(run: Path) -> None:
    """Two values of one row traded places between arrival and model: the row sums cannot see it,
    the column sums of the model against its expected print do."""
    trainer, vllm = _model(), _model()

    def swap_on_load(weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            data = t.clone()
            if name == "0.weight":
                data[3, 1], data[3, 6] = t[3, 6], t[3, 1]
            vllm.get_parameter(name).data.copy_(data)

    check = weight_held.begin(0, vllm)
    assert check is not None
    check.receiving(swap_on_load)(
        list(
            weight_export.exporting(
                ((n, p.detach().clone()) for n, p in trainer.named_parameters()), 0, _dtype(vllm)
            )
        )
    )
    check.finish(vllm)
    sync_log.drain()
    assert _named(run) == {0: [("0.weight", "wrong_values")]}


def _records(run: Path) -> tuple[WeightSyncRecord, WeightSyncRecord]:
    bad: list[BadLine] = []
    found = [
        r
        for log in sorted((run / WEIGHTS_DIR).glob("*.jsonl"))
        for r in read_models(log, WeightSyncRecord, bad)
    ]
    assert bad == []
    return next(r for r in found if r.side == "export"), next(r for r in found if r.side == "held")


def test_by_default_two_prints_a_sync_in_the_dtype_vllm_holds(lean: Path) -> None:
    """fp32 sent, bf16 held: the trainer prints each tensor cast to bf16 with both sums, vLLM prints
    its model alone and keeps each arrival's shape and dtype, no sums."""
    _story(None, held=torch.bfloat16)
    export, held = _records(lean)
    assert all(
        p.dtype == "bfloat16" and p.sent_dtype == "float32" and p.cols is not None
        for p in export.tensors.values()
    )
    assert held.received is None
    assert held.expected is None
    assert held.arrived is not None
    assert set(held.arrived) == set(export.tensors)
    assert {m.dtype for m in held.arrived.values()} == {"float32"}
    assert all(held.tensors[n].same_values(p) for n, p in export.tensors.items())


def test_a_trainer_print_in_another_dtype_is_not_checked_and_says_how(lean: Path) -> None:
    """A trainer that could not tell vLLM's dtype prints what it sent (fp32); vLLM holds bf16: nothing
    to compare by default, so each such tensor is listed as not checked, naming the switch."""
    trainer, vllm = _model(), _model().to(torch.bfloat16)
    check = weight_held.begin(0, vllm)
    assert check is not None
    check.receiving(lambda weights: [vllm.get_parameter(n).data.copy_(t) for n, t in weights])(
        list(
            weight_export.exporting(
                ((n, p.detach().clone()) for n, p in trainer.named_parameters()), 0, "no-such-dtype"
            )
        )
    )
    check.finish(vllm)
    sync_log.drain()
    checked = weight_check.check(lean)
    row = checked.versions[0]
    assert row.diffs == []
    assert row.compared == 0
    assert set(row.not_checked) == {n for n, _ in trainer.named_parameters()}
    assert all(env.WEIGHT_CHECK_ARRIVALS in why and "float32" in why for why in row.not_checked.values())


def test_the_trainer_reads_verls_dtype_names(lean: Path) -> None:
    assert weight_export.torch_dtype("bfloat16") is torch.bfloat16
    assert weight_export.torch_dtype("bf16") is torch.bfloat16
    assert weight_export.torch_dtype("fp32") is torch.float32
    assert weight_export.torch_dtype(torch.float16) is torch.float16
    assert weight_export.torch_dtype("Parameter") is None
    assert weight_export.torch_dtype(None) is None
