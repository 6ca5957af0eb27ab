"""The token-level records: what ``patches.hooks.token_mismatch`` writes and the postprocess reads.

* ``<run>/token_mismatch.jsonl``: one :class:`TokenRecord` per response, with its per-token
  ``|Δ log p|`` inline when short, else a slice of the float16 side file ``token_mismatch.f16``;
* ``<run>/token_mismatch_steps.jsonl``: one :class:`StepRecord` per batch, next to verl's values;
* ``actor/<pid>/next_token.jsonl``: one :class:`NextTokenRecord` per dumped training micro batch
  (the output row of the layer view).

The figures are defined exactly as the peers define them (:data:`FIGURES`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from verl_consistency.contracts import env, records

DEFAULT_THRESHOLD = 0.1
"""``|Δ log p|`` above which a token counts as drifted, unless ``env.TOKEN_THRESHOLD`` says."""
INLINE_MAX = 64
"""Responses up to this many positions keep their ``|Δ log p|`` inline; longer ones go to the side file."""

TOKEN_LOG = "token_mismatch.jsonl"
STEP_LOG = "token_mismatch_steps.jsonl"
SIDE_FILE = "token_mismatch.f16"

VERL_KEYS = (
    "training/rollout_probs_diff_valid",
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_std",
    "training/rollout_actor_probs_pearson_corr",
)
"""What verl 0.8.0's ``calculate_debug_metrics`` logs (``verl/utils/debug/metrics.py``)."""

FIGURES: dict[str, str] = {
    "probs_diff_max": "verl training/rollout_probs_diff_max: max |exp(old) - exp(rollout)| over valid tokens",
    "probs_diff_mean": "verl training/rollout_probs_diff_mean: mean of the same",
    "probs_diff_std": "verl training/rollout_probs_diff_std: torch.std (n-1) of the same",
    "pearson_corr": "verl training/rollout_actor_probs_pearson_corr: corrcoef of the two probabilities",
    "abs_diff": "slime train_rollout_logprob_abs_diff: mean |old - rollout| per response "
    "(sum_of_sample_mean: the batch value is the mean over responses)",
    "token_mult_prob_error": "NeMo-RL token_mult_prob_error: mean exp(|old - rollout|) over valid tokens "
    "(about 1.0 is healthy; look above 1.05)",
    "kl": "verl rollout_corr/kl: mean (rollout - old), KL(pi_rollout || pi_train)",
    "k3_kl": "verl rollout_corr/k3_kl: mean exp(r) - r - 1 with r = old - rollout",
    "max_abs_diff": "max |old - rollout| over valid tokens",
    "first_above": "first response position whose |old - rollout| exceeds the threshold (None: none does)",
}

NEXT_TOKEN_LOG = "next_token.jsonl"
"""Per dumped training micro batch, in ``actor/<pid>/`` beside ``update_actor_log.jsonl``."""

# The keys that carry vLLM's next-token prediction through verl's batches (written by the
# PROMPTS_ONLY trim, read by the training hook; the demo and `check` build batches that carry them).
NEXT_TOKEN = "vc_next_token"
"""``non_tensor_batch`` key: vLLM's first response token (sampled at the last prompt position)."""
NEXT_TOKEN_ROLLOUT_LOG_PROB = "vc_next_token_rollout_log_prob"
"""``non_tensor_batch`` key: vLLM's log-prob of that token (``rollout_log_probs[:, 0]``)."""
NEXT_TOKEN_TOPK = "vc_next_token_topk"
"""``non_tensor_batch`` key (optional): per row, vLLM's top-k ``[token, log p]`` pairs at the last
prompt position (``SamplingParams(logprobs=k)``, output position 0: the sampled token plus the top
k), or None. verl 0.8.0 and 0.9.1 never fill it: their ``vLLMHttpServer.generate``
(``vllm_async_server.py``) sets ``sampling_params["logprobs"] = 0`` when asked for log-probs, i.e.
the sampled token's log-prob only. Whatever has vLLM's top-k (the demo, ``check``) puts it in this
column at rollout; the trims below then carry it like the two keys above."""

HEAD_FIGURES: dict[str, str] = {
    "topk_max_abs_diff": "max over vLLM's top-k tokens t of |train log p(t) - vLLM log p(t)|: the worst "
    "|Δ log p| of any token vLLM could likely have sampled there",
    "topk_tv": "total variation over vLLM's top-k set: 0.5 * sum over its tokens |p_train(t) - p_vllm(t)| "
    "(a lower bound of the full TV: the mass outside the top-k is not compared)",
    "top1_same": "training's argmax over the whole vocabulary == vLLM's most likely token among its top-k",
}
"""The head of the output row, as a distribution (issue 22): the sampled token alone agreeing says
nothing about the rest of the distribution it was drawn from. Computed by :func:`head_figures`."""


class HeadFigures(BaseModel):
    topk_max_abs_diff: float | None = None
    topk_tv: float | None = None
    top1_same: bool | None = None


def head_figures(
    topk: list[tuple[int, float]], train_log_probs: list[float], train_argmax: int
) -> HeadFigures:
    """:data:`HEAD_FIGURES` from vLLM's top-k ``[token, log p]`` and training's log p of the same tokens.

    Entries with a non-finite vLLM log-prob (vLLM pads with -inf when fewer than k tokens are
    possible) are left out; with none left every figure is None.
    """
    pairs = [(int(t), float(v), float(tr)) for (t, v), tr in zip(topk, train_log_probs, strict=True)]
    pairs = [x for x in pairs if math.isfinite(x[1])]
    if not pairs:
        return HeadFigures()
    diffs = [abs(tr - v) for _, v, tr in pairs]
    tv = 0.5 * sum(abs(math.exp(tr) - math.exp(v)) for _, v, tr in pairs)
    top1 = max(pairs, key=lambda x: x[1])[0]
    worst = max(diffs)
    return HeadFigures(
        topk_max_abs_diff=worst if math.isfinite(worst) else None,
        topk_tv=tv if math.isfinite(tv) else None,
        top1_same=top1 == int(train_argmax),
    )


