"""Fetching and unpacking the pinned distributions: sdists (vllm-ascend 0.23.0.post1) included."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from verl_consistency.contracts import pins
from verl_consistency.patches.tooling import apply, upstream


def _sdist(path: Path, top: str, members: dict[str, bytes], *, link: str | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(f"{top}/evil-link")
            info.type = tarfile.SYMTYPE
            info.linkname = link
            tf.addfile(info)
    return path


def test_an_sdist_unpacks_without_its_top_folder_and_without_links(tmp_path):
    top = "vllm_ascend-9.9.9"
    sdist = _sdist(
        tmp_path / f"{top}.tar.gz",
        top,
        {f"{top}/PKG-INFO": b"Name: vllm-ascend\n", f"{top}/vllm_ascend/__init__.py": b"x = 1\n"},
        link="/etc/passwd",
    )
    dest = upstream.unpack(sdist, tmp_path / "tree")
    assert (dest / "vllm_ascend/__init__.py").read_text() == "x = 1\n"
    assert (dest / "PKG-INFO").is_file()
    assert not (dest / "evil-link").exists()
    assert not (dest / top).exists()


def test_an_sdist_member_outside_the_folder_is_refused(tmp_path):
    top = "vllm_ascend-9.9.9"
    sdist = _sdist(tmp_path / f"{top}.tar.gz", top, {f"{top}/../../escaped.py": b"boom\n"})
    with pytest.raises(RuntimeError, match="would unpack outside"):
        upstream.unpack(sdist, tmp_path / "tree")
    assert not (tmp_path / "escaped.py").exists()


@pytest.mark.upstream
@pytest.mark.parametrize("set_name", ["current", "next"])
def test_every_set_has_a_series_per_component_and_its_distributions_unpack(tmp_path, set_name):
    """The real pinned distributions of both sets: each holds the package its series patches."""
    for component, package in apply.COMPONENTS.items():
        apply.read_series(component, set_name=set_name)  # parses (may be empty)
        dist = upstream.fetch_wheel(component, set_name=set_name)
        assert pins.get(f"upstream.{package}", set_name=set_name) in dist.name
        tree = upstream.unpack(dist, tmp_path / set_name / component)
        assert (tree / package / "__init__.py").is_file(), f"{dist.name} holds no {package}/"
