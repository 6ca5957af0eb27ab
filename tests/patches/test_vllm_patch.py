"""The vllm-ascend series against the REAL pinned ``model_runner_v1.py`` of the pin set in force.

The patched runner needs torch_npu and CANN, so it cannot run here. What can be checked is its
real patched source, with ``ast``: the dispatch hook sits at the start site after
``_prepare_inputs``, the per-pid dump folder is a constructor override, and every started step
reaches exactly one stop+step on every path out of ``execute_model`` (its two early returns, and
the main path that stops in ``sample_tokens()``). The same checker run on the pristine file must
find the gaps, so it is known to be able to fail.

Two upstream shapes, told apart by what the file holds, not by line numbers:

* 0.18.0 (current set): ``debugger.start``/``stop``/``step`` inline in ``execute_model`` and
  ``sample_tokens``; the patch guards each stop site with ``self._vc_dispatch.finish()``.
* 0.23.0.post1 (next set): upstream's ``_start_dump_data``/``_finalize_dump_data`` helpers guarded
  by ``self._debugger_started``; upstream's start runs before ``_prepare_inputs`` and the patch
  moves it below, through the hook, whose answer becomes ``self._debugger_started``. The stop
  sites are upstream's ``self._finalize_dump_data()`` calls.
"""

from __future__ import annotations

import ast
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from verl_consistency.contracts import pins
from verl_consistency.patches.tooling import apply, upstream

pytestmark = [pytest.mark.upstream, pytest.mark.pinset]

RUNNER = "vllm_ascend/worker/model_runner_v1.py"
PATCH = "vllm-ascend/0001-dispatch-log-selective-dump.patch"


@pytest.fixture(scope="session")
def ascend_wheel() -> Path:
    return upstream.fetch_wheel("vllm-ascend")


def _sdist_top(dist: Path) -> str:
    return dist.name.removesuffix(".tar.gz") + "/"


def read_member(dist: Path, member: str) -> bytes:
    """One file of a pinned distribution, by its package-relative path (wheel or sdist).

    vllm-ascend 0.23.0.post1 is an sdist only; its files sit under ``<name>-<version>/``, which
    ``upstream.unpack`` strips, so the same relative path names them in both kinds.
    """
    if dist.name.endswith(".tar.gz"):
        with tarfile.open(dist) as tf:
            f = tf.extractfile(_sdist_top(dist) + member)
            assert f is not None, f"{dist.name}: {member} is not a file"
            return f.read()
    with zipfile.ZipFile(dist) as zf:
        return zf.read(member)


def write_like(dist: Path, dest: Path, files: dict[str, bytes]) -> None:
    """A distribution of ``dist``'s kind at ``dest`` that holds only ``files`` (for doctored caches)."""
    if dist.name.endswith(".tar.gz"):
        with tarfile.open(dest, "w:gz") as out:
            for name, data in files.items():
                info = tarfile.TarInfo(_sdist_top(dist) + name)
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
        return
    with zipfile.ZipFile(dest, "w") as out:
        for name, data in files.items():
            out.writestr(name, data)


def _pristine_tree(wheel: Path, dest: Path, runner: str = RUNNER) -> Path:
    """The runner file of the pinned distribution, unpacked into a site-packages-like folder."""
    target = dest / runner
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(read_member(wheel, runner))
    return dest


def patched_tree(wheel: Path, dest: Path, patch: str = PATCH, runner: str = RUNNER) -> Path:
    """The same, with the component's series applied: exactly ``patch`` (``component/name``)."""
    component, name = patch.split("/")
    tree = _pristine_tree(wheel, dest, runner)
    results = apply.apply_series(component, tree)
    assert [p.name for p, status in results if status == "applied"] == [name]
    return tree


@pytest.fixture
def pristine(tmp_path: Path, ascend_wheel: Path) -> Path:
    return _pristine_tree(ascend_wheel, tmp_path / "pristine")


@pytest.fixture
def patched(tmp_path: Path, ascend_wheel: Path) -> Path:
    return patched_tree(ascend_wheel, tmp_path / "patched")


# ----------------------------------------------------------------------------- the AST checker


