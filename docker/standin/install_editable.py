"""STAND-IN helper, run inside the stand-in base image: install a wheel as an editable checkout.

The real vllm-ascend image runs ``pip install -e /vllm-workspace/vllm-ascend`` on a git checkout.
This reproduces the result from the PyPI wheel (whose ``model_runner_v1.py`` is byte-identical
to the tag): the package folder lives in the checkout, and site-packages holds only a ``.pth``
and a dist-info whose ``direct_url.json`` says "editable", so that ``pip list`` and
``importlib.metadata`` see what they see in the real image. Standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path


def _record_line(path: Path, site: Path) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(site).as_posix()},sha256={digest},{path.stat().st_size}"


def unpack_sdist(sdist: Path, checkout: Path, site: Path) -> str:
    """The sdist's tree becomes the checkout (as a git checkout would); returns the dist-info name.

    vllm-ascend 0.23.0.post1 is an sdist only on PyPI. Its ``PKG-INFO`` is the metadata that
    ``pip install -e`` would record, so it becomes the dist-info's ``METADATA``.
    """
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as tf:
        # regular files and folders only, each inside the checkout (no `filter=` on Python 3.11.2)
        members = []
        for m in tf.getmembers():
            if (m.isfile() or m.isdir()) and m.name.startswith(top + "/") and m.name != top + "/":
                m.name = m.name[len(top) + 1 :]
                if not (checkout / m.name).resolve().is_relative_to(checkout.resolve()):
                    raise SystemExit(f"{sdist}: member {m.name!r} would unpack outside {checkout}")
                members.append(m)
        tf.extractall(checkout, members=members)
    name, version = top.rsplit("-", 1)
    dist_info = f"{name}-{version}.dist-info"
    (site / dist_info).mkdir(parents=True, exist_ok=True)
    (site / dist_info / "METADATA").write_bytes((checkout / "PKG-INFO").read_bytes())
    return dist_info


def install(wheel: Path, checkout: Path) -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    checkout.mkdir(parents=True, exist_ok=True)
    if wheel.name.endswith(".tar.gz"):
        _finish(unpack_sdist(wheel, checkout, site), checkout, site)
        return
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = next(n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info"))
        for name in names:
            top = name.split("/", 1)[0]
            dest_root = site if top == dist_info else checkout
            target = (dest_root / name).resolve()
            if not target.is_relative_to(dest_root.resolve()):
                raise SystemExit(f"{wheel}: member {name!r} would unpack outside {dest_root}")
            zf.extract(name, dest_root)
    _finish(dist_info, checkout, site)


def _finish(dist_info: str, checkout: Path, site: Path) -> None:
    """The ``.pth``, ``direct_url.json`` (editable) and ``RECORD`` that ``pip install -e`` writes."""
    meta = site / dist_info
    project = dist_info.removesuffix(".dist-info").rsplit("-", 1)[0]
    pth = site / f"__editable__.{project}.pth"
    pth.write_text(f"{checkout}\n")
    (meta / "direct_url.json").write_text(
        json.dumps({"url": checkout.as_uri(), "dir_info": {"editable": True}})
    )
    (meta / "INSTALLER").write_text("pip\n")
    for stale in ("RECORD", "WHEEL"):
        (meta / stale).unlink(missing_ok=True)
    files = [pth, *sorted(p for p in meta.iterdir() if p.is_file())]
    lines = [_record_line(p, site) for p in files]
    lines.append(f"{(meta / 'RECORD').relative_to(site).as_posix()},,")
    (meta / "RECORD").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: install_editable.py WHEEL|SDIST|FOLDER CHECKOUT_DIR")
    given = Path(sys.argv[1])
    if given.is_dir():  # the folder the stand-in build copied the one distribution into
        found = sorted([*given.glob("*.whl"), *given.glob("*.tar.gz")])
        if len(found) != 1:
            raise SystemExit(f"{given}: expected one wheel or sdist, found {[p.name for p in found]}")
        given = found[0]
    install(given, Path(sys.argv[2]))
