"""kuberay_submit.py against what KubeRay v1.7.0's Go code produces (fast; no Ray).

The expected strings are what Go gives for these inputs: ``strconv.Quote``, ``json.Marshal``
(sorted keys, HTML-safe escapes), ``fmt.Sprintf("%f")``, and BuildJobSubmitCommand's word order.
test_submission.py runs the real command against a real Ray head.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
import yaml

from tests.k8s import kuberay_submit as ks
from tests.k8s.conftest import FILES, of_kind


def job_and_settings() -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    docs = [d for d in yaml.safe_load_all(FILES["file:fully-async"].read_text()) if d]
    (job,) = of_kind(docs, "RayJob")
    return job, {c["metadata"]["name"]: c["data"] for c in of_kind(docs, "ConfigMap")}


def test_go_quote_and_json_match_go() -> None:
    assert ks.go_quote('a"b\\c\n\té\u2028\x01') == '"a\\"b\\\\c\\n\\té\\u2028\\x01"'
    assert ks.go_json({"b": 1, "a": "<&>"}) == '{"a":"\\u003c\\u0026\\u003e","b":1}'
    with pytest.raises(ValueError, match="float"):
        ks.go_json({"a": [1.5]})


def test_the_command_is_kuberays() -> None:
    job, cms = job_and_settings()
    job = copy.deepcopy(job)
    job["spec"].update(metadata={"team": "x"}, entrypointNumCpus=1, entrypointResources='{"a": 1}')
    sub = ks.submitter(job, cms, "head-svc.ns.svc.cluster.local:8265", "vc-abcde")
    addr = "http://head-svc.ns.svc.cluster.local:8265"
    assert sub.argv[:3] == ["/bin/bash", "-ce", "--"]
    assert sub.argv[3] == (
        'until python -c "import urllib.request; r=urllib.request.urlopen('
        f"'{addr}/api/gcs_healthz', timeout=10); "
        "exit(0 if b'success' in r.read() else 1)\" >/dev/null 2>&1 ; "
        f'do echo "Waiting for Ray Dashboard GCS to become healthy at {addr} ..." ; sleep 2 ; done ; '
        f"if ! ray job status --address {addr} vc-abcde >/dev/null 2>&1 ; then "
        f"ray job submit --address {addr} --no-wait "
        '--runtime-env-json "{\\"worker_process_setup_hook\\":'
        '\\"verl_consistency.patches.hooks.ray_setup.placement.install\\"}" '
        '--metadata-json "{\\"team\\":\\"x\\"}" --submission-id vc-abcde --entrypoint-num-cpus 1.000000 '
        '--entrypoint-resources "{\\"a\\": 1}" '
        f"-- {job['spec']['entrypoint']} ; fi ; ray job logs --address {addr} --follow vc-abcde"
    )
    (settings,) = cms.values()
    assert sub.env == {
        **settings,
        "PYTHONUNBUFFERED": "1",
        "RAY_DASHBOARD_ADDRESS": "head-svc.ns.svc.cluster.local:8265",
        "RAY_JOB_SUBMISSION_ID": "vc-abcde",
    }


def test_default_submitter_has_no_settings() -> None:
    job, cms = job_and_settings()
    job = copy.deepcopy(job)
    del job["spec"]["submitterPodTemplate"]
    sub = ks.submitter(job, cms, "h:8265", "id", login_shell=True)
    assert sub.argv[1] == "-cel"
    assert sorted(sub.env) == ["PYTHONUNBUFFERED", "RAY_DASHBOARD_ADDRESS", "RAY_JOB_SUBMISSION_ID"]
    assert (
        sub.container["image"]
        == job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    )


def test_submission_id_and_refusals() -> None:
    job, cms = job_and_settings()
    job_id = ks.new_submission_id(job, random.Random(0))
    assert job_id.startswith("verl-consistency-fully-async-")
    assert len(job_id.rsplit("-", 1)[1]) == 5
    job = copy.deepcopy(job)
    job["spec"]["submissionMode"] = "HTTPMode"
    with pytest.raises(ValueError, match="only K8sJobMode"):
        ks.submitter(job, cms, "h:8265", "id")
