"""Write crds/rayjobs.ray.io.<tag>.json.zst from a KubeRay git checkout (how the fixtures were made).

    python tests/k8s/preflight_fixtures/make_crd_fixtures.py /path/to/kuberay.git

Each fixture is KubeRay's own ``ray-operator/config/crd/bases/ray.io_rayjobs.yaml`` at a release
tag (``git show <tag>:...``), trimmed to what ``verl-consistency preflight`` reads: the served
``v1`` version and its ``openAPIV3Schema`` (field names, types, ``items``,
``additionalProperties``, ``x-kubernetes-*``), without the ``description`` texts and the
``status`` subtree (about 85% of each file), then zstd-compressed (~12 kB instead of ~1.3 MB).
The stand-in API server serves them as the real one serves a CRD: JSON.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import yaml
import zstandard

# The last patch release of each minor from 1.1 to 1.7, and 1.0.0 (older than the range).
TAGS = ("v1.0.0", "v1.1.0", "v1.2.2", "v1.3.2", "v1.4.2", "v1.5.2", "v1.6.2", "v1.7.0")
CRD_PATH = "ray-operator/config/crd/bases/ray.io_rayjobs.yaml"
OUT = Path(__file__).resolve().parent / "crds"


def trimmed(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: trimmed(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [trimmed(v) for v in node]
    return node


def fixture(crd: dict[str, Any]) -> dict[str, Any]:
    versions = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    for v in versions:
        v["schema"]["openAPIV3Schema"]["properties"].pop("status", None)
        v.pop("subresources", None)
        v.pop("additionalPrinterColumns", None)
    crd["spec"]["versions"] = versions
    crd["metadata"] = {"name": crd["metadata"]["name"], "annotations": crd["metadata"].get("annotations", {})}
    return trimmed(crd)


def main(repo: Path) -> None:
    OUT.mkdir(exist_ok=True)
    for tag in TAGS:
        text = subprocess.run(
            ["git", "-C", str(repo), "show", f"{tag}:{CRD_PATH}"], capture_output=True, text=True, check=True
        ).stdout
        data = orjson.dumps(fixture(yaml.load(text, Loader=yaml.CSafeLoader)), option=orjson.OPT_SORT_KEYS)
        out = OUT / f"rayjobs.ray.io.{tag}.json.zst"
        out.write_bytes(zstandard.ZstdCompressor(level=19).compress(data))
        print(f"wrote {out} ({len(data)} bytes of JSON)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
