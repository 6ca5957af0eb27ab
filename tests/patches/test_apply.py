"""The series applier: all-or-nothing, idempotent, and loud about the hunk that failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_consistency.patches.tooling import apply

ORIGINAL = "".join(f"line {i}\n" for i in range(1, 21))


def _diff(old_line: str, new_line: str, path: str = "verl/mod.py", at: int = 10) -> str:
    ctx_before = [f"line {i}" for i in range(at - 3, at)]
    ctx_after = [f"line {i}" for i in range(at + 1, at + 4)]
    body = "\n".join(
        [*(f" {c}" for c in ctx_before), f"-{old_line}", f"+{new_line}", *(f" {c}" for c in ctx_after)]
    )
    return f"--- a/{path}\n+++ b/{path}\n@@ -{at - 3},7 +{at - 3},7 @@\n{body}\n"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    patches = tmp_path / "patches" / "current"  # the current set's series folder
    (patches / "verl").mkdir(parents=True)
    tree = tmp_path / "site"
    (tree / "verl").mkdir(parents=True)
    (tree / "verl" / "mod.py").write_text(ORIGINAL)
    (tree / "verl" / "other.py").write_text(ORIGINAL)
    return patches, tree


def _series(patches: Path, **diffs: str) -> None:
    for name, text in diffs.items():
        (patches / "verl" / name).write_text(f"{name}: what it changes\n\nwhy.\n\n{text}")
    (patches / "verl" / "series").write_text("# comment\n" + "\n".join(diffs) + "\n")


def test_applies_in_order_and_is_idempotent(layout):
    patches, tree = layout
    _series(
        patches,
        **{"0001-a.patch": _diff("line 10", "LINE TEN"), "0002-b.patch": _diff("line 5", "LINE FIVE", at=5)},
    )
    first = apply.apply_series("verl", tree, patches_dir=patches)
    assert [s for _, s in first] == ["applied", "applied"]
    text = (tree / "verl" / "mod.py").read_text()
    assert "LINE TEN\n" in text
    assert "LINE FIVE\n" in text
    again = apply.apply_series("verl", tree, patches_dir=patches)
    assert [s for _, s in again] == ["already applied", "already applied"]
    assert (tree / "verl" / "mod.py").read_text() == text
    assert [p.name for p in apply.verify_series("verl", tree, patches_dir=patches)] == [
        "0001-a.patch",
        "0002-b.patch",
    ]
    assert first[0][0].summary == "0001-a.patch: what it changes"


def test_a_later_patch_may_edit_what_an_earlier_one_added(layout):
    """verl's 0006 edits a line 0001 added: verify and a rerun judge the series newest first."""
    patches, tree = layout
    first, second = _diff("line 10", "LINE TEN"), _diff("LINE TEN", "LINE 10 AGAIN")
    _series(patches, **{"0001-a.patch": first, "0002-b.patch": second})
    assert [s for _, s in apply.apply_series("verl", tree, patches_dir=patches)] == ["applied", "applied"]
    text = (tree / "verl" / "mod.py").read_text()
    assert "LINE 10 AGAIN\n" in text
    assert len(apply.verify_series("verl", tree, patches_dir=patches)) == 2
    again = apply.apply_series("verl", tree, patches_dir=patches)
    assert [s for _, s in again] == ["already applied", "already applied"]
    assert (tree / "verl" / "mod.py").read_text() == text
    (tree / "verl" / "mod.py").write_text(ORIGINAL.replace("line 10", "LINE TEN"))  # only 0001 applied
    assert apply.applied(apply.read_series("verl", patches), tree) == [True, False]
    with pytest.raises(apply.PatchError, match=r"0002-b\.patch"):
        apply.verify_series("verl", tree, patches_dir=patches)


def test_a_failing_hunk_names_patch_file_and_hunk_and_writes_nothing(layout):
    patches, tree = layout
    _series(
        patches,
        **{
            "0001-ok.patch": _diff("line 4", "LINE FOUR", path="verl/other.py", at=4),
            "0002-bad.patch": _diff("line 10", "LINE TEN"),
        },
    )
    (tree / "verl" / "mod.py").write_text(ORIGINAL.replace("line 10\n", "line 10 changed upstream\n"))
    before = {p: p.read_text() for p in (tree / "verl").iterdir()}
    with pytest.raises(apply.PatchError) as err:
        apply.apply_series("verl", tree, patches_dir=patches)
    msg = str(err.value)
    assert "verl/0002-bad.patch" in msg
    assert "verl/mod.py: hunk #1" in msg
    assert "pins.toml" in msg
    assert {p: p.read_text() for p in (tree / "verl").iterdir()} == before, "the tree must be left untouched"
    assert not list(tree.rglob("*.rej"))
    assert not list(tree.rglob("*.orig"))


def test_verify_reports_unapplied_patches(layout):
    patches, tree = layout
    _series(patches, **{"0001-a.patch": _diff("line 10", "LINE TEN")})
    with pytest.raises(apply.PatchError, match=r"not applied.*0001-a\.patch"):
        apply.verify_series("verl", tree, patches_dir=patches)


def test_series_errors_are_specific(layout, tmp_path):
    patches, _tree = layout
    (patches / "verl" / "series").write_text("0001-missing.patch\n")
    with pytest.raises(apply.PatchError, match=r"series:1: 0001-missing.patch is listed"):
        apply.read_series("verl", patches)
    with pytest.raises(apply.PatchError, match="unknown component"):
        apply.read_series("sglang", patches)
    _series(patches, **{"0001-a.patch": _diff("line 10", "LINE TEN")})
    with pytest.raises(apply.PatchError, match="does not hold the 'verl' package"):
        apply.apply_series("verl", tmp_path / "nowhere", patches_dir=patches)


@pytest.mark.parametrize("set_name", ["current", "next"])
def test_shipped_series_files_parse(set_name):
    for component in apply.COMPONENTS:
        for patch in apply.read_series(component, set_name=set_name):
            assert patch.summary, f"{patch.name} needs a one-line summary header"
            assert patch.targets, f"{patch.name} patches no file"


def test_cli_apply_failure_exit_code(layout, monkeypatch):
    from typer.testing import CliRunner

    from verl_consistency.patches.tooling.cli import app

    patches, tree = layout
    _series(patches, **{"0001-bad.patch": _diff("nope", "x")})
    monkeypatch.setattr(apply, "PATCHES_DIR", patches.parent)
    res = CliRunner().invoke(app, ["apply", "--component", "verl", "--root", str(tree)])
    assert res.exit_code == 1
    assert "0001-bad.patch" in res.output
    assert "hunk #1" in res.output
