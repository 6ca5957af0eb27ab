"""The submitter of a RayJob, built from the manifest exactly as KubeRay v1.7.0 builds it.

No Kubernetes API server or KubeRay operator can run here, so this module is KubeRay's own
code, transcribed line by line (tag v1.7.0):

* ``BuildJobSubmitCommand`` and ``getRuntimeEnvJson`` / ``getMetadataJSONForSubmitCommand``
  (``ray-operator/controllers/ray/common/job.go``): the wait loop on the dashboard's GCS health
  endpoint, ``if ! ray job status ... ; then ray job submit --no-wait ... -- <entrypoint> ; fi ;
  ray job logs --follow ...``, with Go's ``strconv.Quote`` around ``--runtime-env-json``,
  ``--metadata-json`` and ``--entrypoint-resources``, and ``%f`` for the entrypoint CPUs/GPUs;
* ``configureSubmitterContainer`` and ``GetSubmitterTemplate`` / ``GetDefaultSubmitterContainer``
  (``rayjob_controller.go``, ``common/job.go``): the words above joined by single spaces as the
  one argument of ``/bin/bash -ce --`` (``utils.GetContainerCommand([]string{"e"})``; ``-l`` too
  only when the operator runs with ``ENABLE_LOGIN_SHELL=true``), the container's own env and
  envFrom kept, then ``PYTHONUNBUFFERED=1``, ``RAY_DASHBOARD_ADDRESS`` and
  ``RAY_JOB_SUBMISSION_ID`` appended;
* ``initRayJobStatusIfNeed``: the submission id is ``spec.jobId`` or ``<name>-<5 random chars>``.

What is not KubeRay's: the image's own environment (``PATH`` to ``ray`` and ``python``, ``HOME``)
and Kubernetes' service-link variables, which a test passes in as ``image_env``.
"""

from __future__ import annotations

import json
import random
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

DASHBOARD_GCS_HEALTH_PATH = "api/gcs_healthz"  # utils.RayDashboardGCSHealthPath
GCS_HEALTH_TIMEOUT_S = 10  # utils.RayDashboardGCSHealthCheckTimeoutSeconds
# utils.BasePythonHealthCommand (args: url, timeout)
BASE_PYTHON_HEALTH_COMMAND = (
    "python -c \"import urllib.request; r=urllib.request.urlopen('%s', timeout=%d); "
    "exit(0 if b'success' in r.read() else 1)\""
)
SUBMITTER_CONTAINER_NAME = "ray-job-submitter"  # utils.SubmitterContainerName
# k8s.io/apimachinery rand.String's alphabet (no vowels, no 0/1/3 look-alikes).
_RAND_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def go_quote(s: str) -> str:
    """Go's ``strconv.Quote``: a double-quoted Go string literal (printable runes kept)."""
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch.isprintable():  # unicode.IsPrint: L, M, N, P, S and U+0020
            out.append(ch)
        elif ch in "\a\b\f\n\r\t\v":
            out.append(
                {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t"}.get(ch, r"\v")
            )
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _floats(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_floats(v) for v in value.values())
    if isinstance(value, list):
        return any(_floats(v) for v in value)
    return isinstance(value, float)


def go_json(value: Any) -> str:
    """Go's ``json.Marshal`` of a YAML-decoded value: sorted map keys, no spaces, HTML-safe.

    Go writes floats its own way (1e+06, no trailing .0): refused rather than guessed."""
    if _floats(value):
        raise ValueError("a float in the runtime env or metadata: Go's float formatting is not transcribed")
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for raw, esc in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, esc)
    return text


def runtime_env_json(rayjob: Mapping[str, Any]) -> str:
    """``getRuntimeEnvJson``: ``sigs.k8s.io/yaml.YAMLToJSON(spec.runtimeEnvYAML)``, or ``""``."""
    text = rayjob["spec"].get("runtimeEnvYAML") or ""
    if not text:
        return ""
    if any(unicodedata.category(c) == "Zs" and c != " " for c in text):
        raise ValueError("runtimeEnvYAML with non-ASCII spaces: YAMLToJSON's output is not transcribed")
    return go_json(yaml.safe_load(text))


def new_submission_id(rayjob: Mapping[str, Any], rng: random.Random | None = None) -> str:
    """``initRayJobStatusIfNeed``: ``spec.jobId``, else ``GenerateRayJobId(name)``."""
    if rayjob["spec"].get("jobId"):
        return str(rayjob["spec"]["jobId"])
    r = rng or random.Random()
    return f"{rayjob['metadata']['name']}-{''.join(r.choice(_RAND_ALPHABET) for _ in range(5))}"


def _go_float(x: float) -> str:
    return f"{x:f}"  # fmt.Sprintf("%f", ...): six decimals


