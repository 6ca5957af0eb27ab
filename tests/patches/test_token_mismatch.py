"""Token records (``hooks/training/token_mismatch.py``, ``patches/current/verl/0005-token-records.patch``).

The figures are checked against the pinned verl's own ``calculate_debug_metrics`` and
``compute_offpolicy_metrics`` on the same real ``DataProto`` (patched verl in a subprocess), and
the hook runs on old log-probs that the real FSDP engine computed on CPU
(``fsdp_driver.py`` with ``VC_TEST_TOKEN_LEVEL=1``). Both pin sets (``pinset``): on
verl 0.9.1 the patched V1 ``PPOTrainer._compute_old_log_prob`` itself runs on a real
TransferQueue with a stand-in actor worker group (``request_id_driver.py``).
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.support.verl_support import run_patched, series_has
from tests.patches.test_training_fsdp import _drive
from verl_consistency.contracts import env, pins, token_records
from verl_consistency.patches.hooks.training import token_mismatch as tm

pytestmark = [pytest.mark.timeout(300), pytest.mark.pinset]

V1 = pins.get("set.name") == "next"
"""The next set pins verl 0.9.1, whose default trainer is V1 (TransferQueue)."""

VERL_VS_OURS = {
    "training/rollout_probs_diff_max": "probs_diff_max",
    "training/rollout_probs_diff_mean": "probs_diff_mean",
    "training/rollout_probs_diff_std": "probs_diff_std",
    "training/rollout_actor_probs_pearson_corr": "pearson_corr",
}

SCRIPT = r"""
import json, os, sys
import numpy as np, torch
from verl import DataProto
from verl.utils.debug.metrics import calculate_debug_metrics
from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics
from verl_consistency.patches.hooks.training import token_mismatch

g = torch.Generator().manual_seed(3)
B, P, R = 6, 5, 80          # R > INLINE_MAX: long rows go to the float16 side file
lengths = [80, 3, 1, 40, 0, 70]
mask = torch.zeros(B, R, dtype=torch.long)
for i, n in enumerate(lengths):
    mask[i, :n] = 1
mask[3, 10:14] = 0          # a multi-turn style gap (tool tokens carry no log-prob)
old = -torch.rand(B, R, generator=g) * 3
roll = old + torch.randn(B, R, generator=g) * 0.01
roll[5, 33] += 1.0           # one drifted token
data = DataProto.from_dict(
    tensors={
        "responses": torch.randint(1, 100, (B, R), generator=g),
        "prompts": torch.randint(1, 100, (B, P), generator=g),
        "attention_mask": torch.cat([torch.ones(B, P, dtype=torch.long), mask], 1),
        "response_mask": mask,
        "old_log_probs": old,
        "rollout_log_probs": roll,
    },
    non_tensors={
        "request_id": np.array([f"req{i:02d}" for i in range(B)], dtype=object),
        "index": np.array([10 + i for i in range(B)], dtype=object),
        "uid": np.array(["u0", "u0", "u1", "u1", "u2", "u2"], dtype=object),
    },
)
before = {k: v.clone() for k, v in data.batch.items()}
metrics = {}
metrics.update(calculate_debug_metrics(data))
n = token_mismatch.record(data, global_step=7, verl_metrics=metrics)
unchanged = all(torch.equal(before[k], data.batch[k]) for k in before)
unchanged = unchanged and set(before) == set(data.batch.keys())
off = compute_offpolicy_metrics(old, roll, mask)
rows = []
for i in range(B):
    one = data[i : i + 1]
    if lengths[i] == 0:
        rows.append(None)
        continue
    r = calculate_debug_metrics(one)
    rc = compute_offpolicy_metrics(old[i:i+1], roll[i:i+1], mask[i:i+1])
    r.update({"rc_" + k: v for k, v in rc.items()})
    rows.append(r)
