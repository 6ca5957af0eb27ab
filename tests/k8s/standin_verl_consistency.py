"""Stand-in for the image's ``verl-consistency`` executable on the Ray head, for test_submission.py.

A real collection run needs NPUs and vLLM; this stands where the head's ``verl-consistency``
would be (first on the head's PATH) and records what the Ray job's driver process received,
then does the parts of the run that can happen on a CPU host, for real:

1. its argv, and the job config that Ray's job supervisor gave the driver
   (``RAY_JOB_CONFIG_JSON_ENV_VAR``: the runtime env and metadata of the submission);
2. the real CLI on that argv, ``python -m verl_consistency.entrypoints <argv> --dry-run --json``: how the
   real ``verl-consistency run`` parses what arrived (run id, model path, phase, capture, pools);
3. for ``run fully-async``: placement_driver.py on the job's own Ray cluster, with the pool sizes
   that arrived, in the environment the real ``verl-consistency run`` gives verl (the dry
   run's ``env``, e.g. ``RAY_OVERRIDE_JOB_RUNTIME_ENV``), and no runtime env of its own: the
   placement hook can only come from the submitted runtime env. It builds the installed verl's
   real trainer and rollout pools (0.8.0's fully_async_policy, or 0.9's V1 separate_async).

The record is one JSON file per call in ``$STANDIN_VERL_CONSISTENCY_RECORDS`` (a variable that
only the test's head process has).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

DRIVER = Path(__file__).with_name("placement_driver.py")
sys.path.insert(0, str(DRIVER.parent))  # run as a script on the Ray head, beside the driver
from placement_driver import read_result  # noqa: E402

RECORDS_ENV = "STANDIN_VERL_CONSISTENCY_RECORDS"


def overrides(argv: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("-"))


def main(argv: list[str]) -> int:
    record: dict[str, Any] = {
        "argv": argv,
        "job_config": json.loads(os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR, "null")),
        "ray_address": os.environ.get("RAY_ADDRESS"),
        "env_run_id": os.environ.get("RUN_ID"),
    }
    records = Path(os.environ[RECORDS_ENV])
    rc = 0
    try:
        res = subprocess.run(
            [sys.executable, "-m", "verl_consistency.entrypoints", *argv, "--dry-run", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        record["dry_run"] = {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr[-3000:]}
        rc = res.returncode
        if res.returncode == 0 and argv[:2] == ["run", "fully-async"]:
            plan = json.loads(res.stdout)
            ov = overrides(argv)
            # verl 0.9 (the next pin set) reads the rollout pool's size under actor_rollout_ref
            rollout = "rollout" if "rollout.nnodes" in ov else "actor_rollout_ref.rollout"
            scenario = {
                "name": "job",
                "trainer_nodes": int(ov["trainer.nnodes"]),
                "trainer_npus": int(ov["trainer.n_gpus_per_node"]),
                "rollout_nodes": int(ov[f"{rollout}.nnodes"]),
                "rollout_npus": int(ov[f"{rollout}.n_gpus_per_node"]),
            }
            res = subprocess.run(
                [sys.executable, str(DRIVER), str(os.environ["RAY_ADDRESS"]), json.dumps([scenario])],
                capture_output=True,
                text=True,
                timeout=600,
                env={**os.environ, **plan["env"]},  # RunPlan.child_env, as `run` starts verl
            )
            result = read_result(res.stdout)
            record["placement"] = result["job"]["pgs"] if result else None
            record["placement_log"] = res.stderr[-5000:] if res.returncode or not result else ""
            rc = rc or res.returncode
    finally:
        tmp = records / f".record-{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(records / f"record-{os.getpid()}.json")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
