"""PROMPTS_ONLY where each pin set's verl trims (``patches/*/verl/0004-prompts-only.patch``).

verl 0.8.0 trims the padded rollout ``DataProto`` in both trainers (its engine-level behaviour is
tested with the real FSDP engine in ``test_training_fsdp.py``). verl 0.9.1's V1 trainer keeps
trajectories in TransferQueue, so the patched ``AgentLoopWorkerTQ._agent_loop_postprocess`` trims
each one before it is stored; the driver (``request_id_driver.py``) runs that on a real
TransferQueue and then verl's real ``PPOTrainer._compute_old_log_prob`` on the trimmed batch.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import pytest

from verl_consistency.contracts import pins
from verl_consistency.patches.hooks.training import prompts_only

pytestmark = [pytest.mark.timeout(300), pytest.mark.pinset]

V1 = pins.get("set.name") == "next"


@pytest.fixture(scope="module")
def po(verl_driver_report: dict[str, Any]) -> dict[str, Any]:
    return verl_driver_report["v1"]["prompts_only"]


def test_the_trim_sits_where_the_set_builds_the_training_batch(root: Path) -> None:
    if V1:
        tq_src = (root / "verl/trainer/ppo/v1/agent_loop_tq.py").read_text()
        (fn,) = [
            n
            for n in ast.walk(ast.parse(tq_src))
            if isinstance(n, ast.AsyncFunctionDef) and n.name == "_agent_loop_postprocess"
        ]
        body = ast.unparse(fn)
        trim = body.index("prompts_only.trim_sample(field, validate=validate)")
        assert body.index("field['position_ids'] = position_ids") < trim < body.index("fields.append(field)")
        assert trim < body.index("'prompt_len': prompt_len"), "the tags are computed from the trimmed sample"
        base = (root / "verl/trainer/ppo/v1/trainer_base.py").read_text()
        assert "prompts_only.check_v1_config(rollout_corr_config, reward_config=" in base
        for rel in (
            "verl/trainer/ppo/ray_trainer.py",
            "verl/experimental/fully_async_policy/fully_async_trainer.py",
        ):
            assert "prompts_only" not in (root / rel).read_text(), (
                f"{rel}: legacy trainers are not targets on next"
            )
    else:
        assert "prompts_only.trim(batch" in (root / "verl/trainer/ppo/ray_trainer.py").read_text()
        fa = (root / "verl/experimental/fully_async_policy/fully_async_trainer.py").read_text()
        assert "prompts_only.trim(batch" in fa


@pytest.mark.skipif(not V1, reason="verl 0.9.1's V1 trainer (TransferQueue)")
def test_v1_forward_covers_exactly_the_prompt(po: dict[str, Any]) -> None:
    prompt = [1, 2, 3, 4, 5]
    assert po["input_ids"] == [prompt, prompt]
    assert po["position_ids"] == [[0, 1, 2, 3, 4]] * 2
    assert po["prompts"] == [prompt[:-1]] * 2
    assert po["responses"] == [prompt[-1:]] * 2, "the last prompt token is a one-token response"
    assert po["response_mask"] == [[1], [1]]
    assert po["loss_mask"] == [[1], [1]]
    assert po["rm_scores"] == [[0.0], [0.0]], "reward zeroed: reward-only advantages are 0"
    assert po["rollout_log_probs"] == [[None], [None]], "NaN: vLLM never computed that log-prob"
    assert [(t["prompt_len"], t["response_len"], t["seq_len"]) for t in po["tags"]] == [(4, 1, 5)] * 2


@pytest.mark.skipif(not V1, reason="verl 0.9.1's V1 trainer (TransferQueue)")
def test_v1_keeps_vllms_next_token_and_the_request_id(
    verl_driver_report: dict[str, Any], po: dict[str, Any]
) -> None:
    assert po["vc_next_token"] == [13, 11], "each trajectory's first response token"
    assert po["vc_next_token_rollout_log_prob"] == pytest.approx([-0.3, -0.1])
    first = [
        verl_driver_report["hybrid"]["server_saw"][0][0],
        verl_driver_report["fully_async"]["server_saw"][0][0],
    ]
    assert po["request_id"] == first


@pytest.mark.skipif(not V1, reason="verl 0.9.1's V1 trainer (TransferQueue)")
def test_v1_validation_is_not_trimmed(po: dict[str, Any]) -> None:
    assert po["validation_input_ids"] == [[1, 2, 3, 4, 5, 13, 14], [1, 2, 3, 4, 5, 11, 12, 13, 14]]


@pytest.mark.skipif(not V1, reason="verl 0.9.1's V1 trainer (TransferQueue)")
def test_v1_old_log_prob_pass_is_finite_and_writes_no_token_records(po: dict[str, Any]) -> None:
    assert po["old_log_probs"] == [[po["no_rollout"]], [po["no_rollout"]]]
    assert all(math.isfinite(x[0]) for x in po["old_log_probs"])
    assert "training/rollout_probs_diff_max" in po["verl_metrics"], "verl's own metrics still run"
    assert po["token_records_written"] == 0


@pytest.mark.skipif(not V1, reason="verl 0.9.1's V1 trainer (TransferQueue)")
def test_v1_refuses_bypass_rollout_correction_and_a_colocated_reward_model(po: dict[str, Any]) -> None:
    assert "PromptsOnlyError" in po["refusals"]["bypass"]
    assert prompts_only.BYPASS_OVERRIDE in po["refusals"]["bypass"]
    assert "PromptsOnlyError" in po["refusals"]["rollout_is"]
    assert "algorithm.rollout_correction=null" in po["refusals"]["rollout_is"]
    assert "reward.reward_model.enable_resource_pool=true" in po["refusals"]["colocated_reward_model"]
    assert po["refusals"]["reward_model_own_pool"] is None, (
        "a reward model on its own pool scores before the trim"
    )


def test_trim_sample_refuses_unknown_response_shaped_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("PROMPTS_ONLY", "1")
    field = {
        "prompts": torch.tensor([1, 2, 3]),
        "responses": torch.tensor([7, 8]),
        "response_mask": torch.tensor([1, 1]),
        "input_ids": torch.tensor([1, 2, 3, 7, 8]),
        "position_ids": torch.arange(5),
        "teacher_logprobs": torch.zeros(5, 2),
    }
    with pytest.raises(prompts_only.PromptsOnlyError, match="teacher_logprobs"):
        prompts_only.trim_sample(field)
    del field["teacher_logprobs"]
    assert prompts_only.trim_sample(field, validate=True)["input_ids"].tolist() == [1, 2, 3, 7, 8]
    monkeypatch.delenv("PROMPTS_ONLY")
    assert prompts_only.trim_sample(field)["input_ids"].tolist() == [1, 2, 3, 7, 8], "off: untouched"
