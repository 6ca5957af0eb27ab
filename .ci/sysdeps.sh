#!/usr/bin/env bash
# Make sure the Debian packages listed in the given .ci/apt/*.txt files are installed.
# Shared by `make test`, `make demo` and .ci/run, so each does its own set-up on a fresh
# Debian/Ubuntu machine. As root with apt-get it installs what is missing; otherwise it stops
# and prints the exact command to run (non-Debian: the package names, to map by hand).
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: $0 .ci/apt/LIST.txt..." >&2; exit 2; }
# shellcheck disable=SC2046
wanted=$(cat "$@" | sed 's/#.*//' | xargs -n1 | sort -u | xargs)
missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for p in $wanted; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
else
    echo "sysdeps: no dpkg here (not Debian/Ubuntu). Install the equivalents of: $wanted" >&2
    exit 1
fi
[ "${#missing[@]}" -eq 0 ] && exit 0
cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "sysdeps: missing Debian packages: ${missing[*]}" >&2
    echo "run as root:  $cmd" >&2
    exit 1
fi
echo "sysdeps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
