"""Write the plain manifests k8s/*.yaml from their kustomize sources: ``make manifests``.

Why a step of its own: most users apply a plain file and never run kustomize, so the plain
file has to name their image everywhere and explain itself. For each file this runs
``kubectl kustomize`` on a throw-away overlay of its base that sets the image (kustomize
``images:``, so every container and init container of every pod follows) and, when asked, an
``imagePullSecrets`` entry in every pod; then it puts the sources' comments back beside their
fields (yaml_comments.py) and writes a header. The output is deterministic: the same sources,
image and secret give the same bytes, and tests/k8s/test_render.py fails when a committed file
is not what its sources render with the default image (``make -s image-name``).

    python k8s/helpers/render.py --image verl-consistency:0.1.0-verl0.8.0-vllm-ascend0.18.0
    python k8s/helpers/render.py --image registry.example.com/ml/vc:0.1.0 --pull-secret regcred
    python k8s/helpers/render.py --image IMG --print fully-async-rayjob.yaml   # to stdout

Standard library and PyYAML only; ``make manifests`` runs it in a small tool venv.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pod_requests  # sibling scripts (k8s/helpers is a folder of scripts, as docker/helpers)
import yaml_comments
from yaml_comments import DocKey, Note, Notes

K8S = Path(__file__).resolve().parents[1]
IMAGE_NAME = "verl-consistency"
"""The image name every source uses; kustomize ``images:`` renames it to the one asked for."""
KUBERAY_RANGE = "1.1.0 to 1.7.0"
"""The KubeRay releases whose RayJob CRD the manifests pass (tests/k8s/test_kuberay_releases.py)."""
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
SITE = K8S / "site"
"""The component every overlay lists last: what `make manifests` was given (image, storage)."""
CLAIMS = {"dump": "verl-consistency-dump", "models": "verl-consistency-models"}
"""The claims whose size `make manifests` sets (DUMP_SIZE, MODELS_SIZE), by their option name."""
SIZE = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


class RenderError(Exception):
    """Bad input or a failed kustomize run; the message says what to do."""


@dataclass(frozen=True)
class Site:
    """What `make manifests` was given beyond the defaults, for the plain files and the overlays.

    ``image`` is None when IMAGE was left to its default (`make -s image-name`): the overlays then
    keep their own flavour's tag (``a3-16npu``: ``-a3``, ``nvidia``: ``-cuda``) instead of the A2
    one. The other fields are None where the sources' values stand (the cluster's default class,
    100Gi and 50Gi).
    """

    image: str | None = None
    storage_class: str | None = None
    sizes: tuple[tuple[str, str], ...] = ()
    """(claim option name, size): ``(("dump", "500Gi"),)``."""

    def check(self) -> None:
        if self.image is not None:
            image_entry(self.image)
        if self.storage_class is not None and not DNS1123.match(self.storage_class):
            raise RenderError(f"STORAGE_CLASS={self.storage_class!r} is not a StorageClass name")
        for claim, size in self.sizes:
            if not SIZE.match(size):
                raise RenderError(f"{claim.upper()}_SIZE={size!r} is not a storage size such as 500Gi")

    def component(self) -> dict[str, Any]:
        """The kustomize Component that applies these settings to any overlay of the bases."""
        ops: dict[str, list[dict[str, Any]]] = {name: [] for name in CLAIMS.values()}
        if self.storage_class:
            for name in CLAIMS.values():
                ops[name].append({"op": "add", "path": "/spec/storageClassName", "value": self.storage_class})
        for claim, size in self.sizes:
            ops[CLAIMS[claim]].append(
                {"op": "replace", "path": "/spec/resources/requests/storage", "value": size}
            )
        patches = [
            {"target": {"kind": "PersistentVolumeClaim", "name": name}, "patch": yaml.safe_dump(o)}
            for name, o in ops.items()
            if o
        ]
        return {
            "apiVersion": "kustomize.config.k8s.io/v1alpha1",
            "kind": "Component",
            "metadata": {"name": "site"},  # kustomize refuses a component with no field at all
            **({"images": [image_entry(self.image)]} if self.image else {}),
            **({"patches": patches} if patches else {}),
        }

    def text(self) -> str:
        """k8s/site/kustomization.yaml: the component, under a header that says where it comes from."""
        given = [
            f"IMAGE={self.image}" if self.image else "",
            f"STORAGE_CLASS={self.storage_class}" if self.storage_class else "",
            *(f"{c.upper()}_SIZE={v}" for c, v in self.sizes),
        ]
        shown = " ".join(g for g in given if g) or "nothing beyond the defaults"
        return (
            "# GENERATED by `make manifests` (k8s/helpers/render.py): what it was given, for every\n"
            "# overlay in k8s/overlays (each lists this component last; `next` names its own image).\n"
            "# Without IMAGE the overlays keep their flavour's image tag; without STORAGE_CLASS the\n"
            "# claims use the cluster's default class. Do not edit: run `make manifests IMAGE=...\n"
            "# [STORAGE_CLASS=...] [DUMP_SIZE=...] [MODELS_SIZE=...]`.\n"
            f"# Given: {shown}.\n"
            "---\n" + yaml.safe_dump(self.component(), sort_keys=False)
        )


@dataclass(frozen=True)
class Flat:
    base: str
    """The source: k8s/base/<base>."""
    usage: str
    """The header's lines after the generated-by paragraph (what to apply, what to edit)."""


