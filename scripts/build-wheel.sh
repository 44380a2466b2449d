#!/usr/bin/env bash
# Builds the Python wheel of python/ (package `ple`, ctypes bindings) carrying a prebuilt libple.so:
#   scripts/build-wheel.sh [OUT_DIR]        (default target/wheels)
# Set PLE_NO_BUILD=1 to use the libple.so that target/release already holds. The wheel needs no
# Rust toolchain where it is installed: `pip install OUT_DIR/ple-*.whl`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$(mkdir -p "${1:-target/wheels}" && cd "${1:-target/wheels}" && pwd)
if [ "${PLE_NO_BUILD:-0}" != 1 ]; then
  cargo build --release -p ple-capi --lib
fi
install -m 0755 target/release/libple.so python/src/ple/libple.so
rm -f "$out"/ple-*.whl
python3 -m pip wheel -q --disable-pip-version-check --no-deps -w "$out" python/
rm -rf python/build python/src/ple.egg-info
ls "$out"/ple-*.whl
