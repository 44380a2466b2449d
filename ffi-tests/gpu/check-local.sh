#!/usr/bin/env bash
# Checks the GPU programs on a machine WITHOUT a GPU (CI, developers): compiles every program
# with -Wall -Wextra -Werror against include/ple.h and the CUDA headers of PyPI's
# nvidia-cuda-runtime-cu12 (pinned), checks that every ple_* symbol they use is exported by the
# built libple.so, runs the CPU-only self-test of the table generator and the reference
# dequantisation against ml_dtypes/numpy (independent oracles), stages cuda.h in
# target/gpu-headers (what a device run carries: the device machine has no network), and runs
# device-check.sh against a stand-in libcuda.so.1 that reports no device (its build half must
# succeed and it must exit 0 saying that nothing ran).
#
#   ffi-tests/gpu/check-local.sh [LIBPLE_SO]     (default: $CARGO_TARGET_DIR or target, debug)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
so=${1:-${CARGO_TARGET_DIR:-$root/target}/debug/libple.so}
RUNTIME_WHEEL="nvidia-cuda-runtime-cu12==12.9.79"
venv="${PLE_KERNEL_VENV:-${CARGO_TARGET_DIR:-$root/target}/kernel-tools}"
py="$venv/bin/python"
have=$("$py" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null || true)
if ! grep -qx "$RUNTIME_WHEEL" <<<"$have" || ! grep -q "^ml.dtypes==" <<<"$have" || ! grep -q "^numpy==" <<<"$have"; then
    echo "check-local: installing $RUNTIME_WHEEL ml_dtypes numpy into $venv"
    python3 -m venv "$venv"
    "$py" -m pip install --quiet --disable-pip-version-check "$RUNTIME_WHEEL" "ml_dtypes==0.5.4" "numpy<3"
fi
cuda_inc=$("$py" -c 'import nvidia.cuda_runtime, os; print(os.path.join(list(nvidia.cuda_runtime.__path__)[0], "include"))')
staged="${CARGO_TARGET_DIR:-$root/target}/gpu-headers"
mkdir -p "$staged"
cp "$cuda_inc/cuda.h" "$staged/cuda.h"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/include"
cp "$root/include/ple.h" "$tmp/include/ple.h"
flags=(-O2 -std=gnu11 -Wall -Wextra -Werror -Wno-format-truncation -ffp-contract=off -fno-fast-math)
programs=(gpu_test gpu_robust gpu_bench)
for p in "${programs[@]}"; do
    gcc "${flags[@]}" -I "$tmp/include" -I "$cuda_inc" -c "$here/$p.c" -o "$tmp/$p.o"
    missing=$(comm -23 <(nm -u "$tmp/$p.o" | awk '{print $2}' | grep '^ple_' | sort -u) \
        <(nm -D --defined-only "$so" | awk '{print $3}' | grep '^ple_' | sort -u))
    if [[ -n "$missing" ]]; then
        echo "check-local: FAIL: $p uses symbols $so does not export: $missing" >&2
        exit 1
    fi
    echo "check-local: $p compiles; its ple_* symbols are exported by $(basename "$so")"
done
gcc "${flags[@]}" -I "$tmp/include" "$here/selftest.c" -o "$tmp/selftest" -lm
"$tmp/selftest" "$tmp/tables" >"$tmp/dump.txt"
"$py" "$here/check-reference.py" "$tmp/dump.txt"

# device-check.sh against a libcuda.so.1 whose every entry point the programs use returns
# CUDA_ERROR_NO_DEVICE (100), in a folder the loader does not search: it must build everything,
# load that driver (the folder put on LD_LIBRARY_PATH) and stop on the probe's own "no device"
# answer, writing at most 8 files.
mkdir -p "$tmp/fakecuda" "$tmp/badcuda"
{
    echo '/* stand-in driver: no device */'
    nm -u "$tmp"/*.o | awk '{print $2}' | grep '^cu[A-Z]' | sort -u |
        sed 's/.*/int &(void) { return 100; }/'
    for f in cuInit cuDeviceGetCount cuDriverGetVersion; do echo "int $f(void) { return 100; }"; done
} | sort -u >"$tmp/fakecuda/fake.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 "$tmp/fakecuda/fake.c" -o "$tmp/fakecuda/libcuda.so.1"
if ! msg=$(OUT="$tmp/dc-out" PLE_LIBCUDA="$tmp/fakecuda/libcuda.so.1" PLE_CUDA_INCLUDE="$staged" \
    bash "$here/device-check.sh" "$so" 2>&1); then
    echo "$msg"
    tail -20 "$tmp/dc-out/env.txt" 2>/dev/null
    echo "check-local: FAIL: device-check.sh without a device did not exit 0" >&2
    exit 1
fi
if ! grep -q "no usable CUDA device" <<<"$msg" ||
    ! grep -q "^cuInit/cuDeviceGetCount: 100, devices 0" "$tmp/dc-out/env.txt" ||
    [[ $(ls "$tmp/dc-out" | wc -l) -gt 8 ]]; then
    echo "$msg"
    tail -20 "$tmp/dc-out/env.txt"
    echo "check-local: FAIL: device-check.sh did not stop cleanly at the probe's 'no device' (or wrote > 8 files)" >&2
    exit 1
fi
echo "check-local: device-check.sh builds every program, loads a driver off the loader's path and exits cleanly without a device"
# a driver the probe cannot load (its SONAME names no file): a failure, never "no device"
gcc -shared -fPIC -Wl,-soname,libcuda-unfindable.so.1 "$tmp/fakecuda/fake.c" -o "$tmp/badcuda/libcuda.so.1"
s=0
msg=$(OUT="$tmp/dc-bad" PLE_LIBCUDA="$tmp/badcuda/libcuda.so.1" PLE_CUDA_INCLUDE="$staged" \
    bash "$here/device-check.sh" "$so" 2>&1) || s=$?
if [[ $s -eq 0 ]] || grep -q "no usable CUDA device" <<<"$msg" || ! grep -q "probe could not run (exit 127" <<<"$msg"; then
    echo "$msg"
    echo "check-local: FAIL: device-check.sh took a driver its probe cannot load for 'no device' (exit $s)" >&2
    exit 1
fi
echo "check-local: device-check.sh fails (exit $s) when its probe cannot load the driver"
echo "check-local: OK"