def build_job_submit_command(rayjob: Mapping[str, Any], dashboard_url: str, job_id: str) -> list[str]:
    """``BuildJobSubmitCommand`` for ``K8sJobMode``: the words, before KubeRay joins them."""
    spec = rayjob["spec"]
    address = dashboard_url if dashboard_url.startswith("http://") else "http://" + dashboard_url
    metadata = spec.get("metadata") or {}
    entrypoint = str(spec.get("entrypoint", "")).strip()  # strings.TrimSpace
    job_status = ["ray", "job", "status", "--address", address, job_id, ">/dev/null", "2>&1"]
    job_submit = ["ray", "job", "submit", "--address", address]
    job_follow = ["ray", "job", "logs", "--address", address, "--follow", job_id]
    health_url = address + "/" + DASHBOARD_GCS_HEALTH_PATH
    health = BASE_PYTHON_HEALTH_COMMAND % (health_url, GCS_HEALTH_TIMEOUT_S)
    cmd = ["until", health, ">/dev/null", "2>&1", ";"]
    cmd += ["do", "echo", go_quote(f"Waiting for Ray Dashboard GCS to become healthy at {address} ..."), ";"]
    cmd += ["sleep", "2", ";", "done", ";"]
    cmd += ["if", "!", *job_status, ";", "then"]  # needsStatusCheck: always in K8sJobMode
    cmd += [*job_submit, "--no-wait"]
    env_json = runtime_env_json(rayjob)
    if env_json:
        cmd += ["--runtime-env-json", go_quote(env_json)]
    if metadata:
        version = (spec.get("rayClusterSpec") or {}).get("rayVersion", "")
        if version and tuple(int(p) for p in version.split(".")[:2]) < (2, 6):
            raise ValueError("the Ray version must be at least 2.6.0 to use the metadata field")
        cmd += ["--metadata-json", go_quote(go_json({str(k): str(v) for k, v in metadata.items()}))]
    if job_id:
        cmd += ["--submission-id", job_id]
    if float(spec.get("entrypointNumCpus") or 0) > 0:
        cmd += ["--entrypoint-num-cpus", _go_float(float(spec["entrypointNumCpus"]))]
    if float(spec.get("entrypointNumGpus") or 0) > 0:
        cmd += ["--entrypoint-num-gpus", _go_float(float(spec["entrypointNumGpus"]))]
    if spec.get("entrypointResources"):
        cmd += ["--entrypoint-resources", go_quote(str(spec["entrypointResources"]))]
    cmd += ["--", entrypoint, ";", "fi", ";", *job_follow]
    return cmd


@dataclass(frozen=True)
class Submitter:
    """The submitter container as KubeRay creates it: argv and the environment it declares."""

    argv: list[str]
    env: dict[str, str]
    container: dict[str, Any]


def submitter(
    rayjob: Mapping[str, Any],
    configmaps: Mapping[str, Mapping[str, str]],
    dashboard_url: str,
    job_id: str,
    login_shell: bool = False,
) -> Submitter:
    """``getSubmitterTemplate`` + ``configureSubmitterContainer`` (K8sJobMode).

    ``configmaps`` maps a ConfigMap's name to its data, to resolve ``envFrom`` as the kubelet
    does (later sources win, then ``env``; a missing ConfigMap is an error unless optional).
    """
    spec = rayjob["spec"]
    if spec.get("submissionMode", "K8sJobMode") != "K8sJobMode":
        raise ValueError(f"only K8sJobMode is transcribed, not {spec['submissionMode']}")
    template = spec.get("submitterPodTemplate")
    if template is not None:
        container = dict(template["spec"]["containers"][0])  # utils.RayContainerIndex
    else:  # GetDefaultSubmitterContainer
        head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        container = {
            "name": SUBMITTER_CONTAINER_NAME,
            "image": head["image"],
            "resources": {
                "limits": {"cpu": "1", "memory": "1Gi"},
                "requests": {"cpu": "500m", "memory": "200Mi"},
            },
        }
    words = build_job_submit_command(rayjob, dashboard_url, job_id)
    if container.get("command"):
        argv = [*container["command"], *container.get("args", [])]
    else:
        argv = ["/bin/bash", "-ce" + ("l" if login_shell else ""), "--", " ".join(words)]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref is None:
            raise ValueError(f"envFrom {source} is not transcribed (only configMapRef)")
        if ref["name"] not in configmaps:
            if ref.get("optional"):
                continue
            raise KeyError(
                f"the submitter's envFrom names ConfigMap {ref['name']!r}, which is not in the manifest"
            )
        prefix = source.get("prefix", "")
        env.update({prefix + k: str(v) for k, v in configmaps[ref["name"]].items()})
    for var in container.get("env", []):
        if "value" not in var:
            raise ValueError(f"env {var['name']} with valueFrom is not transcribed")
        env[var["name"]] = str(var["value"])
    env.update(PYTHONUNBUFFERED="1", RAY_DASHBOARD_ADDRESS=dashboard_url, RAY_JOB_SUBMISSION_ID=job_id)
    return Submitter(argv=argv, env=env, container=container)
