#!/usr/bin/env bash
# Put a prompts file (the list `verl-consistency run --capture prompts:FILE` dumps: index:N or
# uid:U per line, e.g. a report's capture-these.txt) on the dump volume at /dump/inputs/<name>,
# where the RayJob's head reads it: then set CAPTURE=prompts:/dump/inputs/<name> in the run
# ConfigMap. The run copies the file into its own folder when it starts, so replacing it later
# never changes a run that has begun.
# Usage: k8s/upload-prompts.sh FILE [NAME]   (make upload-prompts FILE=<file> [NAME=<name>])
# Env: KUBECTL (default kubectl), NAMESPACE (default: the current context's namespace),
#      IMAGE (the runs' image; `make upload-prompts` passes the one `make -s image-name` prints).
set -euo pipefail

usage="usage: $0 FILE [NAME]   (NAME: the file's name on the volume, default FILE's own)"
file="${1:?$usage}"
name="${2:-$(basename -- "$file")}"
image="${IMAGE:-}"
kubectl="${KUBECTL:-kubectl}"
here="$(cd "$(dirname "$0")" && pwd)"
fail() { echo "error: $*" >&2; exit 2; }

[ -f "$file" ] && [ -r "$file" ] || fail "$file: no such readable file"
[ -s "$file" ] || fail "$file is empty: a prompts file lists index:<N> or uid:<U>, one per line"
case "$file" in *:*) fail "$file: kubectl cp reads a ':' as <pod>:<path>; copy the file to a name without one";; esac
case "$name" in
  "" | .* | *[!A-Za-z0-9._-]*) fail "NAME '$name': letters, digits, '.', '_' and '-' only, not starting with '.'";;
esac
[ -n "$image" ] || fail "IMAGE is not set: the image your runs use (make upload-prompts sets it)"

ns_args=()
if [ -n "${NAMESPACE:-}" ]; then ns_args=(--namespace "$NAMESPACE"); fi
k() { "$kubectl" "${ns_args[@]}" "$@"; }
sha256() { if command -v sha256sum >/dev/null; then sha256sum; else shasum -a 256; fi; }

pod="verl-consistency-prompts-writer-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
dest="/dump/inputs/$name"
part="/dump/inputs/.$name.part"

cleanup() { k delete pod "$pod" --ignore-not-found --wait=false >/dev/null || true; }
trap cleanup EXIT

sed -e "s|@POD@|$pod|" -e "s|@IMAGE@|$image|" "$here/prompts-writer.yaml" | k apply -f - >/dev/null
k wait --for=condition=Ready "pod/$pod" --timeout=180s >/dev/null
k cp "$file" "$pod:$part" >/dev/null
# `kubectl cp` can fail without saying so (a full volume, an image without tar): compare bytes.
want="$(sha256 < "$file" | cut -d' ' -f1)"
got="$(k exec "$pod" -- sha256sum "$part" | cut -d' ' -f1)"
if [ "$want" != "$got" ]; then
  k exec "$pod" -- rm -f "$part" || true
  echo "error: the copy on the volume differs from $file (sha256 $got, not $want); try again" >&2
  exit 1
fi
# The same reader as `run` (patches/contracts/capture.py), so a bad line is named now, not at submission.
check='import sys
from verl_consistency.contracts.capture import read_prompts
try:
    print(len(read_prompts(sys.argv[1])))
except ValueError as exc:
    sys.exit(str(exc))'
if ! count="$(k exec "$pod" -- python3 -c "$check" "$part" 2>&1)"; then
  k exec "$pod" -- rm -f "$part" || true
  echo "error: ${count//$part/$file}" >&2
  exit 2
fi
k exec "$pod" -- mv -f "$part" "$dest"
echo "uploaded $file to $dest ($count prompts). In the run ConfigMap set: CAPTURE: prompts:$dest"
