"""The RayJob schema of every KubeRay release the tests need: the one store of KubeRay CRD test data.

tests/k8s/crds/rayjob-<release>.schema.json.zst is the ``openAPIV3Schema`` of the served
``ray.io/v1`` version of ``ray-operator/config/crd/bases/ray.io_rayjobs.yaml`` at that release's
tag (tests/k8s/crds/README.md lists tag and commit): compact JSON with sorted keys, zstd level 19,
about 5 KB each instead of the CRD's 1.1-1.4 MB of YAML. Nothing else of the CRD matters to an
API server's admission of a RayJob: it prunes unknown fields by this schema, applies its
defaults, then validates against it. Nothing else matters to ``verl-consistency preflight``
either (it reads only the served version's schema), so the API-server stand-in of its tests
(tests/k8s/apiserver_standin.py) wraps these same schemas into a CRD object when it serves one:
one set of files, one generator, for both.

:data:`RELEASES` are the releases the manifests support (the admission tests run on each);
:data:`OLDER` are stored for the preflight only, to show it tells a CRD older than the range.

Regenerate them from a KubeRay checkout (a full clone, or the ``git`` directory of a mirror)::

    .venv/bin/python -m tests.k8s.kuberay_crds --kuberay-git /path/to/kuberay/.git

It reads each tag of :func:`stored` with ``git show`` (the tag must resolve to the recorded
commit), and only once every tag has been read writes the files, each atomically, and removes a
schema file of a release no longer listed: a rerun is safe, and one stopped by a moved tag or a
missing file changes nothing.
tests/k8s/test_kuberay_releases.py checks that the README names every stored release and commit.
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

OLDER: dict[str, str] = {
    "v1.0.0": "1add258fcfd5c83319428355c0af4dde60ea9047",
}
"""Releases older than :data:`RELEASES`, stored only for the preflight's tests: a CRD of 1.0
(``ray.io/v1`` was new then) must be reported as older than the first release it knows."""


def stored() -> dict[str, str]:
    """Every release with a schema file (release: commit), oldest first. A function, not a
    constant, so that a test that swaps :data:`RELEASES` or :data:`OLDER` swaps this too."""
    return {**OLDER, **RELEASES}


SCHEMA_GLOB = "rayjob-*.schema.json.zst"


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
    """Write every stored release's schema file from ``git_dir``; one line per file written or
    removed. Every tag is checked and read before the first file is written, so a moved tag or a
    missing file stops the run with the store as it was."""
    files: dict[Path, tuple[str, bytes]] = {}
    for release, commit in stored().items():
        found = _git(git_dir, "rev-list", "-n", "1", release).strip()
        if found != commit:
            raise SystemExit(
                f"tag {release} is commit {found} in {git_dir}, not {commit}: the tag moved, "
                "or this is not ray-project/kuberay; check and update RELEASES or OLDER"
            )
        crd = yaml.safe_load(_git(git_dir, "show", f"{commit}:{CRD_PATH}"))
        files[schema_file(release)] = (f"{release} ({commit})", encode(served_schema(crd)))
    lines = []
    for path, (what, data) in files.items():
        _write_atomic(path, data)
        lines.append(f"{path.name}: {what}, {len(data)} bytes")
    for stale in sorted(set(CRD_DIR.glob(SCHEMA_GLOB)) - set(files)):
        stale.unlink()
        lines.append(f"{stale.name}: removed (its release is no longer listed)")
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
