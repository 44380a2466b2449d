#!/usr/bin/env bash
# Older entry point of the GPU checks: `run.sh LIBPLE_SO OUTDIR` runs device-check.sh (no CMake).
set -uo pipefail
if [[ $# -ne 2 ]]; then
    echo "usage: $0 LIBPLE_SO OUTDIR (see device-check.sh)" >&2
    exit 2
fi
OUT="$2" exec bash "$(dirname "$0")/device-check.sh" "$1"
