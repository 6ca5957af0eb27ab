"""The import graph follows the pipeline, and every ``VERL_CONSISTENCY_*`` name has one home.

The layers (entrypoints/README.md, "Map: every module, room by room"), from the bottom:

- ``contracts`` (``patches/contracts/``, the pins reader among them): imported by every stage,
  imports no stage;
- ``patches.hooks``: runs inside vLLM and trainer processes, so it may import only contracts, and
  its rooms are one process each: ``rollout`` (vLLM workers, verl's agent loop) and ``training``
  (verl's trainer and actor ranks) never import each other; both reach ``lanes`` (the per-request
  msprobe dumps) only through its way in, ``lanes.msprobe_lanes``, and both may use ``weights`` (the
  weight check's fingerprint and record writer); ``lanes``, ``ray_setup`` and ``weights`` import no
  other room;
- ``patches.tooling`` (apply, upstream, cli) and ``postprocess``: contracts and themselves;
- ``entrypoints``: the command line, the only layer that may import all the others, and the hooks
  only to run them (a hook's constants or parsing belong in the contracts; see ``FORBIDDEN``).

``docker/`` scripts use the contracts and the patch tooling. ``bench/`` imports the bundle and its own
``bench.support`` (the one home of the stand-in models, the dump generators, the drivers and
``hardware()``, which the tests import from there), never ``tests``. Product code imports neither.

A module named in a string counts as an import (``importlib.resources.files("...")``,
``importlib.import_module("...")``, ``python -m ...``), and so does an import inside a string that
is itself a Python script (a bench's ``python -c`` step): such a link runs upward as surely as an
``import`` statement does.

And no module of the bundle imports itself back through others: no import loop, whether the
imports run at import time, inside a function, or only for the type checker (``TYPE_CHECKING``).
A loop hidden in function bodies still ties two modules into one; a constant both need belongs in
the contracts.
"""

from __future__ import annotations

import ast
import re
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from verl_consistency.contracts import env

PKG = "verl_consistency"

# group of a file (by path prefix, most specific first) -> import prefixes it may use
GROUPS: list[tuple[str, str]] = [
    ("patches/contracts/", "contracts"),
    ("patches/hooks/rollout/", "rollout"),
    ("patches/hooks/training/", "training"),
    ("patches/hooks/lanes/", "lanes"),
    ("patches/hooks/ray_setup/", "ray_setup"),
    ("patches/hooks/weights/", "weights"),
    ("patches/hooks/", "hooks"),
    ("patches/tooling/", "patches"),
    ("patches/", "patches"),
    ("postprocess/", "postprocess"),
    ("entrypoints/", "entrypoints"),
    ("docker/", "docker"),
    ("bench/", "bench"),
    ("tests/fixtures/", "fixtures"),
    ("tests/", "tests"),
]
CONTRACTS = (f"{PKG}.contracts",)
HOOKS = f"{PKG}.patches.hooks"
PATCH_TOOLS = (
    f"{PKG}.patches.tooling",
    f"{PKG}.patches.__main__",
)
"""The patch tooling, module by module: the ``patches`` prefix as a whole would let it reach the hooks."""
NAMESPACES = (PKG, f"{PKG}.patches")
"""Package roots named exactly: they hold no layer's code (``patches/__init__.py`` is a docstring;
``python -m verl_consistency.patches`` runs the tooling's ``__main__``), so naming one crosses nothing."""
LANES_WAY_IN = (f"{HOOKS}.lanes.msprobe_lanes",)
"""What a hook of another room may import of ``lanes``: its way in, not its parts."""
WEIGHTS = (f"{HOOKS}.weights",)
"""The weight check's parts both sides of a sync use (fingerprint, where records go)."""
ALLOWED: dict[str, tuple[str, ...]] = {
    "contracts": CONTRACTS,
    "hooks": CONTRACTS,
    "rollout": (*CONTRACTS, f"{HOOKS}.rollout", *LANES_WAY_IN, *WEIGHTS),
    "training": (*CONTRACTS, f"{HOOKS}.training", *LANES_WAY_IN, *WEIGHTS),
    "lanes": (*CONTRACTS, f"{HOOKS}.lanes"),
    "ray_setup": (*CONTRACTS, f"{HOOKS}.ray_setup"),
    "weights": (*CONTRACTS, *WEIGHTS),
    "patches": (*CONTRACTS, *PATCH_TOOLS),
    "postprocess": (*CONTRACTS, f"{PKG}.postprocess"),
    "entrypoints": (PKG,),
    "docker": (*CONTRACTS, *PATCH_TOOLS),
    "bench": (PKG, "bench"),
    "fixtures": (PKG, "bench", "tests.fixtures"),
    "tests": (PKG, "bench", "tests"),
}
FORBIDDEN: dict[str, tuple[str, ...]] = {
    # the hook's constants and threshold() (an environment variable's parsing) are contracts; the
    # command line must not load the training-side hook to read them
    "entrypoints": (
        f"{PKG}.patches.hooks.training.token_mismatch",
        f"{PKG}.patches.hooks.training.token_figures",
        f"{PKG}.patches.hooks.training.next_token",
        # the msprobe config's scope and module lists: contracts/msprobe_scope (issue 45)
        f"{PKG}.patches.hooks.rollout.request_scope",
    ),
}
"""Modules a group may not import although ``ALLOWED`` covers them."""


