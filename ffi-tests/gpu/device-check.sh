#!/usr/bin/env bash
# The GPU checks of libple in one run, for a machine with an NVIDIA GPU and its driver but no
# Rust, no CMake and no network:
#
#   OUT=<dir> bash ffi-tests/gpu/device-check.sh [LIBPLE_SO]     (default target/release/libple.so)
#
# Builds the C programs of this directory with gcc against include/ple.h, the driver's cuda.h
# (the first found of: $PLE_CUDA_INCLUDE, $CUDA_HOME/include, /usr/local/cuda*/include,
# /usr/include, target/gpu-headers (staged by check-local.sh from PyPI's
# nvidia-cuda-runtime-cu12), a Python nvidia-cuda-runtime package) and the driver's libcuda.so.1
# by path ($PLE_LIBCUDA overrides the search; a driver the loader's cache does not list has its
# folder put first on LD_LIBRARY_PATH, so the programs and libple load that very driver); runs
# every GPU test and benchmark under `timeout` (limits below: at most 3 minutes 35 s in all),
# then, where `target/release/ple` ($PLE_BIN overrides) is there, the read-ahead p99 check of `ple bench --engine` and
# the all-cached step of `ple bench steady` on the host (at most 100 s more; carry the GPU run
# without `ple` for a rerun of the GPU checks alone). Writes at most 8 files to $OUT (default
# target/gpu-out; the device tool brings back 8): env.txt (the machine, the build's output, the
# probe), gpu_test / gpu_robust / gpu_bench .log and .json, host_bench.log. Exit status 0 iff
# every check passed; without a GPU (no libcuda.so.1, or the probe's own "no device" exit code)
# it says so and exits 0 having run nothing; a probe that cannot run (its loader failing, a
# crash) is a failure, never "no device".
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
so=$(realpath "${1:-$root/target/release/libple.so}" 2>/dev/null) || so=""
out=${OUT:-$root/target/gpu-out}
mkdir -p "$out" && out=$(realpath "$out") || exit 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { echo "device-check: $*"; }

find_libcuda() {
    local p
    if [[ -n "${PLE_LIBCUDA:-}" ]]; then echo "$PLE_LIBCUDA"; return; fi
    p=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
    if [[ -n "$p" && -e "$p" ]]; then echo "$p"; return; fi
    for d in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib \
        /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/wsl/lib; do
        if [[ -e "$d/libcuda.so.1" ]]; then echo "$d/libcuda.so.1"; return; fi
    done
}

find_cuda_h() {
    local c
    for c in "${PLE_CUDA_INCLUDE:-}" "${CUDA_HOME:+$CUDA_HOME/include}" /usr/local/cuda/include \
        /usr/local/cuda-*/include /usr/include "$root/target/gpu-headers"; do
        if [[ -n "$c" && -f "$c/cuda.h" ]]; then echo "$c"; return; fi
    done
    for py in python3 "$root"/target/kernel-tools/bin/python; do
        c=$("$py" -c 'import nvidia.cuda_runtime as m, os; print(os.path.join(list(m.__path__)[0], "include"))' 2>/dev/null) || continue
        if [[ -f "$c/cuda.h" ]]; then echo "$c"; return; fi
    done
}

libcuda=$(find_libcuda)
# The programs link the driver by path but load it by its SONAME: where the loader's cache does
# not list this file (found by scanning a folder, or given in PLE_LIBCUDA), its folder goes first
# on LD_LIBRARY_PATH, else the probe would fail to load (exit 127) on a machine that has a GPU.
if [[ -n "$libcuda" ]] && ! ldconfig -p 2>/dev/null | awk '{print $NF}' | grep -qxF "$libcuda"; then
    export LD_LIBRARY_PATH="$(dirname "$libcuda")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -a)"
    echo "libple: ${so:-missing}"
    echo "libcuda.so.1: ${libcuda:-none}"
    echo "gcc: $(gcc --version 2>/dev/null | head -1)"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1
    env | grep -E '^(CUDA_|NVIDIA_|LD_LIBRARY_PATH)' | sort
} >"$out/env.txt" 2>&1
if [[ -z "$libcuda" ]]; then
    say "no CUDA driver (libcuda.so.1) on this machine: no GPU check can run; nothing done" | tee -a "$out/env.txt"
    exit 0
fi
if [[ -z "$so" || ! -f "$so" ]]; then
    say "no libple.so at ${1:-target/release/libple.so}: build it first (cargo build --release)" | tee -a "$out/env.txt"
    exit 2
fi
cuda_inc=$(find_cuda_h)
if [[ -z "$cuda_inc" ]]; then
    say "no cuda.h found (set PLE_CUDA_INCLUDE, or carry target/gpu-headers)" | tee -a "$out/env.txt"
    exit 2
fi
echo "cuda.h: $cuda_inc/cuda.h" >>"$out/env.txt"

# libple under its SONAME, next to the programs
mkdir -p "$work/lib" "$work/bin"
cp "$so" "$work/lib/libple.so"
soname=$(objdump -p "$so" 2>/dev/null | awk '/SONAME/{print $2}')
[[ -n "$soname" && "$soname" != libple.so ]] && ln -sf libple.so "$work/lib/$soname"
export LD_LIBRARY_PATH="$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

cc=${CC:-}
for c in gcc cc clang; do [[ -z "$cc" ]] && command -v "$c" >/dev/null && cc=$c; done
if [[ -z "$cc" ]]; then
    say "no C compiler (gcc, cc, clang) on this machine" | tee -a "$out/env.txt"
    exit 2
