"""The READMEs name only what exists, and document every option, override and refusal.

Two kinds of check:

* **Every name resolves** (data-driven, one test per name, so a failure says which name of which
  README): each ``verl-consistency <command>``, ``make <target>``, ``kubectl apply -f|-k`` file,
  repository path, relative link and ``#anchor`` of README.md and the stage READMEs
  (``tests/fixtures/doc_refs.py`` reads them).
* **The tables a reader needs are complete**: they are written by hand for readers, and kept
  from drifting from the code that enforces them (``entrypoints/run/overrides.py`` and the typer
  commands).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from tests.conftest import REPO
from tests.fixtures import doc_refs
from verl_consistency.entrypoints.cli import app
from verl_consistency.entrypoints.run import overrides

COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]

DOCS = (
    "README.md",
    *(f"{d}/README.md" for d in doc_refs.TOP_FOLDERS if (REPO / d / "README.md").is_file()),
    "postprocess/README-compare.md",
    "bench/README-selective.md",
    *(str(p.relative_to(REPO)) for p in sorted(REPO.glob("patches/*/*/README.md"))),
)
"""README.md, each stage's README and the READMEs beside the code they describe."""

GROUPS = frozenset(name for name, cmd in COMMANDS.items() if hasattr(cmd, "commands"))
REFS = [ref for doc in DOCS for ref in doc_refs.refs(REPO, doc, GROUPS)]


@pytest.mark.parametrize("ref", [pytest.param(r, id=r.id) for r in REFS])
def test_every_name_a_readme_uses_exists(repo, ref):
    why = doc_refs.problem(repo, ref, app)
    assert why is None, f"{ref.doc}:{ref.line}: {why}"


BROKEN = """# Top

## A `section` (with: punctuation)

```bash
verl-consistency no-such-command --x
verl-consistency patches no-such-sub
make no-such-target VAR=1
kubectl apply -f k8s/no-such.yaml
kubectl apply -k k8s/overlays/<name>
cat patches/no-such-file.toml
```

See [this](no-such.md), [that](#no-such-anchor), [fine](#a-section-with-punctuation),
and `make k8s-render OVERLAY=<name>`, `verl-consistency version`.
"""


def test_the_checker_finds_each_kind_of_broken_name(tmp_path: Path, repo: Path):
    """Each kind of name can fail, with its reason; placeholders and good names pass."""
    for rel in ("Makefile", "docker", "k8s", "entrypoints", "bench", "patches", "postprocess"):
        (tmp_path / rel).symlink_to(repo / rel)
    (tmp_path / "DOC.md").write_text(BROKEN)
    found = {(r.kind, r.name): doc_refs.problem(tmp_path, r, app) for r in doc_refs.refs(tmp_path, "DOC.md")}
    assert found.pop(("command", "version")) is None
    assert found.pop(("make", "k8s-render")) is None
    assert found.pop(("anchor", "#a-section-with-punctuation")) is None
    assert "no-such-command" in str(found.pop(("command", "no-such-command")))
    assert "no sub-command ['no-such-sub']" in str(found.pop(("command", "patches no-such-sub")))
    assert "no such target" in str(found.pop(("make", "no-such-target")))
    assert "does not exist" in str(found.pop(("kubectl", "k8s/no-such.yaml")))
    assert "does not exist" in str(found.pop(("path", "k8s/no-such.yaml")))
    assert "does not exist" in str(found.pop(("path", "patches/no-such-file.toml")))
    assert "no such file" in str(found.pop(("link", "no-such.md")))
    assert "no heading" in str(found.pop(("anchor", "#no-such-anchor")))
    assert found == {}, f"unexpected names read: {found}"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        (
            "`verl-consistency check`: the one-node check (no Ray, no RL loop)",
            "verl-consistency-check-the-one-node-check-no-ray-no-rl-loop",
        ),
        (
            "Selective dumps and per-request lanes (`--capture fraction:F`)",
            "selective-dumps-and-per-request-lanes---capture-fractionf",
        ),
        ("Run kinds (`run_modes.RunKind`)", "run-kinds-run_modesrunkind"),
        ("The next set: `make demo PINS=next`", "the-next-set-make-demo-pinsnext"),
    ],
)
def test_anchors_are_githubs_slugs(heading, anchor):
    assert doc_refs.slug(heading) == anchor


