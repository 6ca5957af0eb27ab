"""Fixtures for the k8s tests: every manifest source rendered once per session."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
FILES = {"file:fully-async": K8S / "fully-async-rayjob.yaml", "file:hybrid": K8S / "hybrid-rayjob.yaml"}
KUSTOMIZATIONS = sorted(
    p.parent for p in K8S.glob("*/*/kustomization.yaml") if p.parent.parent.name != "components"
)
SOURCES = [*FILES, *(f"kustomize:{d.relative_to(K8S)}" for d in KUSTOMIZATIONS)]


def kubectl() -> str:
    found = shutil.which("kubectl")
    if not found:
        pytest.skip("kubectl (with its built-in kustomize) is not on PATH: install kubectl >= 1.27")
    return found


@cache
def render(source: str) -> tuple[str, list[dict[str, Any]]]:
    """(YAML text, documents) of one source: a plain file, or `kubectl kustomize <dir>`."""
    if source in FILES:
        text = FILES[source].read_text()
    else:
        directory = K8S / source.split(":", 1)[1]
        res = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True)
        assert res.returncode == 0, f"kubectl kustomize {directory} failed:\n{res.stderr}"
        text = res.stdout
    return text, [d for d in yaml.safe_load_all(text) if d]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest) -> str:
    return str(request.param)
