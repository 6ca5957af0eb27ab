"""`verl-consistency wait-rayjob`: waits by status, reports failure, never hangs silently.

No API server runs here, so the RayJob API is a stand-in: ``StandInCustomObjectsApi`` replays
a sequence of RayJob objects (shaped as KubeRay v1.7.0 writes them) through the real
kubernetes client's exception type. Everything above it is the real code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from typer.testing import CliRunner

from verl_consistency.entrypoints.cli import app
from verl_consistency.entrypoints.kuberay import rayjob_wait as rw


def rayjob(deployment: str, job: str = "", reason: str = "", message: str = "") -> dict[str, Any]:
    status = {"jobDeploymentStatus": deployment, "jobStatus": job, "reason": reason, "message": message}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj"}, "status": status}


class StandInCustomObjectsApi:
    """Stand-in for kubernetes.client.CustomObjectsApi: replays RayJob reads in order."""

    def __init__(self, sequence: list[dict[str, Any] | int]) -> None:
        self.sequence = list(sequence)
        self.calls: list[dict[str, str]] = []

    def get_namespaced_custom_object(self, **kwargs: str) -> dict[str, Any]:
        self.calls.append(kwargs)
        item = self.sequence.pop(0) if len(self.sequence) > 1 else self.sequence[0]
        if isinstance(item, int):
            raise ApiException(status=item, reason={404: "Not Found", 403: "Forbidden"}[item])
        return item


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def wait(sequence: list[dict[str, Any] | int], **kw: Any) -> tuple[rw.RayJobOutcome, StandInCustomObjectsApi]:
    api = StandInCustomObjectsApi(sequence)
    clock = FakeClock()
    out = rw.wait_for_rayjob(
        rw.kubernetes_getter("rj", "ns", api=api),
        "rj",
        "ns",
        rw.Patience(timeout_s=kw.pop("timeout_s", 3600), poll_s=10, **kw),
        sleep=clock.sleep,
        clock=clock,
        log=lambda _: None,
    )
    return out, api


def test_waits_through_startup_until_success() -> None:
    out, api = wait(
        [
            404,
            rayjob(""),
            rayjob("Initializing"),
            rayjob("Running", "PENDING"),
            rayjob("Running", "RUNNING"),
            rayjob("Complete", "SUCCEEDED"),
        ]
    )
    assert out.succeeded
    assert out.exit_code == rw.EXIT_SUCCEEDED
    assert out.job_status == "SUCCEEDED"
    assert len(api.calls) == 6
    assert api.calls[0] == {
        "group": "ray.io",
        "version": "v1",
        "namespace": "ns",
        "plural": "rayjobs",
        "name": "rj",
    }


@pytest.mark.parametrize(
    "final",
    [
        rayjob("Complete", "FAILED", "AppFailed", "exit 1"),
        rayjob("Complete", "STOPPED"),
        rayjob("Failed", "", "DeadlineExceeded", "activeDeadlineSeconds"),
        rayjob("Failed", "SUCCEEDED", "SubmissionFailed"),
        rayjob("ValidationFailed", "", "ValidationFailed", "bad spec"),
    ],
)
def test_failures_are_terminal_and_reported(final: dict[str, Any]) -> None:
    out, _ = wait([rayjob("Running", "RUNNING"), final])
    assert not out.succeeded
    assert out.exit_code == rw.EXIT_FAILED
    assert out.reason == final["status"]["reason"]


def test_job_status_alone_is_not_the_end_while_kuberay_retries() -> None:
    out, api = wait(
        [rayjob("Retrying", "FAILED"), rayjob("Running", "RUNNING"), rayjob("Complete", "SUCCEEDED")]
    )
    assert out.succeeded
    assert len(api.calls) == 3


def test_absent_rayjob_and_forbidden_reads_are_clear_errors() -> None:
    with pytest.raises(rw.RayJobUnreadable, match="not found after 300s"):
        wait([404])
    with pytest.raises(rw.RayJobUnreadable, match=r"HTTP 403.*rayjob-reader"):
        wait([403])


def test_timeout() -> None:
    with pytest.raises(TimeoutError, match="not finished after 100s"):
        wait([rayjob("Running", "RUNNING")], timeout_s=100)


def test_cli_exit_codes_and_status_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = StandInCustomObjectsApi([rayjob("Complete", "FAILED", "AppFailed", "boom")])
    real_getter = rw.kubernetes_getter
    monkeypatch.setattr(rw, "kubernetes_getter", lambda name, ns: real_getter(name, ns, api=api))
    status = tmp_path / "bundles" / "rayjob-run1.json"
    res = CliRunner().invoke(
        app, ["wait-rayjob", "rj", "--namespace", "ns", "--poll", "0", "--status-file", str(status)]
    )
    assert res.exit_code == rw.EXIT_FAILED, res.output
    assert "did NOT succeed" in res.output
    assert "AppFailed: boom" in res.output
    recorded = json.loads(status.read_text())
    assert recorded["succeeded"] is False
    assert recorded["job_status"] == "FAILED"
    assert [p.name for p in status.parent.iterdir()] == ["rayjob-run1.json"]  # no temp file left

    api.sequence = [403]
    res = CliRunner().invoke(app, ["wait-rayjob", "rj", "--namespace", "ns", "--poll", "0"])
    assert res.exit_code == rw.EXIT_UNREADABLE