@dataclass(frozen=True)
class Violation:
    file: str
    line: int
    imported: str
    how: str = "imports"

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.how} {self.imported}"


def _group(rel: str) -> str | None:
    return next((g for prefix, g in GROUPS if rel.startswith(prefix)), None)


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """Every absolute import, including those inside functions (the hooks import lazily)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


MODULE_NAME = re.compile(rf"^(?:{PKG}|tests)(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
"""A string that is exactly a dotted name in this bundle or the tests: a module named at run time."""


def _named_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant that names one of our modules (``resources.files("pkg")`` and the like)."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.match(node.value)
    ]


def _allowed(imported: str, prefixes: tuple[str, ...]) -> bool:
    return any(imported == p or imported.startswith(p + ".") for p in prefixes)


def _crosses(imported: str, group: str) -> bool:
    ours = imported.startswith(PKG + ".") or imported == PKG
    test_code = any(imported == t or imported.startswith(t + ".") for t in ("tests", "bench"))
    if not (ours or test_code) or imported in NAMESPACES:
        return False
    return not _allowed(imported, ALLOWED[group]) or _allowed(imported, FORBIDDEN.get(group, ()))


def _embedded_scripts(tree: ast.AST) -> list[tuple[int, str]]:
    """The imports of every string constant that is a Python script (``python -c`` steps and the like).

    A string counts when it holds an import statement and parses as Python once dedented; its
    imports are reported at the string's line.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        text = node.value if isinstance(node, ast.Constant) else None
        if not isinstance(text, str) or "import " not in text:
            continue
        try:
            inner = ast.parse(textwrap.dedent(text))
        except SyntaxError:
            continue
        found += [(node.lineno, imported) for _, imported in _imports(inner)]
    return found


def layer_violations(root: Path, files: list[str]) -> list[Violation]:
    out = []
    for rel in files:
        group = _group(rel)
        if group is None or not rel.endswith(".py"):
            continue
        tree = ast.parse((root / rel).read_text(), filename=rel)
        for line, imported in _imports(tree):
            if _crosses(imported, group):
                out.append(Violation(rel, line, imported))
        for line, named in _named_modules(tree):
            if _crosses(named, group):
                out.append(Violation(rel, line, named, "names"))
        for line, imported in _embedded_scripts(tree):
            if _crosses(imported, group):
                out.append(Violation(rel, line, imported, "runs a script that imports"))
    return out