RUN_USAGE = """\
#   kubectl apply -f k8s/{mode}-rayjob.yaml   # one collection run (k8s/README.md)
#   kubectl apply -k k8s/overlays/<variant>     # one node, A3, HAMi, CCE, NVIDIA, Volcano, sizes
#
# Per run, edit RUN_ID (a new one each run), MODEL_PATH, COLLECTION (ride-along, the default,
# or prompts-only: the recipe), PHASE and CAPTURE in the ConfigMap
# verl-consistency-{mode}-run below: the RayJob's submitter pod reads them from there.
# The sizes ({sizes}) were copied into the worker groups
# when this file was rendered: change them with a component (k8s/components/pool-sizes,
# one-node, a3-16npu), never in this file alone (the ConfigMap says why)."""

FLATS: dict[str, Flat] = {
    "fully-async-rayjob.yaml": Flat(
        "fully-async",
        RUN_USAGE.format(mode="fully-async", sizes="TRAINER_NODES, ROLLOUT_NODES, NPUS_PER_NODE"),
    ),
    "hybrid-rayjob.yaml": Flat(
        "hybrid", RUN_USAGE.format(mode="hybrid", sizes="TRAINER_NODES, NPUS_PER_NODE")
    ),
    "check-job.yaml": Flat(
        "check",
        """\
#   kubectl apply -f k8s/check-job.yaml          # one consistency check on one NPU node (no Ray)
#   make download-bundle RUN=<RUN_ID>             # then fetch its bundle
#
# Per check, edit RUN_ID (a new one each check), MODEL_PATH and DTYPE in the ConfigMap
# verl-consistency-check-run below; the kubelet expands them into the Job's args. TP was copied
# into the Job's NPU limit when this file was rendered: change both, or TP in the source.""",
    ),
    "model-loader-job.yaml": Flat(
        "model-loader",
        """\
#   kubectl apply -f k8s/model-loader-job.yaml    # the one writer of the model volume
#   kubectl logs -f job/verl-consistency-model-loader
#
# Per load, edit SOURCE (an http(s):// URL, or a path on a volume mounted at /source: see
# k8s/base/model-loader/from-pvc) and DEST (under /models), and optionally DATA_* and REWARD_*,
# in the ConfigMap verl-consistency-model-loader below. A DEST already loaded from the same
# SOURCE is kept; delete the finished Job before the next load.""",
    ),
    "bundle-reader.yaml": Flat(
        "reader",
        """\
# Not applied by hand: `make download-bundle RUN=<run id>` (k8s/download-bundle.sh) replaces
# @POD@, applies it, copies the bundle out with `kubectl cp` and deletes the pod.""",
    ),
}
"""Each plain file under k8s/ and what it is rendered from."""


def image_entry(image: str) -> dict[str, str]:
    """The kustomize ``images:`` entry that renames every ``verl-consistency`` image to ``image``."""
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = name[colon + 1 :] if colon > slash else ""
    repo = name[:colon] if colon > slash else name
    if not repo or (not tag and not digest):
        raise RenderError(
            f"IMAGE={image!r} names no tag: give <registry/name:tag> or <name@sha256:...> "
            f"(`make -s image-name` prints the default)"
        )
    if tag == "latest" or any(c.isspace() for c in image):
        raise RenderError(f"IMAGE={image!r}: name a real tag or a digest, never `latest` and no spaces")
    entry = {"name": IMAGE_NAME, "newName": repo}
    if digest:
        entry["digest"] = digest
    else:
        entry["newTag"] = tag
    return entry


def kustomize(directory: Path, kubectl: str) -> str:
    res = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RenderError(f"{kubectl} kustomize {directory} failed:\n{res.stderr.strip()}")
    return res.stdout


