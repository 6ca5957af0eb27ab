"""`make manifests`: the plain files k8s/*.yaml, their image knob, and the comments they carry.

The renderer (k8s/helpers/render.py) runs real `kubectl kustomize` on each base through a
throw-away overlay that sets the image (and a pull Secret), then puts the sources' comments back
beside their fields (k8s/helpers/yaml_comments.py). These tests check that the committed files are
what it writes with the default image (`make -s image-name`), that IMAGE and PULL_SECRET reach
every pod and nothing else changes, that the comments change no value, and that the two RayJob
files keep at least one comment line for every six lines.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.conftest import FILES, K8S, READER_FILE, REPO, kubectl, of_kind, render
from verl_consistency.entrypoints.preflight import manifest as mf
from verl_consistency.entrypoints.preflight.manifest import show_quantity

sys.path.insert(0, str(K8S / "helpers"))
import render as renderer  # k8s/helpers is a folder of scripts, as docker/helpers
import yaml_comments

PLAIN = sorted(renderer.FLATS)
CUSTOM_IMAGE = "registry.example.com:5000/ml/verl-consistency:0.1.0-site"
SECRET = "regcred"
MIN_COMMENT_RATIO = 1 / 6


def default_image() -> str:
    res = subprocess.run(
        ["make", "-s", "--no-print-directory", "image-name", "PINS=current"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def rendered(name: str, image: str, secret: str | None = None) -> str:
    """What `make manifests IMAGE=image PULL_SECRET=secret` writes into k8s/<name>."""
    args = [sys.executable, str(K8S / "helpers" / "render.py"), "--image", image, "--print", name]
    args += ["--kubectl", kubectl(), *(["--pull-secret", secret] if secret else [])]
    res = subprocess.run(args, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


def docs_of(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for pointer in renderer.pod_specs(doc):
        spec = doc
        for token in pointer.strip("/").split("/") if pointer else []:
            spec = spec[int(token)] if isinstance(spec, list) else spec[token.replace("~1", "/")]
        found += [*spec.get("initContainers", []), *spec["containers"]]
    return found


def comment_ratio(text: str) -> float:
    lines = text.splitlines()
    return sum(line.lstrip().startswith("#") for line in lines) / len(lines)


@pytest.mark.parametrize("name", PLAIN)
def test_plain_files_are_current(name: str) -> None:
    """k8s/<name> is what `make manifests` writes now, with the default image."""
    assert (K8S / name).read_text() == rendered(name, default_image()), (
        f"k8s/{name} is not what its sources render: run `make manifests`"
    )


def test_the_plain_files_run_the_image_make_image_builds() -> None:
    image = default_image()
    for path in [*FILES.values(), K8S / "check-job.yaml", READER_FILE]:
        images = {c["image"] for d in docs_of(path.read_text()) for c in containers(d)}
        assert images == {image}, path.name
    assert "busybox" not in READER_FILE.read_text()


@pytest.mark.parametrize("name", PLAIN)
def test_image_and_pull_secret_reach_every_pod_and_change_nothing_else(name: str) -> None:
    plain = docs_of(rendered(name, default_image()))
    custom = docs_of(rendered(name, CUSTOM_IMAGE, SECRET))
    pods = 0
    for doc in custom:
        for c in containers(doc):
            assert c["image"] == CUSTOM_IMAGE
            c["image"] = default_image()
        for pointer in list(renderer.pod_specs(doc)):
            path = yaml_comments.pointer_path(doc, pointer)
            assert path is not None
            spec: Any = doc
            for token in pointer.strip("/").split("/") if pointer else []:
                spec = spec[int(token)] if isinstance(spec, list) else spec[token.replace("~1", "/")]
            assert spec.pop("imagePullSecrets") == [{"name": SECRET}]
            pods += 1
    assert custom == plain
    assert pods >= 1


def test_the_default_file_has_a_pull_secret_slot_in_every_pod() -> None:
    text = FILES["file:fully-async"].read_text()
    slots = [line for line in text.splitlines() if line.lstrip().startswith("# imagePullSecrets:")]
    # head, trainer, rollout, submitter, postprocess
    assert len(slots) == sum(len(list(renderer.pod_specs(d))) for d in docs_of(text)) == 5
    assert "imagePullSecrets" not in yaml.safe_dump_all(docs_of(text))


@pytest.mark.parametrize(
    ("image", "words"),
    [
        ("verl-consistency", "names no tag"),
        ("registry.example.com:5000/verl-consistency", "names no tag"),
        ("verl-consistency:latest", "never `latest`"),
    ],
)
def test_an_image_without_a_real_tag_is_refused(image: str, words: str) -> None:
    with pytest.raises(renderer.RenderError, match=words):
        renderer.image_entry(image)


def test_a_digest_and_a_registry_port_are_kept_apart() -> None:
    assert renderer.image_entry("reg:5000/ml/vc@sha256:ab") == {
        "name": "verl-consistency",
        "newName": "reg:5000/ml/vc",
        "digest": "sha256:ab",
    }
    assert renderer.image_entry(CUSTOM_IMAGE)["newTag"] == "0.1.0-site"


def test_make_manifests_passes_its_knobs() -> None:
    res = subprocess.run(
        ["make", "-n", "--no-print-directory", "manifests", f"IMAGE={CUSTOM_IMAGE}", f"PULL_SECRET={SECRET}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    (line,) = [x for x in res.stdout.replace("\\\n", " ").splitlines() if "k8s/helpers/render.py" in x]
    assert f'--image "{CUSTOM_IMAGE}"' in line
    assert f'--pull-secret "{SECRET}"' in line
    res = subprocess.run(["make", "-n", "k8s-render"], cwd=REPO, capture_output=True, text=True)
    assert "manifests" in res.stdout


@pytest.mark.parametrize("mode", ["fully-async", "hybrid"])
def test_the_rayjob_files_teach(mode: str) -> None:
    """At least one comment line in six, and the comments change no value: the file holds
    exactly what kustomize renders from its base."""
    path = FILES[f"file:{mode}"]
    text = path.read_text()
    assert comment_ratio(text) >= MIN_COMMENT_RATIO, f"{path.name}: {comment_ratio(text):.3f}"
    assert render(f"file:{mode}")[1] == render(f"kustomize:base/{mode}")[1]


@pytest.mark.parametrize("mode", ["fully-async", "hybrid"])
def test_the_sizes_say_beside_them_that_they_change_together(mode: str) -> None:
    lines = FILES[f"file:{mode}"].read_text().splitlines()
    keys = ["TRAINER_NODES", "NPUS_PER_NODE"] + (["ROLLOUT_NODES"] if mode == "fully-async" else [])
    for key in keys:
        (at,) = [i for i, line in enumerate(lines) if line.startswith(f"  {key}: ")]
        above = []
        while lines[at - 1].lstrip().startswith("#"):
            at -= 1
            above.insert(0, lines[at])
        note = " ".join(above)
        for word in ("SIZE", "together", "component"):
            assert word in note, (key, note)


def test_fields_keep_their_source_comments() -> None:
    """A few fields of the fully-async file, with the comment their source gives them."""
    lines = FILES["file:fully-async"].read_text().splitlines()

    def above(prefix: str, nth: int = 0) -> str:
        at = [i for i, line in enumerate(lines) if line.lstrip().startswith(prefix)][nth]
        block = []
        while lines[at - 1].lstrip().startswith("#"):
            at -= 1
            block.insert(0, lines[at].strip())
        return " ".join(block)

    assert "Ray's custom resources as JSON" in above("resources: '''{\"NPU\": 0}'''")
    assert "Each group offers its own tag" in above('resources: \'\'\'{"NPU": 8 , "verl_consistency_trainer"')
    assert "The rollout group: a copy of the trainer group" in above("- groupName: rollout")
    assert "written out in full" in above("entrypoint:")
    assert "worker_process_setup_hook runs in every Ray worker" in above("runtimeEnvYAML:")
    assert "KubeRay 1.1 never retries" in above("submissionMode:")
    eol = [line for line in lines if line.lstrip().startswith("dashboard-host:")]
    assert eol == ["        dashboard-host: 0.0.0.0  # the submitter reaches the job API from another pod"]


def test_rendering_is_deterministic() -> None:
    assert rendered("hybrid-rayjob.yaml", CUSTOM_IMAGE) == rendered("hybrid-rayjob.yaml", CUSTOM_IMAGE)


def test_comments_follow_fields_through_a_patch(tmp_path: Path) -> None:
    """On a small base of its own: list items by name through kustomize's key sorting, a JSON
    patch's comments on the item it copies, a block scalar's `#` lines left alone, and an
    end-of-line comment moved above a value that spans lines."""
    (tmp_path / "pod.yaml").write_text(
        "# the header of a one-document file\n"
        "---\n"
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        "  name: demo\n"
        "data:\n"
        "  # the script: not a comment inside it\n"
        "  script: |\n"
        "    # a shell comment\n"
        "    echo hi\n"
        "  long: aaaa bbbb cccc dddd eeee ffff gggg hhhh iiii jjjj kkkk llll mmmm nnnn oooo  # long\n"
    )
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [pod.yaml]\n"
        "patches:\n"
        "  - target: {kind: ConfigMap, name: demo}\n"
        "    patch: |-\n"
        "      # a copy of the script\n"
        "      - {op: copy, from: /data/script, path: /data/again}\n"
    )
    body = subprocess.run(
        [kubectl(), "kustomize", str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    docs = docs_of(body)
    notes = yaml_comments.source_notes((tmp_path / "pod.yaml").read_text())
    patch_notes, lost = yaml_comments.patch_notes(
        yaml.safe_load((tmp_path / "kustomization.yaml").read_text())["patches"][0]["patch"], docs[0]
    )
    assert lost == []
    for path, note in patch_notes.items():
        notes[("ConfigMap", "demo")].setdefault(path, yaml_comments.Note()).merge(note)
    out = yaml_comments.insert(body, notes)
    assert docs_of(out) == docs
    lines = out.splitlines()
    assert lines[0] == "# the header of a one-document file"
    assert lines[lines.index("  again: |") - 1] == "  # a copy of the script"
    assert lines[lines.index("  script: |") - 1] == "  # the script: not a comment inside it"
    assert "    # a shell comment" in lines  # the scalar's own line, once
    assert sum("# a shell comment" in line for line in lines) == 2  # in `script` and its copy
    long_at = next(i for i, line in enumerate(lines) if line.startswith("  long:"))
    if lines[long_at + 1].startswith("    "):  # kustomize folded it: the comment went above
        assert lines[long_at - 1] == "  # long"
    else:
        assert lines[long_at].endswith("  # long")


@pytest.mark.parametrize(
    ("line", "comment"),
    [
        ("a: b  # c", "# c"),
        ("a: 'x # y'  # z", "# z"),
        ('a: "x#y"', None),
        ("a: x#y", None),
        ("# only", None),
    ],
)
def test_end_of_line_comments_are_found_outside_quotes(line: str, comment: str | None) -> None:
    assert yaml_comments.eol_comment(line) == comment


def test_a_rayjob_file_names_its_comments_sources() -> None:
    (job,) = of_kind(render("file:fully-async")[1], "RayJob")
    assert job["metadata"]["name"] == "verl-consistency-fully-async"
    header = FILES["file:fully-async"].read_text().split("\n\n", 1)[0]
    assert "GENERATED by `make manifests` from k8s/base/fully-async" in header
    assert default_image() in header


def test_the_site_component_is_current() -> None:
    """k8s/site is what `make manifests` writes without IMAGE or storage settings: the overlays
    keep their flavour's image and the sources' storage."""
    assert (K8S / "site" / "kustomization.yaml").read_text() == renderer.Site().text()
    assert renderer.Site().component()["metadata"] == {"name": "site"}
    assert "images" not in renderer.Site().component()


def _amounts(amounts: dict[str, Any]) -> str:
    shown = [
        f"{show_quantity('cpu', amounts['cpu'])} CPU",
        f"{show_quantity('memory', amounts['memory'])} memory",
    ]
    shown += [f"{show_quantity(k, v)} {k}" for k, v in sorted(amounts.items()) if "/" in k]
    return ", ".join(shown)


@pytest.mark.parametrize("name", PLAIN)
def test_the_requests_written_are_what_the_preflight_sums(name: str) -> None:
    """The header's total and the notes beside the size settings are the requests `make
    preflight` counts against the nodes and the quota, for this very file."""
    text = (K8S / name).read_text()
    m = mf.read_file(K8S / name)
    groups = m.pod_groups()
    total: dict[str, Any] = {}
    for g in groups:
        for k, v in g.amounts("requests").items():
            if k in ("cpu", "memory") or "/" in k:
                total[k] = total.get(k, 0) + v * g.replicas
    pods = sum(g.replicas for g in groups)
    header = " ".join(line.lstrip("# ") for line in text.split("\n---", 1)[0].splitlines())
    said = f"It asks for (requests over every pod and replica): {pods} pod{'s' if pods != 1 else ''}, "
    assert said + _amounts(total) + "." in header
    for g in groups:
        if g.name.startswith("worker group "):
            group = g.name.removeprefix("worker group ")
            each = _amounts(g.amounts("requests"))
            note = f"# Each {group} pod requests {each} (this file: {g.replicas} of them)."
            assert note in text, f"k8s/{name} lacks, beside {group}'s size setting: {note}"
