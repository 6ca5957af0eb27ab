"""fully-async pairs only a prefill and a training forward of the same weight version.

Both sets: the composed ``--phase all`` config has one actor update per weight sync. Current set
(verl 0.8.0's ``fully_async_main``): verl's own rollouter, given the composed config, submits no
more samples per weight version than the trainer consumes before its next sync, so at every sync
the message queue is empty and no request is in flight; with verl's defaults it runs ahead.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from verl_consistency.entrypoints.run.overrides import CURRENT, pin_set

from .conftest import Composed

pytestmark = [pytest.mark.verl, pytest.mark.pinset]


def test_phase_all_syncs_after_every_actor_update(fully_async_all: Composed) -> None:
    assert fully_async_all.plan["phase"] == "all"
    if pin_set() == CURRENT:
        expected: dict[str, Any] = {
            "async_training.staleness_threshold": 0,
            "async_training.trigger_parameter_sync_step": 1,
            "async_training.require_batches": 1,
        }
    else:
        expected = {
            "trainer.v1.separate_async.parameter_sync_step": 1,
            "trainer.v1.sampler.max_off_policy_threshold": 1,
            "trainer.v1.sampler.max_off_policy_strategy": "drop",
            # separate_async: train_batch_size == parameter_sync_step * ppo_mini_batch_size
            "data.train_batch_size": fully_async_all.get("actor_rollout_ref.actor.ppo_mini_batch_size"),
        }
    assert {key: fully_async_all.get(key) for key in expected} == expected


class _EmptyQueue:
    """The message queue as the trainer leaves it: it takes each sample as soon as it arrives."""

    async def get_statistics(self) -> dict[str, int]:
        return {"queue_size": 0}


async def _submitted_per_version(config: Any) -> int:
    """How many samples verl 0.8.0's FullyAsyncRollouter submits after a weight sync before it pauses.

    The real ``set_max_required_samples`` and ``_should_pause_generation`` run on a bare rollouter
    (its ``__init__`` builds datasets and servers); the attributes set here are the ones its
    ``__init__`` derives from the config (fully_async_rollouter.py:485-488). The processor checks
    for a pause, then counts the sample it submits (:853, :897); ``reset_staleness`` at a sync
    with nothing queued or in flight starts the count at 0 (:575).
    """
    from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncRollouter

    rollouter = object.__new__(FullyAsyncRollouter.__ray_actor_class__)
    rollouter.config = config
    rollouter.lock = asyncio.Lock()
    rollouter.paused = False
    rollouter.staleness_threshold = config.async_training.staleness_threshold
    rollouter.required_samples = (
        config.actor_rollout_ref.actor.ppo_mini_batch_size * config.async_training.require_batches
    )
    rollouter.total_rollout_steps = config.rollout.total_rollout_steps
    rollouter.llm_server_manager = SimpleNamespace(get_replicas=lambda: [None] * 4)
    rollouter.message_queue_client = _EmptyQueue()
    await rollouter.set_max_required_samples()
    rollouter.staleness_samples = 0
    submitted = 0
    while not await rollouter._should_pause_generation():
        rollouter.staleness_samples += 1
        submitted += 1
        assert submitted < 10_000, "the rollouter never pauses"
    return submitted


def _consumed_per_sync(config: Any) -> int:
    """Samples the trainer takes per step (fully_async_trainer.py:150-151) times steps per sync (:495-499)."""
    steps = config.async_training.require_batches * config.async_training.trigger_parameter_sync_step
    return config.actor_rollout_ref.actor.ppo_mini_batch_size * steps


def _config(composed: Composed, **async_training: Any) -> Any:
    from omegaconf import OmegaConf

    config = OmegaConf.create(composed.config)
    for key, value in async_training.items():
        config.async_training[key] = value
    return config


@pytest.fixture
def current_set() -> None:
    if pin_set() != CURRENT:
        pytest.skip("verl 0.8.0's fully_async_main runs on the current pin set only")


@pytest.mark.usefixtures("current_set")
@pytest.mark.parametrize("fixture", ["fully_async", "fully_async_all"])
def test_rollouter_never_runs_ahead_of_the_trainer(request: pytest.FixtureRequest, fixture: str) -> None:
    composed: Composed = request.getfixturevalue(fixture)
    config = _config(composed)
    assert asyncio.run(_submitted_per_version(config)) == _consumed_per_sync(config)


@pytest.mark.usefixtures("current_set")
def test_log_prob_run_may_raise_the_sync_step(fully_async: Composed) -> None:
    """Old log-probs use the weights the rollout had for the whole cycle: staleness 0 is enough."""
    config = _config(fully_async, trigger_parameter_sync_step=4, require_batches=2)
    assert asyncio.run(_submitted_per_version(config)) == _consumed_per_sync(config) == 64


@pytest.mark.usefixtures("current_set")
def test_verl_defaults_run_ahead(fully_async: Composed) -> None:
    """verl 0.8.0's defaults (staleness 0.1, a sync every 4 steps): samples of one version are
    still queued or generating at the sync, and are trained on by the next version's weights."""
    config = _config(fully_async, staleness_threshold=0.1, trigger_parameter_sync_step=4)
    assert asyncio.run(_submitted_per_version(config)) == 35 > _consumed_per_sync(config) == 32
