#!/usr/bin/env bash
# The GPU path of libple run on the CPU: an emulated CUDA driver (ffi-tests/gpu/emu/, a test
# double built into target/cuda-emu/libcuda.so.1, never linked into libple and never on a
# production library path) that runs libple's kernels — kernels/ple_kernels.cu itself, compiled
# for the host — on stream threads of its own.
#
#   ffi-tests/gpu/emulated.sh --build               builds target/cuda-emu/libcuda.so.1 only
#   ffi-tests/gpu/emulated.sh [LIBPLE_SO] [OUTDIR]  builds it and the GPU programs, then runs
#       gpu_emu_test (its full matrix; then shorter under CUDA_DEVICE_MAX_CONNECTIONS=1 and
#       under PLE_EMU_STREAM_MEM_OPS=0), the Python package's dequant_fuse (emulated_python.py),
#       gpu_test, gpu_robust and gpu_bench against it with
#       target/cuda-emu first on LD_LIBRARY_PATH (libple's dlopen("libcuda.so.1") finds the
#       emulator there, and only there); then device-check.sh itself against the emulator
#       (PLE_LIBCUDA, its folder off the loader's path) with a stand-in `ple`: it must pass and
#       write only the 8 files a device run brings back. Results land in OUTDIR (default
#       target/gpu-emu-out).
#       Every figure they print is the emulator's (CPU) timing, not a device's.
# Exit status 0 iff every check of every program passed.
#
# Emulator switches (environment): PLE_EMU_STREAM_MEM_OPS=0 reports no 64-bit stream memory
# operations (the GB10 case: the attribute is 0 and cuStreamWaitValue64 fails), PLE_EMU_SM_COUNT
# (default 4), PLE_EMU_CC (default 90), PLE_EMU_DRIVER_VERSION (default 12090), and CUDA's own
# CUDA_DEVICE_MAX_CONNECTIONS=N (streams share N in-order hardware queues, round-robin).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tdir=${CARGO_TARGET_DIR:-$root/target}
emu_dir="$tdir/cuda-emu"
say() { echo "emulated: $*"; }

# cuda.h from PyPI's nvidia-cuda-runtime-cu12 (the header check-local.sh stages; pinned there)
cuda_include() {
    if [[ -f "$tdir/gpu-headers/cuda.h" ]]; then echo "$tdir/gpu-headers"; return; fi
    local venv="${PLE_KERNEL_VENV:-$tdir/kernel-tools}" wheel="nvidia-cuda-runtime-cu12==12.9.79"
    if ! "$venv/bin/python" -c 'import nvidia.cuda_runtime' 2>/dev/null; then
        say "installing $wheel into $venv" >&2
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel"
    fi
    "$venv/bin/python" -c 'import nvidia.cuda_runtime, os; print(os.path.join(list(nvidia.cuda_runtime.__path__)[0], "include"))'
}

