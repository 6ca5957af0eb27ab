"""The RayJob schema of every KubeRay release the manifests support, kept as test data.

tests/k8s/crds/rayjob-<release>.schema.json.zst is the ``openAPIV3Schema`` of the served
``ray.io/v1`` version of ``ray-operator/config/crd/bases/ray.io_rayjobs.yaml`` at that release's
tag (tests/k8s/crds/README.md lists tag and commit): compact JSON with sorted keys, zstd level 19,
about 5 KB each instead of the CRD's 1.1-1.4 MB of YAML. Nothing else of the CRD matters to an
API server's admission of a RayJob: it prunes unknown fields by this schema, applies its
defaults, then validates against it.

Regenerate them from a KubeRay checkout (a full clone, or the ``git`` directory of a mirror)::

    .venv/bin/python -m tests.k8s.kuberay_crds --kuberay-git /path/to/kuberay/.git

It reads each tag of :data:`RELEASES` with ``git show`` (the tag must resolve to the recorded
commit) and writes each file atomically; tests/k8s/test_kuberay_releases.py checks that the
README names every release and commit of :data:`RELEASES`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
import zstandard

CRD_DIR = Path(__file__).with_name("crds")
CRD_PATH = "ray-operator/config/crd/bases/ray.io_rayjobs.yaml"
API_VERSION = "v1"
RELEASES: dict[str, str] = {
    # release: the commit its tag points at (the first of each minor line, then each line's latest patch)
    "v1.1.0": "8adc5387cb705e555d4765c7f9f7bd6e211135a4",
    "v1.2.2": "0ea404b84e45b7b8822b071c7c02b2afb3bb3eae",
    "v1.3.2": "66e4132c0d3f0fe1f258004073284583994b2341",
    "v1.4.2": "34ea80e0f51f80fb092cdc17ca75d4139449edef",
    "v1.5.2": "9f65eca1d6226d20f9e7c340f2af27cc4a1c9985",
    "v1.6.2": "598eb66aa077c55ae04fa87b192238a3ec184e88",
    "v1.7.0": "59d663aeec13760646da3db9c1cf8cfe883e30b7",
}
"""The releases the manifests are validated against, oldest first: 1.1.0 to 1.7.0."""


def schema_file(release: str) -> Path:
    return CRD_DIR / f"rayjob-{release}.schema.json.zst"


@functools.cache
def _load(release: str) -> str:
    path = schema_file(release)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: regenerate it (python -m tests.k8s.kuberay_crds --help)")
    return zstandard.ZstdDecompressor().decompress(path.read_bytes()).decode()


def load_schema(release: str) -> dict[str, Any]:
    """A fresh copy of the release's RayJob ``openAPIV3Schema`` (callers may change it)."""
    return dict(json.loads(_load(release)))


def served_schema(crd: dict[str, Any], version: str = API_VERSION) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``version`` in a full CRD document; refuses an unserved one."""
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            if not v.get("served"):
                raise ValueError(f"the CRD does not serve {version}")
            return dict(v["schema"]["openAPIV3Schema"])
    raise KeyError(f"the CRD has no version {version}")


def encode(schema: dict[str, Any]) -> bytes:
    """Deterministic bytes: the same schema always gives the same file."""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    return zstandard.ZstdCompressor(level=19).compress(text.encode())


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would follow the file into git
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _git(git_dir: Path, *args: str) -> str:
    res = subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} in {git_dir} failed: {res.stderr.strip()}")
    return res.stdout


def regenerate(git_dir: Path) -> list[str]:
    """Write every release's schema file from ``git_dir``; returns one line per file written."""
    lines = []
    for release, commit in RELEASES.items():
        found = _git(git_dir, "rev-list", "-n", "1", release).strip()
        if found != commit:
            raise SystemExit(
                f"tag {release} is commit {found} in {git_dir}, not {commit}: the tag moved, "
                "or this is not ray-project/kuberay; check and update RELEASES"
            )
        crd = yaml.safe_load(_git(git_dir, "show", f"{commit}:{CRD_PATH}"))
        data = encode(served_schema(crd))
        _write_atomic(schema_file(release), data)
        lines.append(f"{schema_file(release).name}: {release} ({commit}), {len(data)} bytes")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kuberay-git", type=Path, required=True, help="a KubeRay git directory")
    args = parser.parse_args(argv)
    for line in regenerate(args.kuberay_git):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
