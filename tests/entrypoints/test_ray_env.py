"""The run's environment reaches Ray worker processes, not just the driver: the pin set's verl's own
run_ppo (``verl.trainer.main_ppo``, on 0.8.0 and 0.9) starts a real Ray on loopback from the
composed config, and a nested actor created the way verl creates its vLLM servers (with its own
runtime_env env_vars) sees every variable. No TransferQueue is started (the task runner is a
stand-in), so two Ray CPUs are enough on both sets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import Composed, clean_env

pytestmark = [pytest.mark.ray, pytest.mark.verl, pytest.mark.pinset]

SCRIPT = r"""
import json, os, sys
import ray
from omegaconf import OmegaConf
from verl.trainer.main_ppo import run_ppo

config = OmegaConf.create(json.load(open(sys.argv[1])))
config.ray_kwargs.ray_init.num_cpus = 2
config.ray_kwargs.ray_init.include_dashboard = False
names = json.loads(sys.argv[2])
out = sys.argv[3]

@ray.remote(num_cpus=0)
class Server:  # like verl's vLLM server: its own runtime_env env_vars on top of the job's
    def env(self):
        return {n: os.environ.get(n) for n in names + ["NCCL_CUMEM_ENABLE"]}

class Runner:  # stands in for verl's TaskRunner (which would build the whole trainer)
    def run(self, config):
        server = Server.options(runtime_env={"env_vars": {"NCCL_CUMEM_ENABLE": "0"}}).remote()
        seen = {"runner": {n: os.environ.get(n) for n in names}, "server": ray.get(server.env.remote())}
        json.dump(seen, open(out, "w"))

run_ppo(config, task_runner_class=ray.remote(num_cpus=0)(Runner))
ray.shutdown()
"""


def test_env_reaches_nested_ray_actors(fully_async: Composed, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(yaml.safe_load(fully_async.stdout)))
    ray_env = {k: v for k, v in fully_async.plan["env"].items() if k != "RAY_OVERRIDE_JOB_RUNTIME_ENV"}
    out = tmp_path / "seen.json"
    # The driver's own environment has none of the variables: only the runtime env can carry them.
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(config), json.dumps(sorted(ray_env)), str(out)],
        env={**clean_env(), "RAY_DISABLE_USAGE_STATS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(out.read_text())
    assert seen["runner"] == ray_env
    assert seen["server"] == {**ray_env, "NCCL_CUMEM_ENABLE": "0"}