def pod_specs(obj: Any, pointer: str = "") -> Iterator[str]:
    """The JSON pointer of every pod spec in ``obj`` (every mapping that holds ``containers``)."""
    if isinstance(obj, dict):
        if isinstance(obj.get("containers"), list):
            yield pointer
        for key, value in obj.items():
            yield from pod_specs(value, f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}")
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from pod_specs(item, f"{pointer}/{i}")


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _key(doc: dict[str, Any]) -> DocKey:
    return str(doc.get("kind", "")), str((doc.get("metadata") or {}).get("name", ""))


def overlay(
    base: Path, where: Path, image: str, pull_secret: str | None, docs: list[dict[str, Any]], site: Site
) -> None:
    """Write, in ``where``, the overlay of ``base`` that sets the image and the pull secret, with
    the site component (storage class, claim sizes) the overlays use too."""
    patches = []
    if pull_secret:
        for doc in docs:
            ops = [
                {"op": "add", "path": f"{p}/imagePullSecrets", "value": [{"name": pull_secret}]}
                for p in pod_specs(doc)
            ]
            if ops:
                kind, name = _key(doc)
                patches.append({"target": {"kind": kind, "name": name}, "patch": yaml.safe_dump(ops)})
    (where / "site").mkdir()
    (where / "site" / "kustomization.yaml").write_text(site.text())
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, where)],
        "components": ["site"],
        "images": [image_entry(image)],
        **({"patches": patches} if patches else {}),
    }
    (where / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))


@dataclass
class Source:
    """One kustomization of the tree: its folder and parsed file."""

    directory: Path
    kustomization: dict[str, Any]


