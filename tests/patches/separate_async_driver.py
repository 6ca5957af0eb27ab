"""Driver for ``test_separate_async_setup.py``: verl 0.9.1's ``PPOTrainerSeparateAsync._setup``
with the run's own config, patched (0008) and unpatched, in one process on CPU.

Run as a subprocess with the patched verl first on ``sys.path`` (``run_patched``)::

    python separate_async_driver.py ARGS_JSON

``ARGS_JSON`` names the verl driver module and the overrides of ``verl-consistency run
fully-async --dry-run`` on the next set, and the path of the pristine
``trainer_separate_async.py`` (read from the pinned wheel). The config is composed and checked
as verl's ``main_ppo`` does (``tests/entrypoints/verl_validation.validate``), so
``actor_rollout_ref.hybrid_engine=false`` comes from the run, and each trainer is made by verl's
real ``PPOTrainerSeparateAsync.__init__``. Then ``_setup()`` runs for real up to its end, the
branch of ``_enable_hybrid_replicas == False`` included, with stand-ins only for what needs a
cluster:

* ``PPOTrainer._setup`` (the base: worker groups, resource pools, tokenizer, data) →
  :func:`standin_base_setup`, which leaves what the base leaves on this path: an actor worker
  group and an empty hybrid ``LLMServerManager`` (``trainer_base.py:371-378``, ``create_empty``);
* ``LLMServerManager.create`` (standalone vLLM servers and a load-balancer actor) →
  :class:`StandInServerManager`: verl's own manager class and ``__init__``, with stand-in replicas;
* ``CheckpointEngineManager`` → :class:`StandInCheckpointEngineManager`: the run's backend is
  ``nccl``, whose engine module needs cupy (absent on CPU, so verl's registry refuses it).

``omega_conf_to_dataclass`` is verl's own. The unpatched module is loaded second under its own
name; verl's trainer registry refuses a second class under ``separate_async``, so that entry is
set aside while it loads (``mock.patch.dict`` puts it back). Prints one ``VC_REPORT {json}`` line:
per variant, the error ``_setup`` raised (or none), the mode it left, the log lines of the
module's logger and what the stand-ins were handed.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

STANDALONE_REPLICAS = 2
"""Stand-in standalone replicas ``LLMServerManager.create`` hands back (the log line counts them)."""


class StandInReplica:
    """Stand-in for a standalone ``vLLMReplica``: no vLLM server behind it."""

    def __init__(self, replica_rank: int, **_: Any) -> None:
        self.replica_rank = replica_rank


class StandInActorWorkerGroup:
    """Stand-in for the actor's ``RayWorkerGroup`` that ``PPOTrainer._setup`` builds."""

    world_size = 1


def _server_manager_cls() -> type:
    from verl.workers.rollout.llm_server import LLMServerManager

    class StandInServerManager(LLMServerManager):
        """verl's ``LLMServerManager`` (its own ``__init__`` and ``get_replicas``), made without
        servers: ``create`` as verl's but with stand-in replicas and no load-balancer actor,
        ``create_empty`` as verl's (``llm_server.py:409-422``) but without the load-balancer actor."""

        rollout_replica_class = StandInReplica  # verl keeps a class attribute "for recipe to change"

        @classmethod
        def create(cls, *args: Any, **kwargs: Any) -> Any:
            instance = cls(*args, **kwargs)
            ranks = range(instance.start_rank, instance.start_rank + STANDALONE_REPLICAS)
            instance.rollout_replicas = [StandInReplica(rank) for rank in ranks]
            instance.server_handles = [None] * STANDALONE_REPLICAS
            instance.server_addresses = [f"standin-{rank}:8000" for rank in ranks]
            return instance

        @classmethod
        def create_empty(cls, *args: Any, **kwargs: Any) -> Any:
            instance = cls(*args, **kwargs)
            instance.rollout_replicas, instance.server_handles, instance.server_addresses = [], [], []
            return instance

    return StandInServerManager


class StandInCheckpointEngineManager:
    """Stand-in for ``CheckpointEngineManager``: keeps what ``_setup`` hands it (the run's
    ``nccl`` backend cannot be resolved on CPU: its engine module imports cupy)."""

    def __init__(self, config: Any, actor_wg: Any, replicas: list[Any]) -> None:
        self.config, self.actor_wg, self.replicas = config, actor_wg, replicas


def standin_base_setup(self: Any) -> None:
    """Stand-in for ``PPOTrainer._setup``: what it leaves when hybrid replicas are disabled."""
    self.actor_rollout_wg = StandInActorWorkerGroup()
    self.llm_server_manager = _server_manager_cls().create_empty(config=self.config)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def load_pristine(path: str) -> ModuleType:
    """The unpatched ``trainer_separate_async.py`` as a module of its own, on the same verl."""
    from verl.trainer.ppo.v1 import trainer_base

    spec = importlib.util.spec_from_file_location("vc_pristine_trainer_separate_async", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(trainer_base.TRAINER_REGISTRY):
        trainer_base.TRAINER_REGISTRY.pop("separate_async")
        spec.loader.exec_module(module)
    return module


def _last_line_in(module: ModuleType, error: BaseException) -> str | None:
    """``function:line`` of the innermost frame of ``error``'s traceback in ``module``'s file."""
    found = None
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == module.__file__:
            found = f"{tb.tb_frame.f_code.co_name}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def run_setup(module: ModuleType, config: Any) -> dict[str, Any]:
    """Construct the module's trainer from ``config`` and run its ``_setup()``; report what happened."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    trainer = module.PPOTrainerSeparateAsync(config=config)
    records = _Records()
    module.logger.addHandler(records)
    error = None
    with (
        mock.patch.object(PPOTrainer, "_setup", standin_base_setup),
        mock.patch.object(module, "LLMServerManager", _server_manager_cls()),
        mock.patch.object(module, "CheckpointEngineManager", StandInCheckpointEngineManager),
    ):
        try:
            trainer._setup()
        except Exception as e:  # reported: the test asserts which one, and where
            error = {"type": type(e).__name__, "message": str(e), "at": _last_line_in(module, e)}
    module.logger.removeHandler(records)
    ckpt = getattr(trainer, "standalone_checkpoint_manager", None)
    standalone = getattr(trainer, "standalone_server_manager", None)
    return {
        "file": module.__file__,
        "enable_hybrid_replicas": trainer._enable_hybrid_replicas,
        "error": error,
        "mode": getattr(getattr(trainer, "current_mode", None), "value", None),
        "logs": records.lines,
        "standalone_start_rank": getattr(standalone, "start_rank", None),
        "checkpoint": None
        if ckpt is None
        else {
            "config": type(ckpt.config).__name__,
            "backend": ckpt.config.backend,
            "replicas_are_standalone": ckpt.replicas is standalone.get_replicas(),
            "actor_wg_is_trainers": ckpt.actor_wg is trainer.actor_rollout_wg,
        },
    }


def main(args_path: str) -> None:
    args = json.loads(Path(args_path).read_text())
    from tests.entrypoints import verl_validation

    config = verl_validation.validate(args["module"], args["overrides"])  # as main_ppo: checked, resolved

    import verl.trainer.ppo.v1.trainer_separate_async as patched

    report = {
        "patched": run_setup(patched, config),
        "unpatched": run_setup(load_pristine(args["pristine"]), config),
    }
    print("VC_REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
