"""Build-time helper of ``docker/Dockerfile``: pins, the base's constraints, and install checks.

It runs inside the build with the base image's own Python, before this bundle (and pydantic)
is installed, so it uses the standard library only. Each sub-command is one step that the
Dockerfile would otherwise spell out in shell:

Pins are read by ``patches/contracts/pins.py``, the one reader of ``pins.toml`` (the Dockerfile copies
both beside this file, and runs ``pins.py KEY`` itself where it needs a value).
``freeze OUT``
    write ``name==version`` for every distribution installed now. Used as a pip constraints
    file, so that no later ``pip install`` can replace what the base image ships (torch,
    torch_npu, vllm, vllm-ascend, transformers, ...): pip fails instead, naming the conflict.
``check-args``
    fail unless the label build args (``VERL_VERSION``...) equal the pins of the build's pin set
    (``PIN_SET``), so that a label can never claim a version the image does not hold, and unless
    ``BASE_IMAGE`` is not another set's base.
``build-args``
    print the ``--build-arg`` flags that build the set in force (``PIN_SET``, ``BASE_IMAGE`` and
    every label arg from its pins): ``make image PINS=next`` passes them, so the Dockerfile's
    literal defaults only ever describe the default set. Nothing for the default set: its build
    runs on the Dockerfile's defaults, which is what a plain ``docker build`` does.
``check-installed``
    fail unless the installed distributions carry the pinned versions (``FLAVOUR`` picks
    vllm-ascend or vllm).
``patch-components``
    print ``component root VAR`` lines (VAR: ``VERL_ROOT``...): what the patch step applies in
    this flavour. verl always (its site-packages); vllm-ascend in its editable checkout
    (ascend); vllm in site-packages (cuda) only when the installed bundle ships a ``vllm``
    series, else a note on stderr.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType


def _load_pins() -> ModuleType:
    """``pins.py`` from beside this file (the image) or from ``patches/contracts/`` (the source tree)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "pins.py", here.parents[1] / "patches" / "contracts" / "pins.py"):
        if candidate.is_file():
            spec = importlib.util.spec_from_file_location("verl_consistency_pins", candidate)
            assert spec is not None
            assert spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise SystemExit(f"pins.py is neither beside {here} nor in the source tree's patches/contracts/")


pins = _load_pins()

SET_ARG = "PIN_SET"
"""Build arg naming the pin set; the Dockerfile turns it into ``$VERL_CONSISTENCY_PIN_SET``."""

LABEL_ARGS: dict[str, str] = {
    # build arg (used in a LABEL) → pins.toml key
    "BASE_IMAGE_A2": "image.base.a2",
    "VERL_VERSION": "upstream.verl",
    "VLLM_VERSION": "upstream.vllm",
    "VLLM_ASCEND_VERSION": "upstream.vllm_ascend",
    "MINDSTUDIO_PROBE_VERSION": "upstream.mindstudio_probe",
    "MEGATRON_CORE_VERSION": "install.megatron_core",
    "MINDSPEED_REF": "install.mindspeed_ref",
}

INSTALLED: dict[str, str] = {
    # distribution → pins.toml key of the version it must carry
    "verl": "upstream.verl",
    "vllm-ascend": "upstream.vllm_ascend",
    "mindstudio-probe": "upstream.mindstudio_probe",
    "megatron-core": "install.megatron_core",
    "mbridge": "install.mbridge",
}
FLAVOURS = ("ascend", "cuda")
"""``FLAVOUR`` build arg: ascend (vllm-ascend base, NPU) or cuda (vLLM's official image, NVIDIA)."""
FLAVOUR_INSTALLED: dict[str, dict[str, str]] = {
    "ascend": INSTALLED,
    "cuda": {**{k: v for k, v in INSTALLED.items() if k != "vllm-ascend"}, "vllm": "upstream.vllm"},
}

_PEP440 = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-zA-Z0-9.]+)?$")


def freeze() -> list[str]:
    """``name==version`` of every installed distribution whose version pip can parse."""
    seen: dict[str, str] = {}
    for dist in md.distributions():
        name, version = dist.metadata["Name"], dist.version
        if name and version and _PEP440.match(version):
            seen.setdefault(re.sub(r"[-_.]+", "-", name).lower(), version)
    return [f"{n}=={v}" for n, v in sorted(seen.items())]


def build_args(set_name: str | None = None) -> dict[str, str]:
    """The build args a pin set needs beyond the Dockerfile's defaults (none for the default set)."""
    name = pins.selected() if set_name is None else set_name
    if name == pins.raw()["sets"]["default"]:
        return {}
    args = {SET_ARG: name, "BASE_IMAGE": str(pins.get("image.base.a2", set_name=name))}
    args.update({arg: str(pins.get(key, set_name=name)) for arg, key in LABEL_ARGS.items()})
    return args


def _other_sets_bases(name: str) -> dict[str, str]:
    return {
        str(pins.get(f"image.base.{gen}", set_name=other)): other
        for other in pins.set_names()
        if other != name
        for gen in ("a2", "a3", "cuda")
        if pins.get(f"image.base.{gen}", set_name=other) != pins.get(f"image.base.{gen}", set_name=name)
    }


