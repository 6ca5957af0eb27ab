"""The report colours a value by the status verdict.judge gives it: one set of thresholds."""

from __future__ import annotations

import pytest

from verl_consistency.postprocess import report, verdict

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