def _is_self_attr(node: ast.AST, *chain: str) -> bool:
    """``node`` is ``self.<chain[0]>.<chain[1]>...``."""
    for name in reversed(chain):
        if not (isinstance(node, ast.Attribute) and node.attr == name):
            return False
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def _calls(tree: ast.AST, *chain: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_self_attr(n.func, *chain)]


def _method(module: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{cls}.{name} not found")


def _parents(root: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(root) for child in ast.iter_child_nodes(node)}


def _is_stop_site(stmt: ast.stmt) -> bool:
    """``if self.debugger is not None and self._vc_dispatch.finish(): stop(); step()``."""
    if not isinstance(stmt, ast.If):
        return False
    test = stmt.test
    guarded = (
        isinstance(test, ast.BoolOp)
        and isinstance(test.op, ast.And)
        and any(
            isinstance(v, ast.Call) and _is_self_attr(v.func, "_vc_dispatch", "finish") for v in test.values
        )
    )
    body = [s.value for s in stmt.body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    stops = [
        c
        for c in body
        if _is_self_attr(c.func, "debugger", "stop") or _is_self_attr(c.func, "debugger", "step")
    ]
    return (
        guarded
        and len(stops) == 2
        and _is_self_attr(stops[0].func, "debugger", "stop")
        and _is_self_attr(stops[1].func, "debugger", "step")
        and not stmt.orelse
    )


def _unconditional(node: ast.AST, fn: ast.FunctionDef, parents: dict[ast.AST, ast.AST]) -> bool:
    """Only ``with`` blocks lie between ``node`` and the function body."""
    cur = parents[node]
    while cur is not fn:
        if not isinstance(cur, ast.With):
            return False
        cur = parents[cur]
    return True


def _body_of(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[ast.stmt]:
    parent = parents[node]
    for field in ("body", "orelse", "finalbody"):
        seq = getattr(parent, field, None)
        if isinstance(seq, list) and node in seq:
            return seq
    raise AssertionError(f"statement at line {getattr(node, 'lineno', '?')} is in no block")


def start_site(
    module: ast.Module, cls: str, attn_name: str, attn_ok: Callable[[ast.expr], bool]
) -> tuple[ast.FunctionDef, ast.FunctionDef, ast.Call | None, list[str]]:
    """execute_model, sample_tokens, the one dispatch start site in execute_model, and its problems.

    The hook is called as ``start(debugger, model, scheduler_output, <attention state>, order)``;
    only the fourth argument differs between runners (vllm-ascend's ``self.attn_state``, vLLM's
    ``None``), so ``attn_ok`` judges it and ``attn_name`` names it in the message.
    """
    execute = _method(module, cls, "execute_model")
    sample = _method(module, cls, "sample_tokens")
    starts = _calls(execute, "_vc_dispatch", "start")
    if len(starts) != 1 or _calls(module, "_vc_dispatch", "start") != starts:
        return (
            execute,
            sample,
            None,
            [f"execute_model: expected one dispatch start site, found {len(starts)}"],
        )
    start, args = starts[0], starts[0].args
    if (
        len(args) == 5
        and _is_self_attr(args[0], "debugger")
        and _is_self_attr(args[1], "model")
        and isinstance(args[2], ast.Name)
        and args[2].id == "scheduler_output"
        and attn_ok(args[3])
        and _is_self_attr(args[4], "input_batch", "req_ids")
    ):
        return execute, sample, start, []
    message = f"L{start.lineno}: hook args must be (debugger, model, scheduler_output, {attn_name}, order)"
    return execute, sample, start, [message]


def _is_finalize_site(stmt: ast.stmt) -> bool:
    """``self._finalize_dump_data()``: vllm-ascend 0.23's stop site (stop+step of a started step)."""
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and _is_self_attr(stmt.value.func, "_finalize_dump_data")
        and not stmt.value.args
        and not stmt.value.keywords
    )


def check_step_paths(
    execute: ast.FunctionDef,
    start: ast.Call,
    sample: ast.FunctionDef,
    is_stop: Callable[[ast.stmt], bool] = _is_stop_site,
) -> list[str]:
    """Every path out of a started step ends in exactly one stop+step (vllm-ascend's and vLLM's runner).

    After the start, each return of execute_model has a stop site just before it, or is the main
    path, which hands the step to sample_tokens through ``self.execute_model_state``; sample_tokens
    stops unconditionally, returns nothing between the handoff and its stop, and returns early only
    when no step is pending. ``is_stop`` says what a stop site is in the release at hand.
    """
    problems: list[str] = []
    # every path out of execute_model after the start: a stop site just before its return, or
    # the main path, which hands the step to sample_tokens through self.execute_model_state
    parents = _parents(execute)
    handoffs = [
        n
        for n in ast.walk(execute)
        if isinstance(n, ast.Assign)
        and _is_self_attr(n.targets[0], "execute_model_state")
        and isinstance(n.value, ast.Call)
        and getattr(n.value.func, "id", None) == "ExecuteModelState"
    ]
    for ret in (n for n in ast.walk(execute) if isinstance(n, ast.Return) and n.lineno > start.lineno):
        block = _body_of(ret, parents)
        before = block[: block.index(ret)]
        if any(is_stop(s) for s in before):
            continue
        is_main = ret is execute.body[-1] and isinstance(ret.value, ast.Constant) and ret.value.value is None
        if not (is_main and handoffs and all(_unconditional(h, execute, parents) for h in handoffs)):
            problems.append(f"execute_model L{ret.lineno}: a started step returns without stop+step")

    # sample_tokens: only a handed-off step reaches its stop site, and nothing returns before it
    sparents = _parents(sample)
    unpack = [
        n
        for n in ast.walk(sample)
        if isinstance(n, ast.Assign) and _is_self_attr(n.value, "execute_model_state")
    ]
    sample_stop = [s for s in ast.walk(sample) if isinstance(s, ast.stmt) and is_stop(s)]
    if len(unpack) != 1 or len(sample_stop) != 1:
        problems.append("sample_tokens: expected one unpack of execute_model_state and one stop site")
        return problems
    if not _unconditional(sample_stop[0], sample, sparents):
        problems.append(f"sample_tokens L{sample_stop[0].lineno}: the stop site is conditional")
    for ret in (n for n in ast.walk(sample) if isinstance(n, ast.Return)):
        if unpack[0].lineno < ret.lineno < sample_stop[0].lineno:
            problems.append(f"sample_tokens L{ret.lineno}: returns between the handoff and the stop site")
        if ret.lineno < unpack[0].lineno:
            guard = sparents[ret]
            while not (
                isinstance(guard, ast.If)
                and isinstance(guard.test, ast.Compare)
                and _is_self_attr(guard.test.left, "execute_model_state")
            ):
                guard = sparents.get(guard, sample)
                if guard is sample:
                    problems.append(f"sample_tokens L{ret.lineno}: early return with a step pending")
                    break
    return problems


def has_dump_helpers(module: ast.Module) -> bool:
    """vllm-ascend 0.23's shape: start/stop live in ``_start_dump_data``/``_finalize_dump_data``."""
    try:
        _method(module, "NPUModelRunner", "_finalize_dump_data")
    except AssertionError:
        return False
    return True


def _in(node: ast.AST, fn: ast.FunctionDef) -> bool:
    return fn.lineno <= getattr(node, "lineno", -1) <= (fn.end_lineno or 0)


def _check_init(init: ast.FunctionDef, helpers: bool) -> list[str]:
    """The debugger's construction: per-pid dump folder as a constructor override."""
    problems: list[str] = []
    makes = [
        n
        for n in ast.walk(init)
        if isinstance(n, ast.Assign)
        and _is_self_attr(n.targets[0], "debugger")
        and isinstance(n.value, ast.Call)
        and getattr(n.value.func, "id", None) == "PrecisionDebugger"
    ]
    if not makes:
        problems.append("__init__: PrecisionDebugger is not constructed")
    for make in makes:
        kws = {k.arg: k.value for k in make.value.keywords}  # type: ignore[attr-defined]
        dump_path = kws.get("dump_path")
        if dump_path is None or not any(
            _is_self_attr(n, "_vc_dispatch", "dump_path") for n in ast.walk(dump_path)
        ):
            problems.append(
                f"__init__ L{make.lineno}: PrecisionDebugger(...) lacks dump_path=<per-pid folder>"
            )
    hook_made = [
        n
        for n in ast.walk(init)
        if isinstance(n, ast.Assign)
        and _is_self_attr(n.targets[0], "_vc_dispatch")
        and isinstance(n.value, ast.Call)
    ]
    if not hook_made or (makes and hook_made[0].lineno > makes[0].lineno):
        problems.append("__init__: the DispatchLogger is not made before the debugger")
    if helpers and not any(
        isinstance(n, ast.Assign)
        and _is_self_attr(n.targets[0], "_vc_dispatch")
        and isinstance(n.value, ast.Constant)
        and n.value.value is None
        for n in init.body
    ):
        # execute_model reads self._vc_dispatch on every step, graph mode and no dump included
        problems.append("__init__: self._vc_dispatch = None is not set unconditionally")
    return problems


def _check_inline_stops(module: ast.Module, execute: ast.FunctionDef, sample: ast.FunctionDef) -> list[str]:
    """0.18.0: no direct start; each stop is finish()-guarded; 2 in execute_model, 1 in sample_tokens."""
    problems: list[str] = []
    for call in _calls(module, "debugger", "start"):
        problems.append(
            f"L{call.lineno}: self.debugger.start() called directly, not through the dispatch hook"
        )
    stop_calls = _calls(module, "debugger", "stop")
    all_parents = _parents(module)
    for call in stop_calls:
        stmt = all_parents[all_parents[call]]  # Call → Expr → If
        if not _is_stop_site(stmt):
            problems.append(f"L{call.lineno}: debugger.stop() is not in a finish()-guarded stop+step site")
    where = {
        "execute_model": len([c for c in stop_calls if _in(c, execute)]),
        "sample_tokens": len([c for c in stop_calls if _in(c, sample)]),
    }
    if where != {"execute_model": 2, "sample_tokens": 1} or len(stop_calls) != 3:
        problems.append(f"stop sites: expected 2 in execute_model and 1 in sample_tokens, found {where}")
    return problems


def _check_helper_starts(module: ast.Module, execute: ast.FunctionDef) -> list[str]:
    """0.23: msprobe starts only in ``_start_dump_data``, which execute_model calls only without the hook."""
    problems: list[str] = []
    helper = _method(module, "NPUModelRunner", "_start_dump_data")
    for call in _calls(module, "debugger", "start"):
        if not _in(call, helper):
            problems.append(
                f"L{call.lineno}: self.debugger.start() called directly, not through the dispatch hook"
            )
    parents = _parents(execute)
    for call in _calls(execute, "_start_dump_data"):
        guard = parents[parents[call]]  # Call → Expr → If
        if not (
            isinstance(guard, ast.If)
            and isinstance(guard.test, ast.Compare)
            and _is_self_attr(guard.test.left, "_vc_dispatch")
            and isinstance(guard.test.ops[0], ast.Is)
        ):
            problems.append(
                f"L{call.lineno}: self._start_dump_data() called directly in execute_model, "
                "not only without the dispatch hook (graph mode)"
            )
    return problems


def _check_helper_stops(
    module: ast.Module, execute: ast.FunctionDef, start: ast.Call, sample: ast.FunctionDef
) -> list[str]:
    """0.23: the hook's answer is ``_debugger_started``, which ``_finalize_dump_data`` obeys and clears."""
    problems: list[str] = []
    parents = _parents(execute)
    stmt = parents[start]
    if not (isinstance(stmt, ast.Assign) and _is_self_attr(stmt.targets[0], "_debugger_started")):
        problems.append(f"L{start.lineno}: the hook's answer must become self._debugger_started")
    guard = parents[stmt]
    if not (
        isinstance(guard, ast.If)
        and isinstance(guard.test, ast.Compare)
        and _is_self_attr(guard.test.left, "_vc_dispatch")
        and parents[guard] is execute
    ):
        problems.append(f"L{start.lineno}: the start site is conditional on more than the dispatch hook")
    final = _method(module, "NPUModelRunner", "_finalize_dump_data")
    first = final.body[0]
    if not (
        isinstance(first, ast.If)
        and any(_is_self_attr(n, "_debugger_started") for n in ast.walk(first.test))
        and isinstance(first.body[-1], ast.Return)
    ):
        problems.append(f"L{final.lineno}: _finalize_dump_data does not return early unless started")
    if not any(
        isinstance(n, ast.Assign)
        and _is_self_attr(n.targets[0], "_debugger_started")
        and isinstance(n.value, ast.Constant)
        and n.value.value is False
        for n in ast.walk(final)
    ):
        problems.append(f"L{final.lineno}: _finalize_dump_data does not clear self._debugger_started")
    for call in _calls(module, "debugger", "stop"):
        if not _in(call, final):
            problems.append(f"L{call.lineno}: debugger.stop() outside _finalize_dump_data")
    finals = [s for s in ast.walk(execute) if isinstance(s, ast.stmt) and _is_finalize_site(s)]
    where = {
        "execute_model": len([s for s in finals if s.lineno > start.lineno]),
        "sample_tokens": len(
            [s for s in ast.walk(sample) if isinstance(s, ast.stmt) and _is_finalize_site(s)]
        ),
    }
    if where != {"execute_model": 2, "sample_tokens": 1}:
        problems.append(f"stop sites: expected 2 in execute_model and 1 in sample_tokens, found {where}")
    return problems + check_step_paths(execute, start, sample, _is_finalize_site)


def check_runner(source: str) -> list[str]:
    """Problems of a model_runner_v1.py as the patch must leave it (empty list: all good)."""
    module = ast.parse(source)
    helpers = has_dump_helpers(module)
    problems = _check_init(_method(module, "NPUModelRunner", "__init__"), helpers)
    execute, sample, start, found = start_site(
        module, "NPUModelRunner", "attn_state", lambda a: _is_self_attr(a, "attn_state")
    )
    if helpers:
        problems += _check_helper_starts(module, execute)
    problems += found
    if start is None:
        return problems if helpers else problems + _check_inline_stops(module, execute, sample)
    prepare = _calls(execute, "_prepare_inputs")
    forward = _calls(execute, "_model_forward")
    if not prepare or prepare[0].lineno > start.lineno:
        problems.append("the start site runs before _prepare_inputs has set self.attn_state")
    if not forward or forward[0].lineno < start.lineno:
        problems.append("the start site is not before the model forward")
    if helpers:
        return problems + _check_helper_stops(module, execute, start, sample)
    return problems + _check_inline_stops(module, execute, sample) + check_step_paths(execute, start, sample)


# ----------------------------------------------------------------------------- the tests


def test_patched_runner_pairs_every_start_with_one_stop_and_step(patched):
    source = (patched / RUNNER).read_text()
    assert check_runner(source) == []
    assert "from verl_consistency.patches.hooks.rollout.dispatch import DispatchLogger" in source
    compile(source, RUNNER, "exec")


def test_the_checker_finds_the_gaps_of_the_pristine_runner(pristine):
    problems = check_runner((pristine / RUNNER).read_text())
    assert any("lacks dump_path" in p for p in problems)
    assert any("called directly" in p for p in problems)
    assert any("expected one dispatch start site" in p for p in problems)


def _breakages(source: str) -> list[tuple[str, str, str]]:
    """(old, new, expected problem): ways the patched runner can lose a stop+step, per release."""
    if has_dump_helpers(ast.parse(source)):
        return [
            # the hook starts msprobe but upstream's flag does not know: _finalize_dump_data skips
            (
                "            self._debugger_started = self._vc_dispatch.start(\n",
                "            self._vc_dispatch.start(\n",
                "must become self._debugger_started",
            ),
            # the main path's stop in sample_tokens is gone
            (
                "        self._finalize_dump_data()\n\n        if self.need_accepted_tokens:",
                "        if self.need_accepted_tokens:",
                "stop sites",
            ),
        ]
    return [
        (
            "        if self.debugger is not None and self._vc_dispatch.finish():\n"
            "            self.debugger.stop()",
            "        if self.debugger is not None:\n            self.debugger.stop()",
            "not in a finish()-guarded",
        )
    ]


def test_the_checker_catches_a_stop_site_broken(patched):
    source = (patched / RUNNER).read_text()
    for old, new, needle in _breakages(source):
        assert source.count(old) == 1, old
        problems = check_runner(source.replace(old, new))
        assert any(needle in p for p in problems), (needle, problems)


def test_series_is_idempotent_and_verifies(patched):
    before = (patched / RUNNER).read_text()
    assert [s for _, s in apply.apply_series("vllm-ascend", patched)] == ["already applied"]
    assert (patched / RUNNER).read_text() == before
    assert [p.name for p in apply.verify_series("vllm-ascend", patched)] == [PATCH.split("/")[1]]


def _doctor(text: str) -> str:
    """An upstream change inside hunk #2's context (the start site that the patch replaces)."""
    if has_dump_helpers(ast.parse(text)):  # 0.23: the line after upstream's early start
        old = "        # self._draft_token_ids is None when `input_fits_in_drafter=False`\n"
        new = "        # self._draft_token_ids is None when the input does not fit the drafter\n"
    else:  # 0.18: the inline start's level rule
        old = '            if dump_level in ("L0", "MIX"):\n'
        new = '            if dump_level in ("L0", "MIX", "L2"):\n'
    assert text.count(old) == 1
    return text.replace(old, new)


def test_changed_upstream_file_fails_naming_patch_file_and_hunk(pristine):
    runner = pristine / RUNNER
    runner.write_text(_doctor(runner.read_text()))
    before = runner.read_bytes()
    with pytest.raises(apply.PatchError) as err:
        apply.apply_series("vllm-ascend", pristine)
    msg = str(err.value)
    assert PATCH in msg
    assert f"{RUNNER}: hunk #2" in msg
    assert runner.read_bytes() == before, "a failed series must leave the tree untouched"


def _doctored_cache(real: Path, cache: Path, ascend_wheel: Path) -> None:
    """A download cache whose vllm-ascend distribution (wheel or sdist) carries a changed runner."""
    verl = upstream.fetch_wheel("verl", real)
    (cache / verl.parent.name).mkdir(parents=True)
    os.symlink(verl, cache / verl.parent.name / verl.name)
    dest = cache / ascend_wheel.parent.name / ascend_wheel.name
    dest.parent.mkdir(parents=True)
    write_like(ascend_wheel, dest, {RUNNER: _doctor(read_member(ascend_wheel, RUNNER).decode()).encode()})


def test_check_patches_fails_on_a_doctored_wheel(tmp_path, ascend_wheel, repo):
    cache = tmp_path / "cache"
    _doctored_cache(upstream.cache_dir(), cache / "upstream", ascend_wheel)
    res = subprocess.run(
        # only the set in force: the doctored cache holds none of the other set's releases
        [
            sys.executable,
            "-m",
            "verl_consistency.patches",
            "check",
            "--cache",
            str(cache),
            "--set",
            pins.selected(),
        ],
        cwd=repo,
        env={**os.environ, "COLUMNS": "1000"},  # rich wraps the error at the terminal width
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert PATCH in out
    assert f"{RUNNER}: hunk #2" in out
    assert "check-patches: OK" not in out


def _iter_diff_headers(text: str) -> Iterator[str]:
    return (line for line in text.splitlines() if line.startswith(("--- ", "+++ ")))


def test_patch_headers_use_package_relative_paths():
    patches = [p for p in apply.read_series("vllm-ascend")]
    assert patches, "the vllm-ascend series is empty"
    for p in patches:
        assert list(_iter_diff_headers(p.text)) == [f"--- a/{RUNNER}", f"+++ b/{RUNNER}"]
        header = p.text.split("\n--- ", 1)[0]
        assert "Why:" in header
        assert "sample_tokens()" in header, "the header must name the recipe bug it fixes"
    assert shutil.which("patch"), "GNU patch is needed to apply the series"
