"""Build docker/Dockerfile for real (buildah, on the stand-in base) and check inside the image.

The build runs once per session (``built_image`` in conftest.py); each test here runs one
command in the built image with podman (runc, host network).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from verl_consistency.contracts import pins
from verl_consistency.entrypoints.msprobe.defaults import default_configs
from verl_consistency.patches.tooling import apply

from .conftest import REPO, labels, podman_run

# pinset: `make test-next` builds and checks the next set's image too (PIN_SET=next).
pytestmark = [pytest.mark.image, pytest.mark.pinset]


ASCEND_COMPONENTS = ("verl", "vllm-ascend")
"""What the Ascend image patches (the CUDA flavour patches verl and vllm: test_image_cuda.py)."""


def sh(image: str, script: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return podman_run(image, "-c", script, entrypoint="/bin/sh", **kw)  # type: ignore[arg-type]


def test_build_reports_time_and_size(built_image):
    assert built_image.size > built_image.base_size
    assert built_image.build_seconds > 0


def test_patches_are_applied_in_place_and_verified(built_image):
    res = sh(
        built_image.ref,
        ". /opt/verl-consistency/patched-roots.env && "
        'verl-consistency patches verify --component verl --root "$VERL_ROOT" && '
        'verl-consistency patches verify --component vllm-ascend --root "$VLLM_ASCEND_ROOT" && '
        'echo "roots $VERL_ROOT $VLLM_ASCEND_ROOT"',
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for component in ASCEND_COMPONENTS:
        n = len(apply.read_series(component))
        assert f"{component}: {n} patch(es) applied under" in res.stdout
    roots = next(line for line in res.stdout.splitlines() if line.startswith("roots ")).split()
    assert roots[1].endswith("site-packages")
    assert roots[2] == pins.load().image.vllm_ascend_src


def test_patched_files_carry_every_hunk(built_image):
    """Each + line of each patch is in the image's file, unless a later patch of the series edits it."""
    checks = []
    for component in ASCEND_COMPONENTS:
        for patch in apply.read_series(component):
            checks.append((component, patch))
    if not checks:
        pytest.skip("both patch series are empty: nothing to look for beyond `verify`")
    mark = "@@verl-consistency-file@@ "  # upstream files contain "=== " lines themselves
    script = ". /opt/verl-consistency/patched-roots.env; "
    for component, patch in checks:
        root = "$VERL_ROOT" if component == "verl" else "$VLLM_ASCEND_ROOT"
        for target in patch.targets:
            script += f'echo "{mark}{component} {target}"; cat "{root}/{target}"; '
    res = sh(built_image.ref, script)
    assert res.returncode == 0, res.stderr
    files: dict[tuple[str, str], str] = {}
    for chunk in res.stdout.split(mark)[1:]:
        head, _, body = chunk.partition("\n")
        comp, target = head.split(" ", 1)
        files[(comp, target)] = body
    for i, (component, patch) in enumerate(checks):
        added = [ln[1:] for ln in patch.text.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
        later = {
            ln[1:]
            for comp, other in checks[i + 1 :]
            if comp == component
            for ln in other.text.splitlines()
            if ln.startswith("-") and not ln.startswith("---")
        }
        body = "".join(files[(component, t)] for t in patch.targets)
        missing = [ln for ln in added if ln.strip() and ln not in body and ln not in later]
        assert not missing, f"{component}/{patch.name}: lines not in the image: {missing[:3]}"


def test_base_packages_are_not_replaced(built_image, standin_base):
    probe = "python3 -m pip list --format=freeze 2>/dev/null | grep -iE '^(torch|vllm.ascend)=='"
    before = sh(standin_base, probe)
    after = sh(built_image.ref, probe)
    assert before.returncode == 0, before.stderr
    assert after.stdout == before.stdout
    editable = sh(built_image.ref, "python3 -m pip list -e 2>/dev/null")
    assert pins.load().image.vllm_ascend_src in editable.stdout


def test_installed_versions_are_the_pins(built_image):
    tool = "/opt/verl-consistency/helpers/image_build.py"
    res = sh(built_image.ref, f"WITH_MINDSPEED=0 python3 {tool} check-installed")
    assert res.returncode == 0, res.stderr
    res = sh(
        built_image.ref,
        "python3 -c 'import importlib.metadata as m; "
        'print(m.version("mindstudio-probe"), m.version("verl"))\'',
    )
    p = pins.load()
    assert res.stdout.split() == [p.upstream.mindstudio_probe, p.upstream.verl]


def test_help_answers_through_the_entrypoint(built_image):
    res = podman_run(built_image.ref, "--help")
    assert res.returncode == 0, res.stderr
    for command in ("patches", "version", "msprobe-configs", "run", "postprocess"):
        assert command in res.stdout, f"`verl-consistency --help` does not list {command}"
    default = podman_run(built_image.ref)
    assert default.returncode == 0
    assert "Usage: verl-consistency" in default.stdout


def test_fully_async_dry_run(built_image):
    res = podman_run(
        built_image.ref,
        *("run", "fully-async", "--dry-run", "--json", "--run-id", "demo", "model=/models/tiny-qwen2"),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    plan = json.loads(res.stdout)
    argv = plan["argv"]
    if pins.load().set.name == "current":
        assert argv[1:3] == ["-m", "verl.experimental.fully_async_policy.fully_async_main"]
    else:  # verl 0.9's V1 trainer: fully async is main_ppo's separate_async mode
        assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
        assert "trainer.v1.trainer_mode=separate_async" in argv
    # The plan's python is the image's python, and the run folder is under the image's dump root.
    exists = sh(built_image.ref, f'test -x "{argv[0]}" && echo yes')
    assert exists.stdout.strip() == "yes", f"{argv[0]} is not an executable in the image"
    assert "/dump/demo" in res.stdout


def test_entrypoint_loads_cann_environment_when_present(built_image, tmp_path):
    """A stand-in set_env.sh (the stand-in base has no CANN) is sourced before the command runs."""
    fake = tmp_path / "set_env.sh"
    fake.write_text("export VERL_CONSISTENCY_DUMP_ROOT=/from-set-env\n")
    res = podman_run(
        built_image.ref,
        *("run", "fully-async", "--dry-run", "--json", "--run-id", "demo", "model=/models/tiny-qwen2"),
        volumes={fake: "/usr/local/Ascend/ascend-toolkit/set_env.sh:ro"},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "/from-set-env/demo" in res.stdout
    # Ray nodes under KubeRay start from a login shell, which reads /etc/profile.d.
    login = podman_run(
        built_image.ref,
        *("-lc", "echo $VERL_CONSISTENCY_DUMP_ROOT"),
        volumes={fake: "/usr/local/Ascend/ascend-toolkit/set_env.sh:ro"},
        entrypoint="/bin/bash",
    )
    assert login.returncode == 0, login.stderr
    assert login.stdout.strip() == "/from-set-env"


def test_default_msprobe_configs_are_baked_in(built_image):
    expected = default_configs()
    assert len(expected) == 2
    for rel, cfg in expected.items():
        res = sh(built_image.ref, f"cat /etc/verl-consistency/msprobe/{rel.name}")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == cfg


def test_labels_carry_pins_and_revision(built_image):
    got = labels(built_image.ref)
    p = pins.load()
    assert got["io.github.verl-consistency.pins.set"] == p.set.name
    assert got["io.github.verl-consistency.pins.verl"] == p.upstream.verl
    assert got["io.github.verl-consistency.pins.vllm-ascend"] == p.upstream.vllm_ascend
    assert got["io.github.verl-consistency.pins.mindstudio-probe"] == p.upstream.mindstudio_probe
    assert got["io.github.verl-consistency.pins.megatron-core"] == p.install.megatron_core
    assert got["org.opencontainers.image.base.name"] == p.image.base.a2
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    assert got["org.opencontainers.image.revision"] == head.strip()
    # The bundle inside follows the image's set at run time.
    res = sh(built_image.ref, 'echo "$VERL_CONSISTENCY_PIN_SET"; verl-consistency version')
    assert res.stdout.splitlines()[0] == p.set.name, res.stdout + res.stderr
    assert f"pin set {p.set.name} (" in res.stdout
    # Built on the stand-in: the label says so, so such an image is never mistaken for a real one.
    assert got.get("io.github.verl-consistency.standin") == "base"


def test_no_secret_in_the_image(built_image):
    res = sh(built_image.ref, "ls /run/secrets 2>/dev/null; python3 -m pip config list; echo done")
    assert res.stdout.strip().splitlines()[-1] == "done"
    assert "cabundle" not in res.stdout
    assert "cert" not in res.stdout


def test_postprocess_runs_on_a_small_real_sample(built_image, tmp_path):
    """Real msprobe dumps of a tiny Qwen2 on both sides, made in the image, then postprocessed."""
    dump = tmp_path / "dump"
    dump.mkdir()
    script = (
        "set -e; for side in rollout actor; do python3 /t/make_sample_run.py /dump/sample-1 $side; done; "
        "verl-consistency postprocess /dump/sample-1 --out /dump/bundles"
    )
    res = podman_run(
        built_image.ref,
        "-c",
        script,
        entrypoint="/bin/sh",
        volumes={REPO / "tests/docker": "/t:ro", dump: "/dump"},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    bundles = list((dump / "bundles").glob("bundle-sample-1*.tar.zst"))
    assert len(bundles) == 1, sorted(p.name for p in dump.rglob("*"))[:50]
