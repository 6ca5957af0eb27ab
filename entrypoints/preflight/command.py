"""``verl-consistency preflight``: what will fail on this cluster, before anything is submitted.

Why: a RayJob that cannot be scheduled, or that an older KubeRay prunes, fails late and quietly
(pods Pending for hours, or pools that silently stop being split). The preflight reads the
cluster (GET only: it creates, changes and deletes nothing) and the manifest as it will be
applied, and answers with one row per check.

Exit codes: 0 nothing will fail (warnings allowed); 1 something will fail; 2 the cluster could
not be reached or read, or a usage error (an unreadable manifest, an unknown overlay).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from verl_consistency.entrypoints.options import options_from
from verl_consistency.entrypoints.preflight import cluster
from verl_consistency.entrypoints.preflight import manifest as mf
from verl_consistency.entrypoints.preflight.checks import run_all
from verl_consistency.entrypoints.preflight.report import EXIT_UNREACHABLE, Report


@dataclass(frozen=True)
class PreflightOptions:
    manifest: Path | None = None
    overlay: str | None = None
    mode: mf.Mode | None = None
    namespace: str | None = None
    context: str | None = None
    kubeconfig: Path | None = None
    image: str | None = None


def load_manifest(opts: PreflightOptions) -> mf.Manifest:
    """The rendered manifest the options name; the flat file of ``--mode`` (fully-async) by default."""
    if opts.manifest is not None and opts.overlay is not None:
        raise mf.ManifestError("give --manifest or --overlay, not both")
    if opts.overlay is not None:
        m = mf.render_overlay(opts.overlay, os.environ.get("KUBECTL", "kubectl"))
    elif opts.manifest is not None:
        m = mf.read_file(opts.manifest)
    else:
        m = mf.read_file(mf.flat_file(opts.mode or mf.Mode.fully_async))
    has = m.label(mf.LABEL_MODE)
    if opts.mode is not None and has is not None and has != opts.mode.value:
        raise mf.ManifestError(
            f"{m.source} is a {has} run, not {opts.mode.value}: drop --mode or pick another source"
        )
    return m


def preflight(opts: PreflightOptions) -> Report:
    """Read the manifest and the cluster, run every check (raises ManifestError, Unreachable)."""
    m = load_manifest(opts)
    api, target = cluster.connect(opts.context, opts.kubeconfig, opts.namespace)
    with api:
        pull = sorted({p for g in m.pod_groups() for p in g.pull_secrets()})
        snap = cluster.read(api, target, pull)
    return Report(
        context=target.context,
        server=target.server,
        server_version=snap.server_version,
        namespace=target.namespace,
        manifest=m.source,
        checks=run_all(m, snap, opts.image),
    )


def preflight_cmd(
    manifest_file: Annotated[
        Path | None,
        typer.Option("--manifest", help="a rendered manifest file (default: k8s/<mode>-rayjob.yaml)"),
    ] = None,
    overlay: Annotated[
        str | None, typer.Option(help="render k8s/overlays/NAME with `kubectl kustomize` and check that")
    ] = None,
    mode: Annotated[
        mf.Mode | None,
        typer.Option(help="picks the flat file k8s/<mode>-rayjob.yaml (default fully-async)"),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="default: the context's, else `default`")
    ] = None,
    context: Annotated[str | None, typer.Option(help="kubeconfig context (default: the current one)")] = None,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="default: $KUBECONFIG, else ~/.kube/config, else in-cluster")
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(help="the image you built and pushed (default: what `make -s image-name` prints)"),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="print the report as JSON instead of a table")
    ] = False,
) -> None:
    """Say what will fail on this cluster before anything is submitted. It only reads (GET).

    Checks: kuberay (the RayJob CRD, and the KubeRay release it implies);
    rayjob-fields (fields that release would silently drop);
    accelerators (Ready nodes with the device name and count the pods ask for, else the overlay that fits);
    node-label (the nodeSelector label and taints); storage (a class, ReadWriteMany);
    quota (the namespace's ResourceQuota); image (the image, its registry and pull secrets).

    Exit 0: nothing will fail (warnings allowed); 1: something will fail; 2: the cluster could
    not be reached or read, or a usage error.
    """
    opts = options_from(PreflightOptions, locals(), manifest=manifest_file)
    try:
        report = preflight(opts)
    except mf.ManifestError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_UNREACHABLE) from None
    except cluster.Unreachable as exc:
        typer.echo(f"error: cannot read the cluster: {exc}", err=True)
        raise typer.Exit(EXIT_UNREACHABLE) from None
    if json_out:
        typer.echo(report.to_json().decode())
    else:
        # A terminal's (or $COLUMNS') width; piped or captured, wide enough for a row to read as one.
        wide = sys.stdout.isatty() or "COLUMNS" in os.environ
        report.print_table(Console(width=None if wide else 200))
    raise typer.Exit(report.exit_code)