def sources(directory: Path) -> Iterator[Source]:
    """The kustomizations of ``directory``'s tree, resources before the one that lists them."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text()) or {}
    for entry in kustomization.get("resources") or []:
        if (directory / entry / "kustomization.yaml").is_file():
            yield from sources((directory / entry).resolve())
    yield Source(directory, kustomization)


def _patch_ops(patch: dict[str, Any]) -> list[dict[str, Any]]:
    ops = yaml.safe_load(patch.get("patch") or "[]")
    return ops if isinstance(ops, list) else []


def renames(tree: list[Source]) -> dict[DocKey, DocKey]:
    """Rendered (kind, name) -> source (kind, name), from the patches that rename a document."""
    found: dict[DocKey, DocKey] = {}
    for source in tree:
        for patch in source.kustomization.get("patches") or []:
            target = patch.get("target") or {}
            for op in _patch_ops(patch):
                if op.get("op") == "replace" and op.get("path") == "/metadata/name" and target.get("name"):
                    found[(target["kind"], op["value"])] = (target["kind"], target["name"])
    return found


def collect_notes(base: Path, docs: list[dict[str, Any]]) -> tuple[dict[DocKey, Notes], list[str]]:
    """Every source comment of ``base``'s tree, by rendered document and field; and the patch
    operations whose comments found no field (a sign that a source and its patch disagree)."""
    tree = list(sources(base))
    alias = renames(tree)
    by_source: dict[DocKey, Notes] = {}
    for source in tree:
        for entry in source.kustomization.get("resources") or []:
            path = source.directory / entry
            if path.is_file():
                for key, notes in yaml_comments.source_notes(path.read_text()).items():
                    by_source[key] = notes
    found: dict[DocKey, Notes] = {}
    lost: list[str] = []
    for doc in docs:
        key = _key(doc)
        found[key] = {
            p: Note(list(n.above), list(n.eol)) for p, n in by_source.get(alias.get(key, key), {}).items()
        }
    for source in tree:
        for patch in source.kustomization.get("patches") or []:
            target = patch.get("target") or {}
            if not isinstance(patch.get("patch"), str):
                continue
            for doc in docs:
                kind, name = _key(doc)
                if target.get("kind") not in (None, kind):
                    continue
                if target.get("name") not in (None, alias.get((kind, name), (kind, name))[1], name):
                    continue
                notes, missed = yaml_comments.patch_notes(patch["patch"], doc)
                lost += [f"{source.directory.name}: {m}" for m in missed]
                for path, note in notes.items():
                    found[_key(doc)].setdefault(path, Note()).merge(note)
    return found, lost


def pull_secret_notes(
    docs: list[dict[str, Any]], notes: dict[DocKey, Notes], pull_secret: str | None
) -> None:
    """The image pull secret slot of every pod: the entry, or a commented one to fill in."""
    for doc in docs:
        for pointer in pod_specs(doc):
            spec = yaml_comments.pointer_path(doc, pointer)
            assert spec is not None
            if pull_secret:
                path, text = (
                    (*spec, "imagePullSecrets"),
                    ("# The image's pull Secret (make manifests PULL_SECRET=<name>)."),
                )
            else:
                path, text = (
                    (*spec, "containers"),
                    ("# imagePullSecrets: [{name: <secret>}]  # make manifests PULL_SECRET=<secret>"),
                )
            notes.setdefault(_key(doc), {}).setdefault(path, Note()).above.insert(0, text)


def header(name: str, flat: Flat, image: str, pull_secret: str | None, docs: list[dict[str, Any]]) -> str:
    secret = f", pulled with the Secret {pull_secret}" if pull_secret else ""
    lines = [
        f"# GENERATED by `make manifests` from k8s/base/{flat.base} (k8s/helpers/render.py:",
        "# `kubectl kustomize`, then the sources' comments put back beside their fields). Edit the",
        "# sources and run `make manifests`; tests/k8s fails when this file is not what they render.",
        "#",
        f"# Image of every pod: {image}{secret}",
        "# (make manifests IMAGE=<registry/name:tag> [PULL_SECRET=<secret>] [STORAGE_CLASS=<class>]",
        "# [DUMP_SIZE=100Gi] [MODELS_SIZE=50Gi]; the default IMAGE is what `make -s image-name` prints).",
    ]
    if flat.base in ("fully-async", "hybrid"):
        lines.append(f"# KubeRay operator {KUBERAY_RANGE}: every field here is known to each of them.")
    lines += pod_requests.header_lines(docs)
    return "\n".join([*lines, "#", flat.usage, ""]) + "\n"


def render(
    name: str, image: str, pull_secret: str | None = None, kubectl: str = "kubectl", site: Site | None = None
) -> str:
    """The text of the plain file ``name`` (a key of :data:`FLATS`)."""
    site = site or Site()
    site.check()
    if name not in FLATS:
        raise RenderError(f"no plain file {name!r}: one of {', '.join(FLATS)}")
    if pull_secret is not None and not DNS1123.match(pull_secret):
        raise RenderError(f"PULL_SECRET={pull_secret!r} is not a Secret name (lower-case DNS-1123)")
    flat = FLATS[name]
    base = K8S / "base" / flat.base
    with tempfile.TemporaryDirectory(prefix="vc-render-") as tmp:
        overlay(base, Path(tmp), image, pull_secret, _docs(kustomize(base, kubectl)), site)
        body = kustomize(Path(tmp), kubectl)
    docs = _docs(body)
    notes, lost = collect_notes(base, docs)
    if lost:
        raise RenderError(f"k8s/base/{flat.base}: comments of these patch operations found no field: {lost}")
    pull_secret_notes(docs, notes, pull_secret)
    for key, lines in pod_requests.setting_notes(docs).items():
        for path, line in lines.items():
            notes.setdefault(key, {}).setdefault(path, Note()).above.append(line)
    return header(name, flat, image, pull_secret, docs) + yaml_comments.insert(body, notes)


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--image", required=True, help="<registry/name:tag> or <name@sha256:...>")
    parser.add_argument("--pull-secret", default=None, help="an image pull Secret for every pod")
    parser.add_argument("--kubectl", default=os.environ.get("KUBECTL", "kubectl"))
    parser.add_argument(
        "--default-image",
        action="store_true",
        help="IMAGE is `make -s image-name`'s default: the overlays keep their flavour's tag",
    )
    parser.add_argument(
        "--storage-class", default=None, help="the claims' StorageClass (default: the cluster's)"
    )
    for claim in CLAIMS:
        parser.add_argument(f"--{claim}-size", default=None, help=f"the {claim} claim's size (e.g. 500Gi)")
    parser.add_argument("--print", dest="only", choices=sorted(FLATS), help="print one file instead")
    args = parser.parse_args(argv)
    site = Site(
        image=None if args.default_image else args.image,
        storage_class=args.storage_class or None,
        sizes=tuple((c, v) for c in CLAIMS if (v := getattr(args, f"{c}_size"))),
    )
    secret = args.pull_secret or None
    try:
        if args.only:
            sys.stdout.write(render(args.only, args.image, secret, args.kubectl, site))
            return 0
        for name in FLATS:
            write_atomic(K8S / name, render(name, args.image, secret, args.kubectl, site))
            print(f"wrote k8s/{name}")
        write_atomic(SITE / "kustomization.yaml", site.text())
        print("wrote k8s/site/kustomization.yaml (the same settings for k8s/overlays/*)")
    except RenderError as exc:
        print(f"k8s/helpers/render.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