build_emulator() {
    local inc
    inc=$(cuda_include)
    mkdir -p "$emu_dir"
    g++ -std=c++17 -O2 -g -fPIC -shared -fvisibility=hidden -fvisibility-inlines-hidden \
        -Wall -Wextra -Werror -Wno-unknown-pragmas -ffp-contract=off -fno-fast-math -I "$inc" \
        "$here"/emu/*.cpp -o "$emu_dir/libcuda.so.1.tmp" -Wl,-soname,libcuda.so.1 \
        -Wl,--no-undefined -lpthread
    mv "$emu_dir/libcuda.so.1.tmp" "$emu_dir/libcuda.so.1"
    say "built $emu_dir/libcuda.so.1 (emulated driver; kernels from kernels/ple_kernels.cu)"
}

if [[ "${1:-}" == "--build" ]]; then
    build_emulator
    exit 0
fi

so=$(realpath "${1:-$tdir/release/libple.so}")
out=${2:-$tdir/gpu-emu-out}
mkdir -p "$out" && out=$(realpath "$out")
build_emulator
inc=$(cuda_include)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lib" "$work/bin"
cp "$so" "$work/lib/libple.so"
soname=$(objdump -p "$so" 2>/dev/null | awk '/SONAME/{print $2}')
[[ -n "$soname" && "$soname" != libple.so ]] && ln -sf libple.so "$work/lib/$soname"
flags=(-O2 -std=gnu11 -Wall -Wextra -Werror -Wno-format-truncation -ffp-contract=off -fno-fast-math
    -I "$root/include" -I "$inc")
for p in gpu_emu_test gpu_test gpu_robust gpu_bench; do
    gcc "${flags[@]}" "$here/$p.c" -o "$work/bin/$p" "$work/lib/libple.so" "$emu_dir/libcuda.so.1" \
        -lpthread -lm
done
ld_path0=${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH="$emu_dir:$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

rc=0
run() { # name limit_s [ENV=V ...] program args...
    local name=$1 limit=$2 t0=$SECONDS s=0
    shift 2
    timeout -k 5 "$limit" env "$@" >"$out/$name.log" 2>&1 || s=$?
    [[ $s -eq 124 || $s -eq 137 ]] && echo "emulated: $name ran past ${limit}s (a hang)" >>"$out/$name.log"
    say "$name: exit $s after $((SECONDS - t0)) s ($(tail -1 "$out/$name.log"))"
    if grep -q "cuda-emu: misuse" "$out/$name.log"; then # a call a real driver may not survive
        grep "cuda-emu: misuse" "$out/$name.log" | sort | uniq -c | head -5
        s=1
    fi
    if [[ $s -ne 0 ]]; then
        grep -E "FAIL|FATAL|cuda-emu|panicked" "$out/$name.log" | head -20 || true
        rc=1
    fi
}
run gpu_emu_test 240 "$work/bin/gpu_emu_test" "$work/tables-emu" "$out"
# one hardware queue for all streams: a hidden dependency on a stream of libple's would hang
run gpu_emu_test_one_queue 120 CUDA_DEVICE_MAX_CONNECTIONS=1 "$work/bin/gpu_emu_test" \
    "$work/tables-emu" "$out/one-queue" quick
# the GB10 case: no 64-bit stream memory operations (AUTO picks the spin kernel)
run gpu_emu_test_no_memops 120 PLE_EMU_STREAM_MEM_OPS=0 "$work/bin/gpu_emu_test" \
    "$work/tables-emu" "$out/no-memops" quick
# the Python package's dequant_fuse (numpy + ml_dtypes from the kernel-tools venv, as check-local.sh)
venv="${PLE_KERNEL_VENV:-$tdir/kernel-tools}"
if ! "$venv/bin/python" -c 'import numpy, ml_dtypes' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "ml_dtypes==0.5.4" "numpy<3"
fi
run python_dequant_fuse 120 PYTHONPATH="$root/python/src" PLE_LIBRARY="$work/lib/libple.so" \
    "$venv/bin/python" "$here/emulated_python.py" "$work/tables-emu/nvfp4"
run gpu_test 240 "$work/bin/gpu_test" "$work/tables-test" "$out"
run gpu_robust 180 "$work/bin/gpu_robust" "$work/tables-robust" "$out"
run gpu_bench 180 PLE_GPU_BENCH_REPS=3 "$work/bin/gpu_bench" "$work/tables-bench" "$out"
# device-check.sh as a device session runs it, on the emulated driver: the driver given by path
# in a folder the loader does not search (the script must put it on LD_LIBRARY_PATH itself), and
# a stand-in `ple` for the host benchmarks (it prints a line each of their filters keeps): every
# program must pass within the script's own limits, and $OUT must hold exactly the 8 files the
# device tool brings back.
mkdir -p "$work/stand-in"
cat >"$work/stand-in/ple" <<'SH'
#!/usr/bin/env bash
# stand-in for `ple` in device-check.sh's host benchmarks (emulated.sh)
case "$1" in
synth-table) mkdir -p "$2" ;;
bench) if [[ "$2" == steady ]]; then echo "all-cached: stand-in"; else echo "device: stand-in"; fi ;;
*) exit 2 ;;
esac
SH
chmod +x "$work/stand-in/ple"
dc_out="$out/device-check"
rm -rf "$dc_out"
t0=$SECONDS s=0
LD_LIBRARY_PATH="$ld_path0" OUT="$dc_out" PLE_LIBCUDA="$emu_dir/libcuda.so.1" PLE_CUDA_INCLUDE="$inc" \
    PLE_BIN="$work/stand-in/ple" PLE_GPU_BENCH_REPS=3 timeout -k 5 600 bash "$here/device-check.sh" "$so" \
    >"$out/device_check.log" 2>&1 || s=$?
files=$(ls "$dc_out" 2>/dev/null | sort | tr '\n' ' ' || true)
want="env.txt gpu_bench.json gpu_bench.log gpu_robust.json gpu_robust.log gpu_test.json gpu_test.log host_bench.log "
say "device_check: exit $s after $((SECONDS - t0)) s (files: $files)"
if [[ $s -ne 0 || "$files" != "$want" ]] || ! grep -q "devices 1" "$dc_out/env.txt" ||
    grep -q "cuda-emu: misuse" "$dc_out"/*.log; then
    cat "$out/device_check.log"
    grep -hE "FAIL|FATAL|cuda-emu|panicked" "$dc_out"/*.log | head -20 || true
    say "device_check: FAIL: device-check.sh on the emulated driver did not pass with exactly: $want"
    rc=1
fi
say "results in $out (emulated: every figure is CPU timing, not a device's); exit $rc"
exit $rc
