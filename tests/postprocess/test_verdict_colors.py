"""The report colours a value by the status verdict.judge gives it: one set of thresholds."""

from __future__ import annotations

import pytest

from verl_consistency.postprocess.compare import verdict
from verl_consistency.postprocess.output import report

REL = (None, 0.0, 1e-6, verdict.HEALTHY_REL_ERR, 0.02, verdict.DIVERGED_REL_ERR, 0.051, 3.0)
COS = (None, 1.0, verdict.HEALTHY_COSINE, 0.995, verdict.DIVERGED_COSINE, 0.98)
RED, AMBER, GREY = "#dc2626", "#f59e0b", "#e5e7eb"


@pytest.mark.parametrize("rel", REL)
@pytest.mark.parametrize("cos", COS)
def test_the_colour_follows_the_row_status(rel, cos):
    status, color = verdict.judge(rel, cos), report._color(rel, cos)
    assert (color == RED) == (status == "diverged")
    assert (color == AMBER) == (status == "warn")
    assert (color == GREY) == (status == "no_metric")


def test_a_moved_threshold_moves_the_colour(monkeypatch):
    assert report._color(0.02) == AMBER
    monkeypatch.setattr(verdict, "HEALTHY_REL_ERR", 0.03)
    assert verdict.judge(0.02, None) == "ok"
    assert report._color(0.02) not in (RED, AMBER, GREY)


def test_tensor_rows_use_the_relative_error_their_cosine_bounds_imply() -> None:
    """The H200 runs' real bf16 kernel noise (rel 0.011, cosine 0.99993) is healthy in tensor
    mode; the same relative error on a statistics row (no cosine) stays suspicious."""
    assert verdict.judge(0.011, 0.99993) == "ok"
    assert verdict.judge(0.011, None) == "warn"
    assert verdict.judge(0.06, 0.9995) == "warn"  # over sqrt(2 * 0.001) though the cosine is fine
    assert verdict.judge(0.2, 0.995) == "diverged"  # over sqrt(2 * 0.01)
    assert verdict.judge(0.03, 0.98) == "diverged"  # the cosine alone
    assert verdict.rel_bounds(1.0) == (verdict.HEALTHY_REL_ERR_TENSOR, verdict.DIVERGED_REL_ERR_TENSOR)
    assert verdict.rel_bounds(None) == (verdict.HEALTHY_REL_ERR, verdict.DIVERGED_REL_ERR)
