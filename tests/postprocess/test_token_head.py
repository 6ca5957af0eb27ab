"""The head of the output row, as a distribution (issue 22): vLLM's top-k against training's softmax.

The training side is the real probe's record writer (``NextTokenProbe._write``) on constructed
logits; vLLM's side is the log-softmax of constructed logits, shaped as vLLM's
``SamplingParams(logprobs=k)`` returns it (``[token, log p]`` at output position 0). The real
engines run in the demo (``entrypoints/engines/vllm_stage.py``), which asks vLLM for its top-k.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import orjson
import pytest

from verl_consistency.contracts import env
from verl_consistency.contracts import token_records as trec
from verl_consistency.patches.hooks.rollout import request_ids
from verl_consistency.patches.hooks.training import next_token as nt
from verl_consistency.postprocess.compare import token_level
from verl_consistency.postprocess.compare.verdict import PairComparison
from verl_consistency.postprocess.output import report
from verl_consistency.postprocess.pairing.pair_types import DumpRef, Pair

torch = pytest.importorskip("torch")

VOCAB, K = 64, 8
DUMP_PATH, STEP, RID = "actor/77", 0, "req-a"


def _vllm_logits() -> torch.Tensor:
    """A peaked head: token 5 first, then tokens 9 and 17 (logits 2.0 and 1.2), the rest low."""
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)) * 0.3
    logits[5], logits[9], logits[17] = 4.0, 2.0, 1.2
    return logits


def _topk(logits: torch.Tensor, sampled: int) -> list[tuple[int, float]]:
    """What vLLM returns for output position 0 with ``logprobs=K``: the top K plus the sampled token."""
    logp = torch.log_softmax(logits, dim=-1)
    ids = set(torch.topk(logp, K).indices.tolist()) | {sampled}
    return [(t, float(logp[t])) for t in sorted(ids)]


def _record(
    run_dir: Path, train_logits: torch.Tensor, vllm_logits: torch.Tensor, sampled: int
) -> trec.NextTokenRecord:
    """The record the real probe writes for one row (its ``_write``), read back as the postprocess does."""
    vllm_logp = torch.log_softmax(vllm_logits, dim=-1)
    probe = nt.NextTokenProbe(None, [], 1.0)
    dump_dir = run_dir / DUMP_PATH
    dump_dir.mkdir(parents=True, exist_ok=True)
    probe._write(
        dump_dir,
        train_logits,
        nt.WantedRow(-1, sampled, float(vllm_logp[sampled]), _topk(vllm_logits, sampled)),
        nt.DumpStep(step=STEP, dump_path=DUMP_PATH, phase="log_prob"),
        RID,
    )
    (rec,) = token_level.next_token_records(run_dir)
    return rec


def _pair() -> tuple[list[Pair], list[PairComparison]]:
    actor = DumpRef(side="actor", pid=77, rank=0, step=STEP, dir=f"{DUMP_PATH}/step{STEP}/rank0")
    rollout = DumpRef(side="rollout", pid=1, rank=0, step=STEP, dir=f"rollout/1/step{STEP}/rank0")
    pair = Pair(
        pair_id=f"{RID}.r0.a0",
        request_id=RID,
        vllm_request_id=RID + "-0123abcd",
        rollout=rollout,
        actor=actor,
        backend="fsdp",
        prompt_tokens=4,
    )
    # STAND-IN for the layer comparison: a healthy pair; the test is about what the output row adds
    return [pair], [PairComparison(pair_id=pair.pair_id, request_id=RID, status="ok", verdict="healthy")]


def test_distribution_moved_away_from_the_sampled_token_is_flagged(tmp_path: Path) -> None:
    vllm = _vllm_logits()
    # training: the mass of tokens 9 and 17 (ranks 2 and 3) swapped. The normaliser is the same sum,
    # so the sampled token 5 (and the top-1) keep their log-prob; the sampled-token row sees nothing.
    train = vllm.clone()
    train[9], train[17] = vllm[17], vllm[9]
    rec = _record(tmp_path / "moved", train, vllm, sampled=5)
    assert rec.abs_diff <= 1e-6, "the sampled token agrees exactly"
    assert token_level.output_status(rec.abs_diff) == "ok", "the old row alone would call it healthy"
    assert rec.top1_same is True
    assert rec.topk_max_abs_diff == pytest.approx(0.8, abs=1e-5), "log p of 9 and 17 each moved by 2.0-1.2"
    p = torch.softmax(vllm, dim=-1)
    assert rec.topk_tv == pytest.approx(float(p[9] - p[17]), rel=1e-5), "0.5 * (|Δp9| + |Δp17|)"
    assert rec.rollout_topk is not None
    assert len(rec.rollout_topk) == K

    pairs, comps = _pair()
    (c,) = token_level.attach_output_rows(tmp_path / "moved", pairs, comps)
    assert c.output is not None
    assert c.output.status == "diverged"
    assert c.verdict == "diverged", "a healthy pair whose head distribution moved is not healthy"
    assert (c.output.topk, c.output.top1_same) == (K, True)

    html, md = report.write_report(
        tmp_path / "results", run_id="t", pairs=pairs, unpaired=[], comparisons=[c]
    )
    page = html.read_text()
    assert page.count("output-head-row") == 1
    assert f"top-k ({K} tokens)" in page
    assert "top-1 same" in page
    assert "| top-k TV |" in md.read_text()


def test_same_distribution_is_ok(tmp_path: Path) -> None:
    vllm = _vllm_logits()
    # control: fp32 noise of the kind two engines show (|Δ logit| ~ 1e-4), the same sampled token
    train = vllm + torch.randn(VOCAB, generator=torch.Generator().manual_seed(1)) * 1e-4
    rec = _record(tmp_path, train, vllm, sampled=9)
    assert rec.topk_max_abs_diff is not None
    assert rec.topk_max_abs_diff < 1e-3
    assert rec.topk_tv is not None
    assert rec.topk_tv < 1e-3
    assert rec.top1_same is True
    pairs, comps = _pair()
    (c,) = token_level.attach_output_rows(tmp_path, pairs, comps)
    assert c.output is not None
    assert c.output.status == "ok"
    assert c.verdict == "healthy"


@pytest.mark.parametrize(
    ("boost", "want"),
    [
        (9, "warn"),  # training's argmax 9 is in vLLM's top-k: greedy decoding differs
        (-1, "diverged"),  # training's argmax is vLLM's least likely token, far below its top k
    ],
)
def test_a_different_top1_is_flagged(tmp_path: Path, boost: int, want: str) -> None:
    vllm = _vllm_logits()
    boost = boost if boost >= 0 else int(torch.argmin(vllm))
    train = vllm.clone()
    train[boost] = vllm[5] + 0.01  # just above vLLM's top-1 in training only
    rec = _record(tmp_path, train, vllm, sampled=5)
    assert rec.top1_same is False
    assert rec.train_argmax == boost
    # the head figures alone: mask the |Δ log p| bounds to isolate the top-1 rule
    quiet = rec.model_copy(update={"abs_diff": 0.0, "topk_max_abs_diff": 0.0})
    assert token_level.output_status(0.0, quiet) == want
    assert "top-1 differs" in token_level.output_row(rec).note


def test_old_records_without_the_head_still_parse_and_render(tmp_path: Path) -> None:
    old = {
        "schema_version": 1,
        "source": "next_token",
        "timestamp": "2026-01-01T00:00:00Z",
        "pid": 77,
        "step": STEP,
        "dump_path": DUMP_PATH,
        "phase": "log_prob",
        "request_id": RID,
        "token": 5,
        "rollout_log_prob": -0.2,
        "train_log_prob": -0.21,
        "abs_diff": 0.01,
        "train_argmax": 5,
        "train_argmax_log_prob": -0.21,
    }
    (tmp_path / DUMP_PATH).mkdir(parents=True)
    (tmp_path / DUMP_PATH / trec.NEXT_TOKEN_LOG).write_bytes(orjson.dumps(old) + b"\n")
    (rec,) = token_level.next_token_records(tmp_path)
    assert (rec.rollout_topk, rec.topk_max_abs_diff, rec.topk_tv, rec.top1_same) == (None, None, None, None)
    pairs, comps = _pair()
    (c,) = token_level.attach_output_rows(tmp_path, pairs, comps)
    assert c.output is not None
    assert c.output.status == "ok"
    assert c.output.topk is None
    html, md = report.write_report(
        tmp_path / "results", run_id="t", pairs=pairs, unpaired=[], comparisons=[c]
    )
    assert html.read_text().count("output-row") == 1
    assert "output-head-row" not in html.read_text()
    assert "| `req-a.r0.a0` | 5 |" in md.read_text()

    # a new record round-trips through its JSON line with its head intact
    new = rec.model_copy(update={"rollout_topk": [(5, -0.2), (9, -2.1)], "topk_tv": 0.01, "top1_same": True})
    line = orjson.dumps(new.model_dump(mode="json", exclude_none=True))
    assert trec.NextTokenRecord.model_validate(orjson.loads(line)) == new


def test_the_trims_carry_vllms_topk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.TOKEN_LEVEL, "1")
    monkeypatch.setenv(env.RUN_DIR, str(tmp_path))
    topk = np.empty(3, dtype=object)
    topk[:] = [[[5, -0.1], [9, float("-inf")]], [[7, -0.3]], None]
    batch = SimpleNamespace(
        batch={
            "responses": torch.tensor([[5, 1], [7, 1], [0, 0]]),
            "rollout_log_probs": torch.tensor([[-0.1, -1.0], [-0.3, -1.0], [0.0, 0.0]]),
            "response_mask": torch.tensor([[1, 1], [0, 0], [0, 0]]),
        },
        non_tensor_batch={trec.NEXT_TOKEN_TOPK: topk},
    )
    assert nt.stash_next_token(batch)
    # -inf (vLLM's padding when fewer than k tokens are possible) is dropped; a row without a
    # valid response token 0 has no next token, so no top-k either
    assert list(batch.non_tensor_batch[trec.NEXT_TOKEN_TOPK]) == [[[5, -0.1]], None, None]

    field = {"responses": torch.tensor([5, 1]), "rollout_log_probs": torch.tensor([-0.1, -1.0])}
    assert nt.stash_next_token_sample(dict(field))
    assert trec.NEXT_TOKEN_TOPK not in _stashed(field)
    sample = _stashed({**field, trec.NEXT_TOKEN_TOPK: [[5, -0.1], [9, -2.0]]})
    assert sample[trec.NEXT_TOKEN_TOPK] == [[5, -0.1], [9, -2.0]]
    request_ids.clear_padding(sample)
    assert sample[trec.NEXT_TOKEN_TOPK] is None, "a padding sample carries no request's top-k"


def _stashed(field: dict[str, object]) -> dict[str, object]:
    out = dict(field)
    nt.stash_next_token_sample(out)
    return out
