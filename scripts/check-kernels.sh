#!/usr/bin/env bash
# Checks the GPU kernels without a GPU:
#  1. regenerates the PTX from kernels/ple_kernels.cu with the pinned NVRTC and fails if it differs
#     from the committed kernels/ple_kernels.ptx (run scripts/gen-ptx.py and commit to fix drift);
#  2. assembles the PTX with ptxas (pinned, new enough for sm_121) for every architecture libple
#     supports; any error fails. Register use and spills are printed.
#
# Tools come from PyPI wheels installed into a private virtual environment
# ($PLE_KERNEL_VENV, default target/kernel-tools) on first use; set PLE_KERNEL_PYTHON to use an
# interpreter that already has both wheels instead.
set -euo pipefail
cd "$(dirname "$0")/.."

NVRTC_WHEEL="nvidia-cuda-nvrtc-cu12==12.2.140"  # keep in sync with scripts/gen-ptx.py
NVCC_WHEEL="nvidia-cuda-nvcc-cu12==12.9.86"     # ptxas 12.9: first with sm_121
ARCHS="sm_80 sm_90 sm_100 sm_120 sm_121"

if [[ -n "${PLE_KERNEL_PYTHON:-}" ]]; then
    py="$PLE_KERNEL_PYTHON"
else
    venv="${PLE_KERNEL_VENV:-${CARGO_TARGET_DIR:-target}/kernel-tools}"
    py="$venv/bin/python"
    have=$("$py" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null || true)
    if ! grep -qx "$NVRTC_WHEEL" <<<"$have" || ! grep -qx "$NVCC_WHEEL" <<<"$have"; then
        echo "check-kernels: installing $NVRTC_WHEEL $NVCC_WHEEL into $venv"
        python3 -m venv "$venv"
        "$py" -m pip install --quiet --disable-pip-version-check "$NVRTC_WHEEL" "$NVCC_WHEEL"
    fi
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$py" scripts/gen-ptx.py --out "$tmp/ple_kernels.ptx"
if ! cmp -s "$tmp/ple_kernels.ptx" kernels/ple_kernels.ptx; then
    echo "check-kernels: FAIL: kernels/ple_kernels.ptx is stale (differs from the PTX generated from kernels/ple_kernels.cu)" >&2
    diff "$tmp/ple_kernels.ptx" kernels/ple_kernels.ptx | head -20 >&2 || true
    echo "check-kernels: run scripts/gen-ptx.py and commit kernels/ple_kernels.ptx" >&2
    exit 1
fi
echo "check-kernels: committed PTX matches the source"

ptxas="$("$py" -c 'import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], "bin", "ptxas"))')"
"$ptxas" --version | tail -1
for arch in $ARCHS; do
    if ! "$ptxas" -arch="$arch" -v --warn-on-spills -o "$tmp/$arch.cubin" kernels/ple_kernels.ptx \
        >"$tmp/$arch.log" 2>&1; then
        cat "$tmp/$arch.log" >&2
        echo "check-kernels: FAIL: ptxas $arch" >&2
        exit 1
    fi
    if grep -q "error" "$tmp/$arch.log"; then
        cat "$tmp/$arch.log" >&2
        echo "check-kernels: FAIL: ptxas $arch reported errors" >&2
        exit 1
    fi
    echo "check-kernels: ptxas $arch ok; ple_dequant: $(grep -A3 "entry function 'ple_dequant'" "$tmp/$arch.log" | grep -E 'Used|spill' | sed 's/.*: *//' | tr '\n' ' ')"
    grep -i "warning" "$tmp/$arch.log" || true
done
echo "check-kernels: OK ($ARCHS)"
