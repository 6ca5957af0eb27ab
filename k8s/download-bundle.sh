#!/usr/bin/env bash
# Copy /dump/bundles/bundle-<run id>.tar.zst from the dump volume to this machine: the bundle of a
# collection run (RayJob + postprocess Job) or of a consistency check (k8s/check-job.yaml), which
# write to the same place; a RayJob's final status (rayjob-<run id>.json) comes along when present.
# Usage: k8s/download-bundle.sh RUN_ID [DEST_DIR]   (make download-bundle RUN=<run id>)
# Env: KUBECTL (default kubectl), NAMESPACE (default: the current context's namespace),
# READER_IMAGE (default: the image k8s/bundle-reader.yaml names, which `make manifests` sets to
# the RayJobs' image; `make download-bundle IMAGE=...` passes it). The reader pod runs the
# bundle's own image, so an air-gapped cluster needs nothing else, and waits up to
# READY_TIMEOUT (default 600s) for it: a node that never ran the image pulls it first.
set -euo pipefail

run="${1:?usage: $0 RUN_ID [DEST_DIR]}"
dest="${2:-out/bundles}"
kubectl="${KUBECTL:-kubectl}"
here="$(cd "$(dirname "$0")" && pwd)"
ns_args=()
if [ -n "${NAMESPACE:-}" ]; then ns_args=(--namespace "$NAMESPACE"); fi
k() { "$kubectl" "${ns_args[@]}" "$@"; }

# Pod names allow lower-case letters, digits and '-', run ids also '.' and '_'.
pod="verl-consistency-reader-$(printf '%s' "$run" | tr '._' '--' | cut -c1-40)"
bundle="/dump/bundles/bundle-$run.tar.zst"

cleanup() { k delete pod "$pod" --ignore-not-found --wait=false >/dev/null || true; }
trap cleanup EXIT

edits=(-e "s/@POD@/$pod/")
# The reader container's one `image:` line, replaced when READER_IMAGE names another image.
if [ -n "${READER_IMAGE:-}" ]; then edits+=(-e "s|^\( *\)image: .*|\1image: $READER_IMAGE|"); fi
sed "${edits[@]}" "$here/bundle-reader.yaml" | k apply -f - >/dev/null
if ! k wait --for=condition=Ready "pod/$pod" --timeout="${READY_TIMEOUT:-600s}" >/dev/null; then
  echo "error: the reader pod $pod did not become ready. Its image and events:" >&2
  k get pod "$pod" -o jsonpath='{.spec.containers[0].image}{"\n"}' >&2 || true
  k describe pod "$pod" 2>/dev/null | tail -n 15 >&2 || true
  echo "An image the nodes cannot pull? Render the files with yours (make manifests IMAGE=...)" \
    "or pass it here: make download-bundle RUN=$run IMAGE=<registry/name:tag>." >&2
  exit 1
fi
if ! k exec "$pod" -- test -f "$bundle"; then
  echo "error: $bundle is not on the dump volume. Bundles there:" >&2
  k exec "$pod" -- ls -l /dump/bundles >&2 || true
  echo "Has the run finished? A collection run's bundle is written by its postprocess Job" \
    "(kubectl logs job/verl-consistency-fully-async-postprocess, or -hybrid-), a check's by the" \
    "check Job itself (kubectl logs job/verl-consistency-check)." >&2
  exit 1
fi
mkdir -p "$dest"
tmp="$dest/.bundle-$run.tar.zst.part"
k cp "$pod:$bundle" "$tmp" >/dev/null
mv -f "$tmp" "$dest/bundle-$run.tar.zst"
# How the RayJob ended (written by `verl-consistency wait-rayjob`): collection runs only.
if k exec "$pod" -- test -f "/dump/bundles/rayjob-$run.json"; then
  k cp "$pod:/dump/bundles/rayjob-$run.json" "$dest/rayjob-$run.json" >/dev/null
fi
echo "bundle: $(cd "$dest" && pwd)/bundle-$run.tar.zst"