def threshold(environ: Mapping[str, str] | None = None) -> float:
    """``$VERL_CONSISTENCY_TOKEN_THRESHOLD``, else :data:`DEFAULT_THRESHOLD`; ValueError unless positive.

    Here, beside the default, because two sides read it: the hook that writes the records, and
    ``verl-consistency run``, which refuses a bad value before anything starts.
    """
    e = os.environ if environ is None else environ
    raw = e.get(env.TOKEN_THRESHOLD, "").strip()
    if not raw:
        return DEFAULT_THRESHOLD
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or math.isinf(value):
        raise ValueError(f"environment variable {env.TOKEN_THRESHOLD}={raw!r}: expected a positive number")
    return value


class Figures(BaseModel):
    """The peers' figures over one response or one batch. ``None`` where undefined (e.g. std of one token)."""

    model_config = ConfigDict(extra="allow")

    tokens: int = Field(description="valid (response_mask) tokens compared")
    probs_diff_max: float | None = None
    probs_diff_mean: float | None = None
    probs_diff_std: float | None = None
    pearson_corr: float | None = None
    abs_diff: float | None = None
    token_mult_prob_error: float | None = None
    kl: float | None = None
    k3_kl: float | None = None
    max_abs_diff: float | None = None


CALL_VERSIONS = "vc_call_weight_versions"
"""``extra_fields`` key (``hooks/rollout/request_ids.py``): the weights of each vLLM generate call of a
trajectory, in order, as the server stamped them (verl's ``global_steps``). One call, one version; a
partial-rollout resume after a weight sync is a second call at the new version."""

CALL_OFFSETS = "vc_call_offsets"
"""``extra_fields`` key beside :data:`CALL_VERSIONS`: the response position where each call's tokens
begin (0 for the first call)."""


class _TrainingStepRecord(Figures, records.RecordHeader):
    """The header :class:`TokenRecord` and :class:`StepRecord` share: one training step's figures,
    with the global step and the threshold they were computed against."""

    global_step: int
    threshold: float


class TokenRecord(_TrainingStepRecord):
    """One response of one training step."""

    source: Literal["token_mismatch"] = "token_mismatch"
    sample: int = Field(description="row of the training batch")
    request_id: str | None = Field(default=None, description="the first vLLM request id (verl's id)")
    index: Any = Field(default=None, description="the dataset's prompt index (extra_info.index)")
    uid: str | None = Field(default=None, description="verl's per-step prompt group uid")
    response_length: int = Field(description="valid response tokens (response_mask)")
    rollout_weight_versions: list[int | None] | None = Field(
        default=None,
        description="the weights of each generate call that made the response (a resume after a weight "
        "sync adds one); absent in older records",
    )
    rollout_version_offsets: list[int] | None = Field(
        default=None, description="the response position where each of those calls' tokens begin"
    )
    first_above: int | None = None
    abs_logp_diff: list[float | None] | None = Field(
        default=None, description="per position |old - rollout| (None where masked), when short"
    )
    side_offset: int | None = Field(default=None, description="float16 element offset in token_mismatch.f16")
    side_length: int | None = Field(
        default=None, description="number of float16 elements there (NaN = masked)"
    )


class StepRecord(_TrainingStepRecord):
    """One batch: the same figures over all its valid tokens, next to what verl logged."""

    source: Literal["token_mismatch_step"] = "token_mismatch_step"
    responses: int
    verl: dict[str, float | int | None] = Field(
        default_factory=dict, description="verl's own values for this batch (training/rollout_*)"
    )


class NextTokenRecord(records.RecordHeader):
    """One dumped training micro batch: both engines on the token vLLM sampled after the prompt."""

    source: Literal["next_token"] = "next_token"
    step: int = Field(description="msprobe's step of the same micro batch (update_actor_log.jsonl)")
    dump_path: str | None = None
    phase: str
    request_id: str | None = None
    token: int = Field(description="vLLM's first response token")
    rollout_log_prob: float = Field(description="vLLM's log-prob of it (rollout_log_probs[:, 0])")
    train_log_prob: float = Field(description="the training forward's log-prob of it, same position")
    abs_diff: float
    train_argmax: int = Field(description="the training forward's most likely next token")
    train_argmax_log_prob: float
    temperature: float = 1.0
    rollout_topk: list[tuple[int, float]] | None = Field(
        default=None,
        description="vLLM's top-k [token, log p] at the same position (its logprobs=k), when asked",
    )
    topk_max_abs_diff: float | None = Field(default=None, description=HEAD_FIGURES["topk_max_abs_diff"])
    topk_tv: float | None = Field(default=None, description=HEAD_FIGURES["topk_tv"])
    top1_same: bool | None = Field(default=None, description=HEAD_FIGURES["top1_same"])


def read_side(run_dir: Path, rec: TokenRecord) -> list[float | None]:
    """The per-position ``|Δ log p|`` of one record, inline or from the side file."""
    if rec.abs_logp_diff is not None:
        return rec.abs_logp_diff
    if rec.side_offset is None or rec.side_length is None:
        return []
    import numpy as np

    arr = np.fromfile(
        run_dir / SIDE_FILE, dtype=np.float16, count=rec.side_length, offset=2 * rec.side_offset
    ).astype(np.float32)
    return [None if math.isnan(x) else float(x) for x in arr.tolist()]
