"""--dry-run prints the exact environment and command (shell form and JSON), and writes nothing,
and says which pin set and verl trainer mode it uses."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verl_consistency.contracts import pins
from verl_consistency.entrypoints.cli import app
from verl_consistency.entrypoints.run.overrides import (
    CURRENT,
    LAUNCH,
    MODEL_PATH_KEY,
    NEXT,
    PIN_SETS,
    Launch,
    Mode,
    Table,
    launch,
    pin_set,
)

from .conftest import MODEL, supported

pytestmark = pytest.mark.pinset

ARGS = ["run", "fully-async", "--dry-run", "--dump-root", "/dump", "--run-id", "demo", f"model={MODEL}"]


def _run(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env=dict.fromkeys(("DUMP_ON", "VERL_CONSISTENCY_RUN_ID")))
    assert result.exit_code == 0, result.output
    return result.output


def test_shell_form_is_exactly_the_json_plan() -> None:
    text = _run(*ARGS)
    plan = json.loads(_run(*ARGS, "--json"))
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    words = shlex.split(body.replace("\\\n", " "))
    assert words[0] == "env"
    n_env = len(plan["env"])
    assert dict(w.split("=", 1) for w in words[1 : 1 + n_env]) == plan["env"]
    assert words[1 + n_env :] == plan["argv"]
    assert "# run folder: /dump/demo" in text
    assert "# then: verl-consistency postprocess /dump/demo" in text


def test_json_plan_command_env_and_paths() -> None:
    plan = json.loads(_run(*ARGS, "--json"))
    module = {CURRENT: "verl.experimental.fully_async_policy.fully_async_main", NEXT: "verl.trainer.main_ppo"}
    assert plan["argv"][1:3] == ["-m", module[pin_set()]]
    assert plan["module"] == Mode.FULLY_ASYNC.module
    assert plan["pin_set"] == pin_set()
    assert plan["trainer_mode"] == {CURRENT: None, NEXT: "separate_async"}[pin_set()]
    # ride-along (the default): no PROMPTS_ONLY; verl 0.8.0's fully-async turns bypass mode on,
    # so the run dumps update_actor there (test_ride_along.py)
    assert plan["env"] == {
        "DUMP_ON": "1",
        "DUMP_PHASE": {CURRENT: "update_actor", NEXT: "log_prob"}[pin_set()],
        "VERL_CONSISTENCY_TOKEN_LEVEL": "1",
        "VERL_CONSISTENCY_ACTOR_CONFIG": "/dump/demo/config/msprobe_actor.json",
        "VERL_CONSISTENCY_RUN_DIR": "/dump/demo",
        "VERL_CONSISTENCY_CAPTURE": "fraction:1",
        "VLLM_USE_V2_MODEL_RUNNER": "0",
        "TORCHDYNAMO_DISABLE": "1",
        "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
    }
    assert f"{MODEL_PATH_KEY}={MODEL}" in plan["overrides"]
    assert (
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config="
        "{dump_config_path:/dump/demo/config/msprobe_rollout.json}"
    ) in plan["overrides"]
    assert plan["run_dir"] == "/dump/demo"
    assert plan["paths"]["rollout_config"] == "config/msprobe_rollout.json"
    assert plan["msprobe"]["rollout"]["dump_path"] == "/dump/demo/rollout"
    assert plan["msprobe"]["actor"]["dump_path"] == "/dump/demo/actor"
    assert plan["invocation"][:3] == ["verl-consistency", "run", "fully-async"]


@pytest.mark.parametrize("mode", ["hybrid", "fully-async"])
def test_dry_run_shows_the_default_capture_and_what_it_dumps(mode: str) -> None:
    """No --capture: every request, one lane per comparable request; the text says so."""
    text = " ".join(_run("run", mode, *ARGS[2:]).split())
    assert "# capture: fraction:1: every request;" in text
    assert "one lane (req{k}/) per such request" in text
    assert "decode steps, chunked prefills and prefix-cache hits are not dumped" in text
    plan = json.loads(_run("run", mode, *ARGS[2:], "--json"))
    assert plan["capture"] == "fraction:1"
    assert plan["env"]["VERL_CONSISTENCY_CAPTURE"] == "fraction:1"
    assert plan["msprobe"]["rollout"]["task"] == "statistics"


def test_capture_all_is_still_the_recipe() -> None:
    """--capture all: every step whole, decodes included (opt-in), statistics, no request scope."""
    text = " ".join(_run(*ARGS, "--capture", "all").split())
    assert "# capture: all (the recipe): every vLLM step is dumped whole, decodes included" in text
    plan = json.loads(_run(*ARGS, "--capture", "all", "--json"))
    assert plan["env"]["VERL_CONSISTENCY_CAPTURE"] == "all"
    rollout = plan["msprobe"]["rollout"]
    assert rollout["task"] == "statistics"
    assert "request_id" not in rollout["statistics"]


def test_invocation_reproduces_the_plan() -> None:
    """What the run manifest records as `invocation` gives the same plan again."""
    plan = json.loads(_run(*ARGS, "--phase", "all", "--capture", "fraction:0.5", "--steps", "0-3", "--json"))
    again = json.loads(_run(*plan["invocation"][1:], "--dry-run", "--json"))
    assert again == plan


def test_hybrid_differs_where_the_table_says() -> None:
    hybrid = json.loads(_run("run", "hybrid", *ARGS[2:], "--json"))
    fully = json.loads(_run(*ARGS, "--json"))
    assert hybrid["argv"][2] == "verl.trainer.main_ppo"
    assert "TORCHDYNAMO_DISABLE" not in hybrid["env"]
    assert "actor_rollout_ref.hybrid_engine=false" in fully["overrides"]
    assert not any(o.startswith("actor_rollout_ref.hybrid_engine") for o in hybrid["overrides"])


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    _run("run", "hybrid", "--dry-run", "--dump-root", str(tmp_path), "--run-id", "x")
    assert list(tmp_path.iterdir()) == []


def test_default_run_id_comes_from_the_layout() -> None:
    plan = json.loads(_run("run", "hybrid", "--dry-run", "--json", "--dump-root", "/dump"))
    assert plan["run_id"].startswith("hybrid-")
    assert plan["run_dir"] == f"/dump/{plan['run_id']}"


def test_table_is_exported_as_json() -> None:
    table = json.loads(_run("run", "hybrid", "--table"))
    assert table == json.loads(Table().model_dump_json())
    assert {r["key"] for r in table["required"]} >= {
        "actor_rollout_ref.rollout.enforce_eager",
        "algorithm.rollout_correction",
    }
    (correction,) = [r for r in table["required"] if r["key"] == "algorithm.rollout_correction"]
    assert correction["kinds"] == ["prompts-only"]


def test_every_pin_set_has_a_run_table() -> None:
    assert set(pins.set_names()) == PIN_SETS == set(LAUNCH)
    for modes in LAUNCH.values():
        assert set(modes) == set(Mode)


@pytest.mark.parametrize("mode", list(Mode))
def test_dry_run_says_the_set_and_trainer_mode(mode: Mode) -> None:
    if not supported(mode.value):
        pytest.skip(f"{mode.value} is not run on pin set {pin_set()!r}")
    text = _run("run", mode.value, "--dry-run", "--dump-root", "/dump", "--run-id", "demo")
    how = launch(mode)
    header = text.splitlines()[1]
    assert header.startswith(f"# pin set: {pin_set()} (verl {pins.get('upstream.verl')})")
    assert f"verl module: {how.module}" in header
    if how.trainer_mode:
        assert f"trainer.v1.trainer_mode={how.trainer_mode}" in header
        assert f"trainer.v1.trainer_mode={how.trainer_mode}" in text.split("-m", 1)[1]
        assert "trainer.use_v1=true" in text
    else:
        assert "trainer.use_v1" not in text
        assert "trainer.v1." not in text


def test_a_mode_the_set_cannot_run_is_refused_with_the_reason(tmp_path: Path) -> None:
    refused = [(m, how) for m, how in LAUNCH[pin_set()].items() if not isinstance(how, Launch)]
    if pin_set() == CURRENT:
        assert [m for m, _ in refused] == [Mode.COLOCATE_ASYNC]
    for mode, how in refused:
        result = CliRunner().invoke(app, ["run", mode.value, "--dump-root", str(tmp_path), "--run-id", "x"])
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert f"not available on pin set {pin_set()!r}" in text
        assert how.why.split(";")[0] in text
        assert list(tmp_path.iterdir()) == []


def test_next_set_modes_all_run_main_ppo_with_their_trainer_mode() -> None:
    """The brief of the next set: one module, the trainer mode from the mode argument."""
    got = {m: (how.module, how.trainer_mode) for m, how in LAUNCH[NEXT].items() if isinstance(how, Launch)}
    assert got == {
        Mode.HYBRID: ("verl.trainer.main_ppo", "sync"),
        Mode.FULLY_ASYNC: ("verl.trainer.main_ppo", "separate_async"),
        Mode.COLOCATE_ASYNC: ("verl.trainer.main_ppo", "colocate_async"),
    }
