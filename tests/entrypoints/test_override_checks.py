"""`run` refuses at once two mistakes verl would take silently or late (override_checks.py).

A Ray environment variable that Hydra reads as anything but a string (Ray raises TypeError at
``ray.init``, some 24 s into the run), and a key given twice (Hydra takes the last one without a
word; on Kubernetes VERL_OVERRIDES comes after the keys the manifest sets). Through the real CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from verl_consistency.entrypoints.cli import app

ENV = "+ray_kwargs.ray_init.runtime_env.env_vars"


def run(tmp_path: Path, *overrides: str, mode: str = "hybrid") -> Result:
    return CliRunner().invoke(
        app,
        ["run", mode, "--dry-run", "--json", "--dump-root", str(tmp_path), "--run-id", "r1", *overrides],
        env=dict.fromkeys(("DUMP_ON",)),
    )


@pytest.mark.parametrize(
    ("override", "read_as", "fix"),
    [
        (f"{ENV}.MY_FLAG=1", "an integer", f"{ENV}.MY_FLAG='1'"),
        (f"{ENV}.MY_FLAG=true", "a boolean", f"{ENV}.MY_FLAG='true'"),
        (f"{ENV}.MY_FLAG=0.5", "a number", f"{ENV}.MY_FLAG='0.5'"),
        (f"{ENV}.MY_FLAG=null", "null", f"{ENV}.MY_FLAG='null'"),
    ],
)
def test_a_ray_env_var_that_is_not_a_string_is_refused(tmp_path: Path, override, read_as, fix) -> None:
    res = run(tmp_path, override)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert f"refused `{override}`" in text
    assert f"as {read_as}, and Ray takes only strings" in text
    assert f'in a shell: "{fix}"' in text
    assert "VERL_OVERRIDES, with the quotes escaped: " + fix.replace("'", "\\'") in text
    assert list(tmp_path.iterdir()) == []


def test_the_quoted_spelling_passes(tmp_path: Path) -> None:
    res = run(tmp_path, f"{ENV}.MY_FLAG='1'", f'{ENV}.OTHER="x y"')
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["argv"][-2:] == [f"{ENV}.MY_FLAG='1'", f'{ENV}.OTHER="x y"']


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    res = run(tmp_path, "data.train_batch_size=16", "trainer.nnodes=2", "data.train_batch_size=32")
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert (
        "refused `data.train_batch_size=32`: data.train_batch_size is given twice "
        "(first as `data.train_batch_size=16`)" in text
    )
    assert "1 problem(s)" in text  # trainer.nnodes once is fine; no Kubernetes hint for a batch size
    assert "NPUS_PER_NODE" not in text


@pytest.mark.parametrize(
    "overrides",
    [
        ("model=/models/a", "actor_rollout_ref.model.path=/models/b"),
        ("rollout.n_gpus_per_node=8", "rollout.n_gpus_per_node=4"),
    ],
)
def test_a_key_the_manifest_sets_names_its_setting(tmp_path: Path, overrides: tuple[str, str]) -> None:
    res = run(tmp_path, *overrides, mode="fully-async")
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "is given twice" in text
    assert "change MODEL_PATH, TRAINER_NODES, ROLLOUT_NODES or NPUS_PER_NODE there" in text