# The tables: every option, required override, refusal and environment variable is documented.
ENTRYPOINTS = "entrypoints/README.md"
OPTION_DOCS = {
    "run": ENTRYPOINTS,
    "check": ENTRYPOINTS,
    "demo": ENTRYPOINTS,
    "wait-rayjob": ENTRYPOINTS,
    "msprobe-configs": ENTRYPOINTS,
    "postprocess": "postprocess/README.md",
    "preflight": "k8s/README.md",
}
"""Where each command's options are documented: its stage README."""


def _text(repo: Path, rel: str) -> str:
    return (repo / rel).read_text(encoding="utf-8")


def _options(name: str) -> list[str]:
    return [o for p in COMMANDS[name].params for o in getattr(p, "opts", []) if o.startswith("--")]


@pytest.mark.parametrize(("command", "doc"), OPTION_DOCS.items())
def test_every_option_is_documented(repo, command, doc):
    text = _text(repo, doc)
    missing = [o for o in _options(command) if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
    assert not missing, f"{doc} does not document `verl-consistency {command}` options {missing}"


def test_every_required_override_and_refusal_is_documented(repo):
    """Every row of every pin set, in entrypoints/README.md, which documents the sets side by side."""
    text = _text(repo, ENTRYPOINTS)
    rows = [*overrides.REQUIRED, *overrides.REFUSALS]
    missing = [r.key for r in rows if r.key.lstrip("+") not in text]
    assert not missing, f"{ENTRYPOINTS} does not mention {missing} (entrypoints/run/overrides.py)"


def test_every_environment_variable_is_documented(repo):
    text = _text(repo, ENTRYPOINTS)
    missing = [v.name for v in overrides.ENV if f"`{v.name}`" not in text]
    assert not missing, f"{ENTRYPOINTS} does not document {missing}"


def test_the_readme_opens_with_the_two_commands_a_newcomer_needs(repo):
    """`make demo` (no NPU needed) and the cluster's `kubectl apply`, before anything else."""
    first = next(t for t in doc_refs.MD.parse(_text(repo, "README.md")) if t.type == "fence")
    commands = [line.split("#")[0].split() for line in first.content.splitlines()]
    assert commands[:2] == [["make", "demo"], ["kubectl", "apply", "-f", "k8s/fully-async-rayjob.yaml"]]
    assert first.map is not None
    assert first.map[0] < 4, "the commands come first, before the prose"


def test_the_readme_is_a_page(repo):
    lines = _text(repo, "README.md").count("\n")
    assert lines <= 300, f"README.md has {lines} lines: move the detail to a stage README and link it"


def test_key_make_targets_are_in_help_and_a_readme(repo):
    import subprocess

    out = subprocess.run(["make", "-s", "help"], cwd=repo, check=True, capture_output=True, text=True).stdout
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    targets = [line.split()[0] for line in plain.splitlines() if line.strip()]
    shown = {r.name for r in REFS if r.kind == "make"}
    for needed in (
        "image",
        "image-a3",
        "test",
        "check-patches",
        "download-bundle",
        "bench",
        "demo",
        "demo-venv",
        "check-model",
    ):
        assert needed in targets, f"`make help` does not list {needed}"
        assert needed in shown, f"no README shows `make {needed}`"


def test_every_command_is_in_the_commands_table(repo):
    readme = _text(repo, "README.md")
    missing = [name for name in COMMANDS if f"`verl-consistency {name}" not in readme]
    assert not missing, f"README.md's Commands table lacks {missing}"