fi
echo "compiler: $cc" >>"$out/env.txt"
flags=(-O2 -std=gnu11 -Wall -Wextra -Wno-format-truncation -ffp-contract=off -fno-fast-math
    -I "$root/include" -I "$cuda_inc")
build_ok=1
{
    echo "== probe"
    cat >"$work/probe.c" <<'C'
#include <cuda.h>
#include <stdio.h>
/* exit 0: a device; 3 (and only 3): the driver answers and reports no device */
int main(void) {
    int n = 0, drv = 0;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS) r = cuDeviceGetCount(&n);
    cuDriverGetVersion(&drv);
    printf("cuInit/cuDeviceGetCount: %d, devices %d, driver API %d\n", (int)r, n, drv);
    return r == CUDA_SUCCESS && n > 0 ? 0 : 3;
}
C
    "$cc" "${flags[@]}" "$work/probe.c" -o "$work/bin/probe" "$libcuda" || build_ok=0
    for p in gpu_test gpu_robust gpu_bench; do
        echo "== $p"
        "$cc" "${flags[@]}" "$here/$p.c" -o "$work/bin/$p" "$work/lib/libple.so" "$libcuda" -lpthread -lm ||
            build_ok=0
    done
    echo "== selftest (CPU-only reference)"
    "$cc" "${flags[@]}" "$here/selftest.c" -o "$work/bin/selftest" -lm || build_ok=0
} >>"$out/env.txt" 2>&1
if [[ $build_ok -ne 1 ]]; then
    tail -30 "$out/env.txt"
    say "build failed (see $out/env.txt)"
    exit 1
fi
echo "== probe run" >>"$out/env.txt"
"$work/bin/probe" >>"$out/env.txt" 2>&1
probe=$?
if [[ $probe -eq 3 ]]; then
    tail -1 "$out/env.txt"
    say "the driver reports no usable CUDA device: no GPU check can run; nothing done" | tee -a "$out/env.txt"
    exit 0
fi
if [[ $probe -ne 0 ]]; then
    tail -3 "$out/env.txt"
    say "the driver probe could not run (exit $probe; 127: the loader did not find a library): failed" |
        tee -a "$out/env.txt"
    exit 1
fi
tail -1 "$out/env.txt"

rc=0
run() { # log limit_s name program args...: appends to $out/<log>.log
    local log=$1 limit=$2 name=$3
    shift 3
    local t0=$SECONDS
    echo "== $name" >>"$out/$log.log"
    timeout -k 5 "$limit" "$@" >>"$out/$log.log" 2>&1
    local s=$?
    [[ $s -eq 124 || $s -eq 137 ]] && echo "device-check: $name ran past ${limit}s (a hang)" >>"$out/$log.log"
    say "$name: exit $s after $((SECONDS - t0)) s ($(tail -1 "$out/$log.log"))"
    [[ $s -ne 0 ]] && rc=1
}
# The limits (seconds), the GPU checks' at most 215 in all: each program's GPU work takes seconds
# on a device; a stuck wait costs the tests' 10 s wait timeout (common.h), and a program that
# still runs past its limit has its finished sections in its .json (written per section).
if ! timeout 20 "$work/bin/selftest" "$work/tables-selftest" >"$work/dump.txt" 2>>"$out/env.txt"; then
    say "selftest failed (see env.txt)"
    rc=1
fi
run gpu_test 75 gpu_test "$work/bin/gpu_test" "$work/tables-test" "$out"
run gpu_robust 60 gpu_robust "$work/bin/gpu_robust" "$work/tables-robust" "$out"
run gpu_bench 60 gpu_bench "$work/bin/gpu_bench" "$work/tables-bench" "$out"
# The read-ahead p99 check (issue 27) on this host's CPUs and disk, where `target/release/ple` was
# carried: a 1.4 GB generated table, DIRECT reads, steps 22 ms apart (the issue's decode loop),
# 5 ms and 1 ms apart (on 2 vCPUs the ratio misses 1.2 at 1 ms: does a spare core fix it?), then
# the all-cached step against MMAP warm, both into host_bench.log. Their figures are a
# benchmark's, not a pass/fail; a crash fails the run. At most 100 s together (36 s of timed
# steps, idle and busy, plus the table, three short prefills and warm-ups).
ple=${PLE_BIN:-$root/target/release/ple}
if [[ -x "$ple" ]]; then
    run host_bench 80 engine_p99 bash -c '"$1" synth-table "$2/t" --base 1000000 >/dev/null &&
        "$1" bench "$2/t" --engine --engine-prompt-tokens 2048 --pairs 1 --decode-steps 2 \
            --prefill-after-ms 10 --p99-gap-ms 22 --p99-steps 500 --p99-rounds 10 &&
        "$1" bench "$2/t" --engine --engine-prompt-tokens 2048 --pairs 1 --decode-steps 2 \
            --prefill-after-ms 10 --p99-gap-ms 5 --p99-steps 1000 --p99-rounds 20 &&
        "$1" bench "$2/t" --engine --engine-prompt-tokens 2048 --pairs 1 --decode-steps 2 \
            --prefill-after-ms 10 --p99-gap-ms 1 --p99-steps 2000 --p99-rounds 20 |
            grep -E "^device|cached 8x1|found the reader|stage means"' _ "$ple" "$work"
    # and the all-cached step against MMAP warm (issue 27, item 4) on the same table
    run host_bench 20 hit_path bash -c '"$1" bench steady "$2/t" --steps 20 --no-reference --cache-bytes 256M |
        grep -E "all-cached|hit path|mean per step"' _ "$ple" "$work"
fi
say "results in $out ($(ls "$out" | tr '\n' ' ')); exit $rc"
exit $rc
