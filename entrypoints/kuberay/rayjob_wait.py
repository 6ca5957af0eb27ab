"""``verl-consistency wait-rayjob NAME``: block until a KubeRay RayJob has finished.

Why: the postprocess Job is applied together with the RayJob (one ``kubectl apply`` starts a
whole run), so it must first wait for the collection to end. The image has no kubectl, so
this uses the kubernetes Python client, reading only the RayJob's status (the Job's
ServiceAccount may only get/list/watch rayjobs). Polling, not a watch: a run lasts hours and
a poll survives API-server restarts and watch expiries without bookkeeping.

Exit codes: 0 the job succeeded; 3 it failed or was stopped (the postprocess still archives
what exists); 4 the RayJob could not be read (absent, or no permission); 5 timed out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from verl_consistency.contracts.atomic import write_bytes_atomic

EXIT_SUCCEEDED = 0
EXIT_FAILED = 3
EXIT_UNREADABLE = 4
EXIT_TIMEOUT = 5

# KubeRay v1 RayJob status: jobStatus is Ray's job state; jobDeploymentStatus is KubeRay's.
TERMINAL_JOB_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
TERMINAL_DEPLOYMENT_STATUSES = frozenset({"Complete", "Failed", "ValidationFailed"})

GetRayJob = Callable[[], dict[str, Any] | None]
"""Returns the RayJob object (as the API returns it), or None while it does not exist."""


class RayJobUnreadable(RuntimeError):
    """The API refused to give the RayJob (other than 'not found')."""


@dataclass(frozen=True)
class RayJobOutcome:
    name: str
    namespace: str
    job_status: str
    deployment_status: str
    reason: str
    message: str
    succeeded: bool
    exit_code: int


def is_finished(status: dict[str, Any]) -> bool:
    """Finished when KubeRay says the deployment is over, or Ray says the job is over.

    ``jobStatus`` alone is not enough while KubeRay is still tearing down or retrying, and
    ``jobDeploymentStatus`` alone misses submitter failures that end as ``Failed`` without a
    Ray job status; either terminal state means nothing more will be written to the volume.
    """
    deployment = status.get("jobDeploymentStatus", "")
    job = status.get("jobStatus", "")
    return deployment in TERMINAL_DEPLOYMENT_STATUSES or (
        job in TERMINAL_JOB_STATUSES and deployment not in {"Running", "Retrying"}
    )


def outcome_of(name: str, namespace: str, status: dict[str, Any]) -> RayJobOutcome:
    succeeded = status.get("jobStatus") == "SUCCEEDED" and status.get("jobDeploymentStatus") != "Failed"
    return RayJobOutcome(
        name=name,
        namespace=namespace,
        job_status=str(status.get("jobStatus", "")),
        deployment_status=str(status.get("jobDeploymentStatus", "")),
        reason=str(status.get("reason", "")),
        message=str(status.get("message", "")),
        succeeded=succeeded,
        exit_code=EXIT_SUCCEEDED if succeeded else EXIT_FAILED,
    )


@dataclass(frozen=True)
class Patience:
    """How long :func:`wait_for_rayjob` waits: in all, between two reads, and for a RayJob that
    does not exist yet (the Job may start before the API server has stored the RayJob of the same
    ``kubectl apply``). One value, because the three are chosen together (the CLI's ``--timeout``
    and ``--poll``)."""

    timeout_s: float
    poll_s: float = 30.0
    absent_grace_s: float = 300.0


def wait_for_rayjob(
    get: GetRayJob,
    name: str,
    namespace: str,
    patience: Patience,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    log: Callable[[str], None] = print,
) -> RayJobOutcome:
    """Poll ``get`` until the RayJob has finished (``sleep``, ``clock`` and ``log`` are the seams a
    test replaces).

    Raises :class:`TimeoutError` after ``patience.timeout_s`` and :class:`RayJobUnreadable` if the
    RayJob has not appeared after ``patience.absent_grace_s``.
    """
    timeout_s, absent_grace_s = patience.timeout_s, patience.absent_grace_s
    start = clock()
    last_seen = ""
    while True:
        obj = get()
        now = clock() - start
        if obj is None:
            if now >= absent_grace_s:
                raise RayJobUnreadable(
                    f"RayJob {namespace}/{name} not found after {absent_grace_s:.0f}s: was it applied "
                    "in this namespace, and is RAYJOB_NAME in the run ConfigMap its metadata.name?"
                )
        else:
            status = obj.get("status") or {}
            deployment, job = status.get("jobDeploymentStatus") or "-", status.get("jobStatus") or "-"
            seen = f"deployment={deployment} job={job}"
            if seen != last_seen:
                log(f"RayJob {namespace}/{name}: {seen}")
                last_seen = seen
            if is_finished(status):
                return outcome_of(name, namespace, status)
        if now >= timeout_s:
            raise TimeoutError(f"RayJob {namespace}/{name} still not finished after {timeout_s:.0f}s")
        sleep(patience.poll_s)


def kubernetes_getter(name: str, namespace: str, api: Any | None = None) -> GetRayJob:
    """A :data:`GetRayJob` over the kubernetes client (in-cluster config, else kubeconfig)."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    custom: Any = api
    if custom is None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        custom = client.CustomObjectsApi()

    def get() -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = custom.get_namespaced_custom_object(
                group="ray.io", version="v1", namespace=namespace, plural="rayjobs", name=name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise RayJobUnreadable(
                f"reading RayJob {namespace}/{name} failed: HTTP {exc.status} {exc.reason}. The "
                "ServiceAccount needs get on rayjobs.ray.io (k8s/fully-async-rayjob.yaml, "
                "Role verl-consistency-rayjob-reader)."
            ) from exc
        return obj

    return get


def write_status_file(path: Path, outcome: RayJobOutcome) -> None:
    """Atomically (temp + rename) record how the RayJob ended, next to the bundle."""
    write_bytes_atomic(path, orjson.dumps(asdict(outcome), option=orjson.OPT_INDENT_2), mode=None)


def current_namespace() -> str:
    """The pod's namespace (downward API env or the mounted service-account file), else ``default``."""
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    sa = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    return sa.read_text().strip() if sa.is_file() else "default"


def wait_rayjob_cmd(
    name: Annotated[str, typer.Argument(help="metadata.name of the RayJob.")],
    namespace: Annotated[str | None, typer.Option(help="Default: the pod's own namespace.")] = None,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 172800.0,
    poll: Annotated[float, typer.Option(help="Seconds between two reads of the status.")] = 30.0,
    status_file: Annotated[
        Path | None, typer.Option(help="Write the final status here as JSON (atomically).")
    ] = None,
) -> None:
    """Wait until a RayJob has finished. Exit 0 succeeded, 3 failed/stopped, 4 unreadable, 5 timeout."""
    ns = namespace or current_namespace()
    try:
        outcome = wait_for_rayjob(kubernetes_getter(name, ns), name, ns, Patience(timeout, poll))
    except RayJobUnreadable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_UNREADABLE) from None
    except TimeoutError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_TIMEOUT) from None
    if status_file is not None:
        write_status_file(status_file, outcome)
    verdict = "succeeded" if outcome.succeeded else "did NOT succeed"
    detail = f" ({outcome.reason}: {outcome.message})" if outcome.reason or outcome.message else ""
    typer.echo(
        f"RayJob {ns}/{name} {verdict}: job={outcome.job_status or '-'} "
        f"deployment={outcome.deployment_status or '-'}{detail}"
    )
    raise typer.Exit(outcome.exit_code)