out = {"n": n, "verl": metrics, "offpolicy": off, "rows": rows, "unchanged": unchanged}
print("VC_REPORT " + json.dumps(out))
"""


def _close(a: float | None, b: float, rel: float = 1e-5, abs_: float = 1e-7) -> bool:
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return a is None
    return a is not None and math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_figures_equal_verls_own_on_the_same_dataproto(root: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = run_patched(
        root,
        SCRIPT,
        env={"VERL_CONSISTENCY_TOKEN_LEVEL": "1", "VERL_CONSISTENCY_RUN_DIR": str(run_dir)},
    )
    report = json.loads(next(x for x in out.splitlines() if x.startswith("VC_REPORT "))[10:])
    assert report["unchanged"], "the hook must not touch the batch"
    assert report["n"] == 6

    (step,) = [tm.StepRecord.model_validate(x) for x in _lines(run_dir / tm.STEP_LOG)]
    assert step.global_step == 7
    assert step.responses == 6
    verl = report["verl"]
    assert verl["training/rollout_probs_diff_valid"] == 1
    for vk, ours in VERL_VS_OURS.items():
        assert _close(getattr(step, ours), verl[vk]), (vk, getattr(step, ours), verl[vk])
        assert step.verl[vk] == pytest.approx(verl[vk]), "verl's own value is kept next to ours"
    off = report["offpolicy"]
    assert _close(step.kl, off["kl"])
    assert _close(step.k3_kl, off["k3_kl"])

    recs = [tm.TokenRecord.model_validate(x) for x in _lines(run_dir / tm.TOKEN_LOG)]
    assert [r.request_id for r in recs] == [f"req{i:02d}" for i in range(6)]
    assert [r.index for r in recs] == [10, 11, 12, 13, 14, 15]
    assert [r.response_length for r in recs] == [80, 3, 1, 36, 0, 70]
    for rec, row in zip(recs, report["rows"], strict=True):
        if row is None:
            assert rec.tokens == 0
            assert rec.probs_diff_mean is None
            continue
        assert _close(rec.probs_diff_max, row["training/rollout_probs_diff_max"])
        assert _close(rec.probs_diff_mean, row["training/rollout_probs_diff_mean"])
        assert _close(rec.probs_diff_std, row["training/rollout_probs_diff_std"], rel=1e-4)
        assert _close(rec.pearson_corr, row["training/rollout_actor_probs_pearson_corr"], rel=1e-4)
        assert _close(rec.kl, row["rc_kl"])
        assert _close(rec.k3_kl, row["rc_k3_kl"], rel=1e-4)
    # slime's abs diff of the batch is the mean of the per-response means
    per = [r.abs_diff for r in recs if r.abs_diff is not None]
    assert step.abs_diff == pytest.approx(sum(per) / len(per), rel=1e-5)
    # NeMo-RL's token_mult_prob_error is >= 1 and about 1 here
    assert 1.0 <= step.token_mult_prob_error < 1.1
    # the drifted token, found in the side file and by first_above
    long_rec = recs[5]
    assert long_rec.abs_logp_diff is None
    assert long_rec.side_length == 70
    values = token_records.read_side(run_dir, long_rec)
    assert values[0] is not None
    assert len(values) == 70
    assert values[33] == pytest.approx(1.0, abs=0.2)
    assert long_rec.first_above == 33
    short = recs[1]
    assert short.abs_logp_diff is not None
    assert len(short.abs_logp_diff) == 3
    gap = recs[3]
    assert gap.side_length is None
    assert len(gap.abs_logp_diff or []) == 40
    assert token_records.read_side(run_dir, gap)[10:14] == [None] * 4, "masked positions are None inline"


def test_off_without_the_flag(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    batch = SimpleNamespace(batch={"old_log_probs": torch.zeros(1, 2)}, non_tensor_batch={})
    assert tm.record(batch, global_step=1, environ={"VERL_CONSISTENCY_RUN_DIR": str(tmp_path)}) == 0
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "inf"])
def test_bad_threshold_is_a_clear_error(raw: str) -> None:
    with pytest.raises(ValueError, match="VERL_CONSISTENCY_TOKEN_THRESHOLD"):
        token_records.threshold({env.TOKEN_THRESHOLD: raw})


def _calls_after(tree: ast.AST, verl_call: str, our_call: str) -> int:
    found = 0
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for a, b in zip(body, body[2:], strict=False):
            if verl_call in ast.unparse(a) and our_call in ast.unparse(b):
                found += 1
    return found


def test_patch_calls_the_hook_right_after_verls_metrics(root: Path) -> None:
    """Every trainer of the set: the call follows ``calculate_debug_metrics`` in the same branch."""
    legacy = ("verl/trainer/ppo/ray_trainer.py", "verl/experimental/separation/ray_trainer.py")
    if V1:
        # verl 0.9.1: the V1 trainer's one old-log-prob pass; the legacy trainers are not targets
        tree = ast.parse((root / "verl/trainer/ppo/v1/trainer_base.py").read_text())
        assert (
            _calls_after(tree, "calculate_debug_metrics(data)", "token_mismatch.record_v1(data, batch") == 1
        )
        for rel in legacy:
            assert "token_mismatch" not in (root / rel).read_text(), rel
        return
    for rel in legacy:
        tree = ast.parse((root / rel).read_text())
        assert _calls_after(tree, "calculate_debug_metrics(batch)", "token_mismatch.record(batch") == 1, rel


@pytest.mark.skipif(not V1, reason="verl 0.9.1's V1 trainer (TransferQueue)")
def test_v1_records_from_verls_real_old_log_prob_pass(verl_driver_report: dict[str, Any]) -> None:
    """The patched ``PPOTrainer._compute_old_log_prob``: ids from TransferQueue, no padding rows."""
    v1 = verl_driver_report["v1"]
    first = [
        verl_driver_report["hybrid"]["server_saw"][0][0],
        verl_driver_report["fully_async"]["server_saw"][0][0],
    ]
    assert v1["is_padding"] == [False, False, True, True]
    recs = [tm.TokenRecord.model_validate(x) for x in v1["token_records"]]
    assert [r.request_id for r in recs] == first, "verl's two padding samples are left out"
    assert [r.index for r in recs] == [0, 1]
    assert [r.uid for r in recs] == ["u0", "u1"]
    assert [r.response_length for r in recs] == [2, 4]
    assert [r.global_step for r in recs] == [7, 7]
    # the fully-async sample was aborted by a weight sync after 2 tokens and resumed at version 4
    calls = [(r.rollout_weight_versions, r.rollout_version_offsets) for r in recs]
    assert calls == [([3], [0]), ([3, 4], [0, 2])]
    for rec in recs:
        assert rec.abs_logp_diff == pytest.approx([v1["delta"]] * rec.response_length, abs=1e-6)
    (step,) = [tm.StepRecord.model_validate(x) for x in v1["step_records"]]
    assert step.responses == 2
    verl = v1["verl_metrics"]
    assert verl["training/rollout_probs_diff_valid"] == 1
    for vk, ours in VERL_VS_OURS.items():
        assert _close(getattr(step, ours), verl[vk], rel=1e-4), (vk, getattr(step, ours), verl[vk])
        assert step.verl[vk] == pytest.approx(verl[vk])


def test_record_v1_is_off_without_the_flag_and_in_prompts_only(tmp_path: Path) -> None:
    """No TransferQueue read at all when off; a PROMPTS_ONLY batch has no vLLM log-prob to compare."""
    from types import SimpleNamespace

    def fetch(**_: Any) -> Any:
        raise AssertionError("must not read TransferQueue")

    meta = SimpleNamespace(keys=["k"], partition_id="train", tags=[{}])
    on = {"VERL_CONSISTENCY_TOKEN_LEVEL": "1", "VERL_CONSISTENCY_RUN_DIR": str(tmp_path)}
    assert (
        tm.record_v1(
            None, meta, global_step=1, fetch=fetch, environ={"VERL_CONSISTENCY_RUN_DIR": str(tmp_path)}
        )
        == 0
    )
    assert tm.record_v1(None, meta, global_step=1, fetch=fetch, environ={**on, "PROMPTS_ONLY": "1"}) == 0
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(
    not series_has("verl", "0002-"), reason="the set in force carries no FSDP training-dump patch (0002) yet"
)
def test_hook_on_the_real_fsdp_engines_log_probs(root: Path, tmp_path: Path) -> None:
    """Old log-probs from the real FSDP engine on CPU; vLLM's stand-in log-probs = those + one drift."""
    run_dir = tmp_path / "run"
    report = _drive(
        root,
        tmp_path / "work",
        VC_TEST_TRIM="none",
        VC_TEST_TOKEN_LEVEL="1",
        VERL_CONSISTENCY_TOKEN_LEVEL="1",
        VERL_CONSISTENCY_RUN_DIR=str(run_dir),
    )
    assert report["error"] is None
    assert report["finite"]
    recs = [tm.TokenRecord.model_validate(x) for x in _lines(run_dir / tm.TOKEN_LOG)]
    assert [r.request_id for r in recs] == report["request_ids"]
    assert [r.response_length for r in recs] == [4, 2, 3, 1]
    drifted = [r.sample for r in recs if r.first_above is not None]
    assert drifted == [2]
    assert recs[2].first_above == 1
    (step,) = [tm.StepRecord.model_validate(x) for x in _lines(run_dir / tm.STEP_LOG)]
    for vk, ours in VERL_VS_OURS.items():
        assert _close(getattr(step, ours), report["verl_metrics"][vk], rel=1e-4), vk


def test_a_failure_never_stops_training(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    bad = SimpleNamespace(
        batch={
            "responses": torch.ones(2, 3, dtype=torch.long),
            "response_mask": torch.ones(2, 5, dtype=torch.long),  # wrong shape
            "old_log_probs": torch.zeros(2, 3),
            "rollout_log_probs": torch.zeros(2, 4),
        },
        non_tensor_batch={},
    )
    environ = {"VERL_CONSISTENCY_TOKEN_LEVEL": "1", "VERL_CONSISTENCY_RUN_DIR": str(tmp_path)}
    assert tm.record(bad, global_step=3, environ=environ) == 0
    assert "token records of step 3 skipped" in capsys.readouterr().err


def test_run_refuses_a_bad_threshold() -> None:
    from verl_consistency.entrypoints.run.overrides import Mode
    from verl_consistency.entrypoints.run.plan import build_plan
    from verl_consistency.entrypoints.run.plan_options import PlanError, PlanOptions

    with pytest.raises(PlanError, match="VERL_CONSISTENCY_TOKEN_THRESHOLD"):
        build_plan(
            Mode.HYBRID,
            PlanOptions(dump_root="/d", run_id="r", environ={env.TOKEN_THRESHOLD: "-2"}, token_level=True),
        )
