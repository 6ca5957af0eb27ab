"""checkov (offline) over the rendered manifests: no failed check except those in k8s/checkov-skips.txt.

checkov has heavy pinned dependencies, so it lives in its own tool venv (not the project's):
``python3 -m venv .cache/checkov-venv && .cache/checkov-venv/bin/pip install checkov``, or point
VERL_CONSISTENCY_CHECKOV at a checkov executable. checkov does not look inside a RayJob's pod
templates; test_manifests.py::test_pod_templates_are_locked_down covers those. One checkov run
covers both bases, the check Job (k8s/base/check), the model loader (k8s/base/model-loader), the
bundle-reader and prompts-writer pods, and every pairwise combination of the components
(test_components.py; rendered once, shared through conftest.render's cache).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.k8s.conftest import K8S, REPO, render
from tests.k8s.test_components import COMBOS

SKIPS = K8S / "checkov-skips.txt"


def checkov() -> str:
    for candidate in (
        os.environ.get("VERL_CONSISTENCY_CHECKOV"),
        str(REPO / ".cache/checkov-venv/bin/checkov"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    found = shutil.which("checkov")
    if not found:
        pytest.skip(
            "checkov not found: python3 -m venv .cache/checkov-venv && "
            ".cache/checkov-venv/bin/pip install checkov (or set VERL_CONSISTENCY_CHECKOV)"
        )
    return found


def skips() -> list[tuple[str, str, str]]:
    rows = []
    for line in SKIPS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            check, glob, reason = line.split(None, 2)
            rows.append((check, glob, reason))
    return rows


def test_checkov_reports_only_listed_failures(tmp_path: Path) -> None:
    files = []
    for i, source in enumerate(
        [
            "kustomize:base/fully-async",
            "kustomize:base/hybrid",
            "kustomize:base/check",
            "kustomize:base/model-loader",
            *COMBOS,
        ]
    ):
        path = tmp_path / f"{i:02d}-{source.replace(':', '-').replace('/', '-').replace('+', '-')}.yaml"
        path.write_text(render(source)[0])
        files += ["-f", str(path)]
    files += ["-f", str(K8S / "bundle-reader.yaml"), "-f", str(K8S / "prompts-writer.yaml")]
    res = subprocess.run(
        [
            checkov(),
            *files,
            "--framework",
            "kubernetes",
            "--skip-download",
            "--quiet",
            "--compact",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    assert res.stdout.strip(), res.stderr[-3000:]
    reports = json.loads(res.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [(c["check_id"], c["resource"]) for r in reports for c in r["results"]["failed_checks"]]
    passed = sum(r["summary"]["passed"] for r in reports)
    assert passed > 50, "checkov checked almost nothing: did it parse the files?"
    # --quiet lists failed checks only; every file fails the namespace check (listed in SKIPS).
    checked = {Path(c["file_path"]).name for r in reports for c in r["results"]["failed_checks"]}
    assert len(checked) == len(files) // 2, f"checkov did not check every file: {sorted(checked)}"
    rules = skips()
    unexplained = [f for f in failed if not any(f[0] == c and fnmatch.fnmatch(f[1], g) for c, g, _ in rules)]
    assert unexplained == [], f"fix these or list them with a reason in {SKIPS}"
    stale = [r for r in rules if not any(f[0] == r[0] and fnmatch.fnmatch(f[1], r[1]) for f in failed)]
    assert stale == [], f"these lines of {SKIPS} no longer match a failure: remove them"
    assert all(len(reason) > 20 for _, _, reason in rules)
