#!/usr/bin/env bash
# GPU checks of libple, for a machine with an NVIDIA GPU, its driver, a CUDA toolkit (cuda.h,
# libcuda) and CMake, but no Rust and no network.
#
#   ffi-tests/gpu/run.sh LIBPLE_SO OUTDIR
#
# Builds the C programs of this directory against include/ple.h and LIBPLE_SO, generates small
# packed tables (write_table() in common.h), runs the checks (gpu_test: correctness, wait modes,
# CUDA Graph, timeouts) and the benchmark (gpu_bench), and leaves in OUTDIR: gpu_test.json,
# gpu_bench.json, the logs and nvidia-smi's view. Exit status: 0 iff every check passed.
# Every program runs under a timeout, so a hang is reported as a failure, not waited for.
set -uo pipefail
if [[ $# -ne 2 ]]; then
    echo "usage: $0 LIBPLE_SO OUTDIR" >&2
    exit 2
fi
so=$(realpath "$1") || exit 2
mkdir -p "$2" && out=$(realpath "$2") || exit 2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build="$out/build"
mkdir -p "$build/include" "$build/lib"

cp "$root/include/ple.h" "$build/include/ple.h"

cp "$so" "$build/lib/libple.so"
soname=$( (readelf -d "$so" 2>/dev/null || objdump -p "$so" 2>/dev/null) |
    sed -n -e 's/.*Library soname: \[\(.*\)\].*/\1/p' -e 's/^ *SONAME *\(.*\)$/\1/p' | head -1)
if [[ -n "$soname" && "$soname" != libple.so ]]; then
    ln -sf libple.so "$build/lib/$soname"
fi
export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{ nvidia-smi || true; } >"$out/nvidia-smi.txt" 2>&1
echo "== building"
if ! cmake -S "$here" -B "$build/cmake" -DCMAKE_BUILD_TYPE=Release \
    -DPLE_INCLUDE_DIR="$build/include" -DPLE_LIB="$build/lib/libple.so" >"$out/build.log" 2>&1 ||
    ! cmake --build "$build/cmake" -j "$(nproc)" >>"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    echo "run.sh: build failed (see $out/build.log)"
    exit 1
fi

rc=0
echo "== reference self-test (write_table + reference dequant, CPU only)"
if ! timeout 120 "$build/cmake/gpu_selftest" "$out/tables-selftest" >"$out/reference-dump.txt" 2>"$out/selftest.log"; then
    cat "$out/selftest.log"
    echo "run.sh: selftest failed"
    rc=1
fi
rm -rf "$out/tables-selftest"

echo "== gpu_test"
timeout 900 "$build/cmake/gpu_test" "$out/tables-test" "$out" 2>&1 | tee "$out/gpu_test.log"
t=${PIPESTATUS[0]}
[[ $t -eq 124 ]] && echo "run.sh: gpu_test timed out (a hang)"
[[ $t -ne 0 ]] && rc=1

echo "== gpu_bench"
timeout 900 "$build/cmake/gpu_bench" "$out/tables-bench" "$out" 2>&1 | tee "$out/gpu_bench.log"
b=${PIPESTATUS[0]}
[[ $b -eq 124 ]] && echo "run.sh: gpu_bench timed out (a hang)"
[[ $b -ne 0 ]] && rc=1
rm -rf "$out/tables-test" "$out/tables-bench"

echo "run.sh: results in $out (gpu_test.json, gpu_bench.json); exit $rc"
exit $rc
