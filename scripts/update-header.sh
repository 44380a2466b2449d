#!/usr/bin/env bash
# Regenerates include/ple.h from crates/ple-capi/src (cbindgen runs in its build.rs) and copies it into place.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(cargo build --release -p ple-capi --lib --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and "/crates/ple-capi#" in m["package_id"]:
        print(m["out_dir"])' | tail -1)
[ -n "$out" ] || { echo "update-header: no build-script output for ple-capi" >&2; exit 1; }
cp "$out/ple.h" include/ple.h
echo "include/ple.h updated from $out/ple.h"
