"""A patch that does not apply must fail the image build, naming the patch, the file and the hunk."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .conftest import REPO, buildah_bud, vcs_ref_arg

pytestmark = pytest.mark.image

BROKEN = """\
Deliberately broken: its context is not in verl 0.8.0, so the build must stop here.
--- a/verl/__init__.py
+++ b/verl/__init__.py
@@ -1,3 +1,4 @@
 this line is not in verl/__init__.py
 neither is this one
+inserted = True
 nor this one
"""


def _context(dest):
    """A copy of the tracked files, so the real tree is never touched."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def test_broken_patch_fails_the_build_naming_the_hunk(standin_base, built_image, tmp_path):
    # built_image first: the pip layers are then cached, and only the patch step reruns.
    ctx = _context(tmp_path / "ctx")
    (ctx / "patches/current/verl/zz-broken.patch").write_text(BROKEN)
    with (ctx / "patches/current/verl/series").open("a") as fh:
        fh.write("zz-broken.patch\n")
    tag = "localhost/verl-consistency:pytest-broken"
    res = buildah_bud(ctx, tag, *vcs_ref_arg())  # the image build's: its pip layers are reused
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "patch verl/zz-broken.patch does not apply" in out
    assert "verl/__init__.py: hunk #1" in out
    exists = subprocess.run(["buildah", "inspect", "--type", "image", tag], capture_output=True)
    assert exists.returncode != 0, "a failed build must not leave a tagged image"