PACKAGE_DIRS = (
    ("patches/contracts/", f"{PKG}.contracts"),
    ("patches/", f"{PKG}.patches"),
    ("postprocess/", f"{PKG}.postprocess"),
    ("entrypoints/", f"{PKG}.entrypoints"),
)
"""Folder → import name, as pyproject's ``package-dir`` maps them (most specific first)."""


def module_name(rel: str) -> str | None:
    """The import name of a product file (None for tests, benches and anything else)."""
    for folder, name in PACKAGE_DIRS:
        if rel.startswith(folder) and rel.endswith(".py"):
            parts = rel[len(folder) : -len(".py")].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join([name, *parts])
    return None


def import_graph(root: Path, files: list[str]) -> dict[str, set[str]]:
    """Module → the bundle's modules it imports: every import, at import time, in a function body,
    or under ``TYPE_CHECKING`` (``from pkg import mod`` counts as an import of ``pkg.mod``)."""
    names = {m: rel for rel in files if (m := module_name(rel))}
    graph: dict[str, set[str]] = {}
    for mod, rel in names.items():
        edges = set()
        for _, imported in _imports(ast.parse((root / rel).read_text(), filename=rel)):
            # "from a.b import c" is reported as a.b.c: a module if there is one, else a name in a.b
            target = imported if imported in names else imported.rpartition(".")[0]
            if target in names and target != mod:
                edges.add(target)
        graph[mod] = edges
    return graph


def import_loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted: the loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                members.append(top)
                if top == node:
                    break
            if len(members) > 1:
                loops.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return loops


ENV_NAME = re.compile(r"^VERL_CONSISTENCY_[A-Z0-9_]+$")
ENV_TOKEN = re.compile(r"\bVERL_CONSISTENCY_[A-Z0-9_]*[A-Z0-9]\b")
ENV_HOME = "patches/contracts/env.py"


