"""verl's own config checks, as the pin set's verl driver runs them before any worker starts.

``--cfg job`` (``test_compose.py``) prints the composed config and stops before verl reads it,
so it never meets the checks that stopped ``run hybrid --token-level`` on an H200 (issue 35):
a ``???`` value (``Missing mandatory value: actor_rollout_ref.rollout.name``) and the
``__post_init__`` asserts of verl's config dataclasses (``FSDPActorConfig``: "Please set at
least one of 'actor.ppo_micro_batch_size' or ..."). :func:`validate` composes the driver's own
Hydra config from a run's overrides, as ``@hydra.main`` does, and replays what the driver does
with it up to the point where it needs Ray, a model or an accelerator:

* verl 0.8.0 ``verl.trainer.main_ppo``: ``main`` (``auto_set_device``,
  ``migrate_legacy_reward_impl``), then ``TaskRunner.run`` (``OmegaConf.resolve``,
  ``validate_config``);
* verl 0.8.0 ``fully_async_main``: ``main`` (``auto_set_device``, the top-level ``rollout``
  pool copied into ``actor_rollout_ref.rollout``, ``migrate_legacy_reward_impl``), then
  ``FullyAsyncTaskRunner`` (``OmegaConf.resolve``); it calls no ``validate_config``;
* verl 0.9.1 ``verl.trainer.main_ppo``: ``main`` (``auto_set_device``, ``validate_config``),
  then ``TaskRunnerV1.run`` (``transfer_queue.enable``, ``OmegaConf.resolve``, the V1 trainer
  class of ``trainer.v1.trainer_mode`` constructed: its ``__init__`` holds separate_async's
  asserts and builds the replay buffer);

then, on every driver, the config dataclasses its workers build first (``engine_workers.py``
``init_model``, the trainers' checkpoint-engine and critic set-up): the actor's, the rollout's,
the checkpoint engine's, the critic's where verl uses a critic. Not built: the model's
(``HFModelConfig`` reads the model folder) and the reference policy's (no run kind uses one:
:func:`validate` says so if that changes). verl is imported here, in the test process: the
module is only imported by tests marked ``verl``.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FULLY_ASYNC_MAIN = "verl.experimental.fully_async_policy.fully_async_main"


@dataclass(frozen=True)
class Driver:
    """A verl entry module and the Hydra config its ``@hydra.main`` composes."""

    module: str
    config_dir: Path
    config_name: str


_HYDRA_MAIN = re.compile(r'@hydra\.main\(\s*config_path="([^"]+)",\s*config_name="([^"]+)"')


def driver(module: str) -> Driver:
    """Read the config path and name from the module's own ``@hydra.main`` line (not imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise AssertionError(f"{module} is not installed in this venv")
    source = Path(spec.origin)
    found = _HYDRA_MAIN.search(source.read_text())
    if found is None:
        raise AssertionError(f"{source}: no @hydra.main(config_path=..., config_name=...) line")
    return Driver(module, source.parent / found.group(1), found.group(2))


def compose(drv: Driver, overrides: Sequence[str]) -> Any:
    """The driver's config with the run's overrides, composed as ``@hydra.main`` composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(drv.config_dir), version_base=None):
        return hydra_compose(drv.config_name, overrides=list(overrides))


def _verl_091() -> bool:
    import verl

    return str(verl.__version__).startswith("0.9.")


def _main_ppo_080(config: Any) -> Any:
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    config = migrate_legacy_reward_impl(config)
    OmegaConf.resolve(config)
    validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    return config


def _fully_async_080(config: Any) -> Any:
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
    config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    config = migrate_legacy_reward_impl(config)
    OmegaConf.resolve(config)
    return config


def _main_ppo_091(config: Any) -> Any:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    if not config.trainer.use_v1:
        raise AssertionError("trainer.use_v1=false runs verl's legacy trainer, which no run kind uses")
    from verl.trainer.ppo.v1 import get_trainer_cls

    trainer_cls = get_trainer_cls(config.trainer.v1.trainer_mode)
    config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    trainer_cls(config=config)
    return config


def _workers(config: Any) -> None:
    """The config dataclasses verl's workers and trainers build first, each with its ``__post_init__``."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass

    if need_reference_policy(config):
        raise AssertionError("a run kind now uses a reference policy: build its ActorConfig here too")
    arr = config.actor_rollout_ref
    omega_conf_to_dataclass(arr.actor)
    omega_conf_to_dataclass(arr.rollout)
    omega_conf_to_dataclass(arr.rollout.checkpoint_engine)
    if need_critic(config):
        omega_conf_to_dataclass(config.critic)


def validate(module: str, overrides: Sequence[str]) -> Any:
    """Compose ``module``'s config with ``overrides`` and run verl's checks; return the config.

    Raises what verl raises: ``MissingMandatoryValue``, Hydra's ``InstantiationException``
    around a dataclass's ``AssertionError``, ``ValueError`` from ``validate_config``.
    """
    steps: Callable[[Any], Any]
    if module == FULLY_ASYNC_MAIN:
        steps = _fully_async_080
    elif _verl_091():
        steps = _main_ppo_091
    else:
        steps = _main_ppo_080
    config = steps(compose(driver(module), overrides))
    _workers(config)
    return config
