"""The dispatch hook's contract that needs no msprobe: imports, dump folder choice, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from verl_consistency.contracts import records
from verl_consistency.contracts.env import RUN_DIR
from verl_consistency.patches.hooks.rollout import dispatch

# pure hook logic, no upstream source; in the pinset run so that the next set's venv (numpy 2,
# transformers 5, its torch) is shown to import and run the hook the same way
pytestmark = pytest.mark.pinset


def test_import_pulls_no_heavy_upstream():
    # torch_npu needs CANN; the hook module is imported inside the vLLM worker and in tests
    code = (
        "import sys, verl_consistency.patches.hooks.rollout.dispatch\n"
        "heavy = ('torch', 'torch_npu', 'vllm', 'vllm_ascend', 'msprobe')\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in heavy]\n"
        "print(bad)\n"
        "raise SystemExit(1 if bad else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_run_dir_gives_rollout_pid_folder(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dump_path": "/elsewhere"}))
    got = dispatch.rollout_dump_path(cfg, pid=42, environ={RUN_DIR: str(tmp_path / "run")})
    assert got == tmp_path / "run" / "rollout" / "42"


def test_a_run_dir_whose_name_is_no_run_id_is_refused_naming_the_variable(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dump_path": "/elsewhere"}))
    with pytest.raises(dispatch.ConfigError, match=rf"\${RUN_DIR}=.*My Run.*must match"):
        dispatch.rollout_dump_path(cfg, pid=42, environ={RUN_DIR: str(tmp_path / "My Run")})
    assert not (tmp_path / "My Run").exists()


def test_without_run_dir_the_configs_dump_path_is_the_root(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dump_path": str(tmp_path / "d")}))
    assert dispatch.rollout_dump_path(cfg, pid=7, environ={}) == tmp_path / "d" / "7"


@pytest.mark.parametrize(
    ("content", "needle"),
    [("{not json", "cannot read the msprobe config"), ('{"task": "statistics"}', 'no "dump_path"')],
)
def test_bad_config_names_the_file(tmp_path, content, needle):
    cfg = tmp_path / "c.json"
    cfg.write_text(content)
    with pytest.raises(dispatch.ConfigError) as err:
        dispatch.rollout_dump_path(cfg, environ={})
    assert str(cfg) in str(err.value)
    assert needle in str(err.value)
    assert cfg.read_text() == content


def test_bad_capture_spec_is_refused_before_anything_is_written(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dump_path": str(tmp_path / "d")}))
    with pytest.raises(ValueError, match="VERL_CONSISTENCY_CAPTURE"):
        dispatch.DispatchLogger.for_rollout(cfg, environ={"VERL_CONSISTENCY_CAPTURE": "half"})
    assert not (tmp_path / "d").exists()


def _req(
    rid: str, tokens: int, prompt: int | None = None, computed: int | None = 0
) -> records.ScheduledRequest:
    kind = "new" if prompt is not None else "cached"
    return records.ScheduledRequest(
        request_id=rid,
        type=kind,
        tokens=tokens,
        prompt_tokens=prompt,
        num_computed_tokens=computed if kind == "new" else None,
    )


def test_phase_follows_upstream_rule_and_falls_back_on_tokens():
    assert dispatch.phase_of("DecodeOnly", []) == "decode"
    assert dispatch.phase_of("SpecDecoding", []) == "prefill"  # upstream's != DecodeOnly
    assert dispatch.phase_of(None, [_req("a", 1), _req("b", 1)]) == "decode"
    assert dispatch.phase_of(None, [_req("a", 3, prompt=3)]) == "prefill"


def test_requests_are_put_in_packing_order():
    reqs = [_req("new-0000abcd", 3, prompt=3), _req("old-0000abcd", 1)]
    got = dispatch.in_batch_order(reqs, ["old-0000abcd", "new-0000abcd"])
    assert [r.request_id for r in got] == ["old-0000abcd", "new-0000abcd"]
    assert dispatch.in_batch_order(reqs, None) == reqs


def test_selective_mode_refuses_an_unscopable_msprobe_config_at_start_up(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L2", "dump_path": str(tmp_path / "d")}))
    env = {"VERL_CONSISTENCY_CAPTURE": "fraction:0.5"}
    with pytest.raises(dispatch.ConfigError, match="request-scoped dumps need") as err:
        dispatch.DispatchLogger.for_rollout(cfg, environ=env)
    assert str(cfg) in str(err.value)
    # the recipe's dump-everything mode does not need scoping
    dispatch.DispatchLogger.for_rollout(cfg, environ={}).close()