def env_name_violations(root: Path, files: list[str]) -> list[Violation]:
    """A ``VERL_CONSISTENCY_*`` string literal outside ``contracts/env.py`` (tests may spell one)."""
    out = []
    for rel in files:
        if not rel.endswith(".py") or rel == ENV_HOME or rel.startswith("tests/"):
            continue
        for node in ast.walk(ast.parse((root / rel).read_text(), filename=rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and ENV_NAME.match(node.value):
                out.append(Violation(rel, node.lineno, node.value))
    return out


def _tracked(repo: Path) -> list[str]:
    res = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True)
    return [f for f in res.stdout.splitlines() if (repo / f).is_file()]


def test_imports_follow_the_layers(repo):
    bad = layer_violations(repo, _tracked(repo))
    assert not bad, "imports across the layers (see this file's docstring):\n" + "\n".join(map(str, bad))


def test_no_module_imports_itself_back(repo):
    loops = import_loops(import_graph(repo, _tracked(repo)))
    assert not loops, "import loops (type-only and function-local imports count):\n" + "\n".join(
        " <-> ".join(loop) for loop in loops
    )


@pytest.mark.parametrize(
    ("sources", "loops"),
    [
        # the loop issue 45 removed: two training hooks importing each other inside functions
        (
            {
                "patches/hooks/training/a.py": f"def f():\n    from {HOOKS}.training import b\n",
                "patches/hooks/training/b.py": f"def g():\n    from {HOOKS}.training.a import f\n",
            },
            1,
        ),
        # a type-only loop is a loop too
        (
            {
                "patches/hooks/lanes/a.py": "from verl_consistency.patches.hooks.lanes.b import B\n",
                "patches/hooks/lanes/b.py": (
                    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from verl_consistency.patches.hooks.lanes.a import A\n"
                ),
            },
            1,
        ),
        # three modules around, and a package importing its module (not a loop)
        (
            {
                "postprocess/a.py": "import verl_consistency.postprocess.b\n",
                "postprocess/b.py": "from verl_consistency.postprocess import c\n",
                "postprocess/c.py": "from verl_consistency.postprocess.a import x\n",
                "postprocess/d/__init__.py": "from verl_consistency.postprocess.d import e\n",
                "postprocess/d/e.py": "from verl_consistency.contracts import env\n",
            },
            1,
        ),
        # both import a contract: no loop
        (
            {
                "patches/hooks/training/a.py": "from verl_consistency.contracts.batch_fields import X\n",
                "patches/hooks/training/b.py": "from verl_consistency.contracts import batch_fields\n",
                "patches/contracts/batch_fields.py": "X = 1\n",
            },
            0,
        ),
    ],
)
def test_the_loop_check_catches_a_loop(tmp_path, sources, loops):
    for rel, text in sources.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert len(import_loops(import_graph(tmp_path, list(sources)))) == loops


def test_env_names_are_defined_only_in_the_contracts(repo):
    bad = env_name_violations(repo, _tracked(repo))
    assert not bad, f"define these in {ENV_HOME} and import them from there:\n" + "\n".join(map(str, bad))


def test_every_env_name_anywhere_is_one_of_the_contracts(repo):
    """Manifests, the Dockerfile, the Makefile and the READMEs may only use names that exist."""
    defined = {v for k, v in vars(env).items() if k.isupper() and isinstance(v, str) and ENV_NAME.match(v)}
    unknown = set()
    for rel in _tracked(repo):
        try:
            text = (repo / rel).read_text()
        except UnicodeDecodeError:
            continue
        unknown |= {(rel, tok) for tok in ENV_TOKEN.findall(text) if tok not in defined}
    # a shell variable of the postprocess Job's own script, not an environment contract
    unknown = {(rel, tok) for rel, tok in unknown if tok != "VERL_CONSISTENCY_RAYJOB_FAILED"}
    assert not unknown, f"not defined in {ENV_HOME}: {sorted(unknown)}"


@pytest.mark.parametrize(
    ("rel", "source", "expected"),
    [
        ("patches/hooks/x.py", "from verl_consistency.entrypoints import run_cmd\n", 1),
        ("patches/hooks/x.py", "def f():\n    import verl_consistency.postprocess.pairing.pair\n", 1),
        (
            "patches/contracts/x.py",
            "from verl_consistency.patches.hooks.training import micro_batch_dump\n",
            1,
        ),
        ("postprocess/x.py", "from verl_consistency.patches.hooks.rollout import dispatch\n", 1),
        ("bench/x.py", "from tests.postprocess import pairing_trees\n", 1),
        ("entrypoints/x.py", "import tests.fixtures\n", 1),
        ("patches/hooks/x.py", "from verl_consistency.contracts import env, records\n", 0),
        ("bench/x.py", "from bench.support.hardware import hardware\n", 0),
        ("bench/x.py", "from tests.fixtures.checkdumps import write\n", 1),
        ("tests/x.py", "from bench.support import realdumps\n", 0),
        ("postprocess/x.py", "from bench.support import realdumps\n", 1),
        # an import inside an embedded script (a bench's python -c step) crosses as well
        ("bench/x.py", 'STEP = """\nimport json\nfrom tests.patches import fsdp_driver as drv\n"""\n', 1),
        ("bench/x.py", 'STEP = """\n    import json\n    from bench.support import fsdp_driver\n"""\n', 0),
        ("bench/x.py", 'WHY = "we import nothing from tests here"\n', 0),
        # the contracts are one room of their own, under their own name
        ("patches/hooks/x.py", "from verl_consistency.patches.contracts import env\n", 1),
        # the patch tooling and docker/ use the contracts and the tooling, never the hooks
        ("patches/x.py", "from verl_consistency.patches.hooks.rollout import dispatch\n", 1),
        ("patches/x.py", "import verl_consistency.patches.hooks.training.micro_batch_dump\n", 1),
        (
            "docker/helpers/x.py",
            "from verl_consistency.patches.hooks.ray_setup.placement import install\n",
            1,
        ),
        ("docker/helpers/x.py", "from verl_consistency.patches.tooling import apply, upstream\n", 0),
        ("docker/helpers/x.py", "from verl_consistency.contracts import pins\n", 0),
        # a module named in a string is an import too
        (
            "patches/contracts/x.py",
            'from importlib import resources\nP = resources.files("verl_consistency.patches.hooks")\n',
            1,
        ),
        ("postprocess/x.py", 'importlib.import_module("verl_consistency.entrypoints.cli")\n', 1),
        ("patches/x.py", 'D = resources.files("verl_consistency.patches")\n', 0),
        ("docker/x.py", 'CMD = ["python3", "-m", "verl_consistency.patches", "apply"]\n', 0),
        ("patches/contracts/x.py", 'WHY = "see verl_consistency.patches.hooks for the callers"\n', 0),
        # entrypoints run hooks, but take no constants from the token-record hook
        ("entrypoints/x.py", "from verl_consistency.patches.hooks.training import token_mismatch\n", 1),
        (
            "entrypoints/x.py",
            "from verl_consistency.patches.hooks.training.token_mismatch import threshold\n",
            1,
        ),
        (
            "entrypoints/x.py",
            "from verl_consistency.patches.hooks.training import next_token, token_figures\n",
            2,
        ),
        ("entrypoints/x.py", "from verl_consistency.patches.hooks.ray_setup import placement\n", 0),
        # the hooks' rooms are one process each: rollout and training never import each other
        (
            "patches/hooks/rollout/x.py",
            "from verl_consistency.patches.hooks.training import weight_sync\n",
            1,
        ),
        (
            "patches/hooks/training/x.py",
            "def f():\n    from verl_consistency.patches.hooks.rollout import dispatch\n",
            1,
        ),
        (
            "patches/hooks/training/x.py",
            "from verl_consistency.patches.hooks.training import next_token\n",
            0,
        ),
        (
            "patches/hooks/rollout/x.py",
            "from verl_consistency.patches.hooks.rollout import request_scope\n",
            0,
        ),
        # ... and reach the lanes through their way in only
        ("patches/hooks/rollout/x.py", "from verl_consistency.patches.hooks.lanes import msprobe_lanes\n", 0),
        (
            "patches/hooks/training/x.py",
            "from verl_consistency.patches.hooks.lanes.lane_stats import Entry\n",
            1,
        ),
        # the lanes and the Ray setup hook import no other room (no arrow back up)
        ("patches/hooks/lanes/x.py", "from verl_consistency.patches.hooks.training import prompt_rows\n", 1),
        ("patches/hooks/lanes/x.py", "from verl_consistency.patches.hooks.lanes import lane_json\n", 0),
        ("patches/hooks/ray_setup/x.py", "from verl_consistency.patches.hooks.rollout import dispatch\n", 1),
        ("patches/hooks/training/x.py", "from verl_consistency.patches.tooling import apply\n", 1),
        ("patches/tooling/x.py", "from verl_consistency.patches.hooks.lanes import msprobe_lanes\n", 1),
        ("patches/tooling/x.py", "from verl_consistency.patches.tooling import upstream\n", 0),
    ],
)
def test_the_layer_check_catches_a_crossing(tmp_path, rel, source, expected):
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text(source)
    assert len(layer_violations(tmp_path, [rel])) == expected


def test_the_env_check_catches_a_second_definition(tmp_path):
    (tmp_path / "postprocess").mkdir()
    (tmp_path / "postprocess/x.py").write_text('RUN = "VERL_CONSISTENCY_RUN_DIR"\n')
    assert [v.imported for v in env_name_violations(tmp_path, ["postprocess/x.py"])] == [
        "VERL_CONSISTENCY_RUN_DIR"
    ]