def check_args(environ: dict[str, str]) -> list[str]:
    errors = []
    try:
        name = pins.selected(environ={pins.env_name(): environ.get(SET_ARG, "")})
    except KeyError as exc:
        return [f"build arg {SET_ARG}: {exc.args[0]}"]
    base = environ.get("BASE_IMAGE", "")
    owner = _other_sets_bases(name).get(base)
    if owner:
        errors.append(
            f"build arg BASE_IMAGE={base!r} is the base of pin set {owner!r}, "
            f"but {SET_ARG}={name!r}: build with `make image PINS={name}`, which passes the set's "
            f"base and versions (`python3 docker/helpers/image_build.py build-args` prints them)"
        )
    flavour = environ.get("FLAVOUR", "ascend")
    if flavour not in FLAVOURS:
        errors.append(f"build arg FLAVOUR={flavour!r}: expected one of {', '.join(FLAVOURS)}")
    if flavour == "cuda" and environ.get("WITH_MINDSPEED", "0") == "1":
        errors.append(
            "FLAVOUR=cuda with WITH_MINDSPEED=1: MindSpeed is Ascend's Megatron adapter; pass "
            "--build-arg WITH_MINDSPEED=0 (make image-cuda does)"
        )
    for arg, key in LABEL_ARGS.items():
        given, pinned = environ.get(arg, ""), str(pins.get(key, set_name=name))
        if given and given != pinned:
            errors.append(
                f"build arg {arg}={given!r} but patches/pins.toml {key} = {pinned!r} in pin set "
                f"{name!r}: the label would lie. Drop --build-arg {arg}, build with `make image "
                f"PINS={name}`, or change the pin (and the Dockerfile default) instead."
            )
    return errors


def same_release(have: str, want: str) -> bool:
    """Equal versions, a local label (``+cpu``) and a post-release (``.post1``) aside.

    vllm-ascend publishes a post-release sdist on PyPI (0.23.0.post1) while its image is built
    from the release tag (v0.23.0); a post-release only repackages. The patches are the real
    guard: they apply with no fuzz, or the build stops.
    """

    def release(v: str) -> str:
        return re.sub(r"\.post\d+$", "", v.split("+", 1)[0])

    return release(have) == release(want)


def check_installed(with_mindspeed: bool, flavour: str = "ascend") -> list[str]:
    errors = []
    for dist, key in FLAVOUR_INSTALLED[flavour].items():
        want = str(pins.get(key))
        try:
            have = md.version(dist)
        except md.PackageNotFoundError:
            errors.append(f"{dist} is not installed (pins.toml {key} = {want})")
            continue
        if not same_release(have, want):
            errors.append(f"{dist} {have} is installed, but pins.toml {key} = {want}")
    if with_mindspeed:
        try:
            md.version("mindspeed")
        except md.PackageNotFoundError:
            errors.append("mindspeed is not installed although WITH_MINDSPEED=1")
    return errors


def _site_root(package: str) -> str:
    """The folder that holds ``package`` (site-packages), found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{package} is not installed: the base image should provide it")
    return str(Path(spec.origin).parents[1])


def _bundle_components() -> tuple[str, ...]:
    """The components whose series the installed bundle ships (read after it is installed)."""
    from verl_consistency.patches.tooling import apply  # type: ignore[import-not-found]

    return tuple(apply.COMPONENTS)


def patch_components(flavour: str) -> tuple[list[str], list[str]]:
    """(``component root VAR`` lines, notes): what the image's patch step applies in ``flavour``."""
    lines = [f"verl {_site_root('verl')} VERL_ROOT"]
    notes: list[str] = []
    if flavour == "cuda":
        if "vllm" in _bundle_components():
            lines.append(f"vllm {_site_root('vllm')} VLLM_ROOT")
        else:
            notes.append(
                "this bundle ships no vllm patch series yet: vLLM is installed unpatched, so the "
                "rollout side writes no msprobe dump and no dispatch log on this image"
            )
    else:
        lines.append(f"vllm-ascend {pins.get('image.vllm_ascend_src')} VLLM_ASCEND_ROOT")
    return lines, notes


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "freeze" and len(args) == 1:
        out = Path(args[0])
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text("\n".join(freeze()) + "\n", encoding="utf-8")
        tmp.replace(out)
        return 0
    if cmd == "build-args":
        print(" ".join(f"--build-arg {k}={v}" for k, v in build_args().items()))
        return 0
    if cmd == "check-args":
        errors = check_args(dict(os.environ))
    elif cmd == "check-installed":
        errors = check_installed(
            os.environ.get("WITH_MINDSPEED", "0") == "1", os.environ.get("FLAVOUR", "ascend")
        )
    elif cmd == "patch-components":
        lines, notes = patch_components(os.environ.get("FLAVOUR", "ascend"))
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        print("\n".join(lines))
        return 0
    else:
        print(f"unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
        return 2
    for err in errors:
        print(f"error: {err}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
