#!/usr/bin/env bash
# The whole test suite (README command 2). Installs its own prerequisites on a fresh Debian machine
# (cmake, valgrind from Debian packages; numpy, ml_dtypes, safetensors, mypy, the CUDA compiler wheels
# from PyPI), then: format and lint checks, the Python package's types (mypy), Rust tests (incl.
# header drift and the Python oracles), the CUDA kernels compiled for real, install into a
# temporary prefix, the C tests and examples built through find_package(ple) and run under ctest:
# plain, with ASan + UBSan, and under valgrind.
# Then the engine examples, and the Python wheel: its tests in a fresh venv without torch, then
# beside torch and transformers (scripts/torch-venv.sh) for ple.transformers.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
step() { printf '\n=== %s\n' "$*"; }

step "prerequisites"
need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v valgrind >/dev/null || need_apt+=(valgrind)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v g++ >/dev/null || need_apt+=(g++)
command -v fusermount3 >/dev/null || need_apt+=(fuse3)   # scripts/faultfs.py (the faultfs tests)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "missing: ${need_apt[*]} (install them, or run as root)" >&2; exit 1
  fi
fi
python3 -m pip install -q --disable-pip-version-check -r scripts/requirements-test.txt
export CI=${CI:-true}   # the Rust tests fail (not skip) when an oracle's Python package is missing

step "format and lint"
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings

step "Python types: mypy (strict) over python/src/ple, configured in python/pyproject.toml"
(cd python && python3 -m mypy)

step "Rust tests (unit, integration, header drift, Python oracles)"
# the faultfs tests (FUSE fault injection) are required where /dev/fuse exists, skipped elsewhere
if [ -e /dev/fuse ]; then export PLE_FAULTFS_REQUIRED=1
else echo "no /dev/fuse: the faultfs tests (crates/ple-capi/tests/faultfs.rs) skip"; fi
cargo test --release

step "CUDA kernels: PTX drift and ptxas for every target"
if [ -x scripts/check-kernels.sh ]; then scripts/check-kernels.sh; fi

step "install into a temporary prefix"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
scripts/install.sh "$prefix" >/dev/null
so=$(readlink -f "$prefix/lib/libple.so")
readelf -d "$so" | grep -q "SONAME.*\[libple.so.0.3\]" || { echo "SONAME missing" >&2; exit 1; }
others=$(nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^ple_' || true)
[ -z "$others" ] || { echo "libple.so exports non-ple_ symbols:"; echo "$others"; exit 1; } >&2
echo "SONAME and exported symbols ok ($(nm -D --defined-only "$so" | grep -c ' ple_') ple_* functions)"

step "pkg-config: the README's recipe builds a program that runs as it is (RUNPATH from ple.pc)"
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --modversion ple
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror -pedantic ffi-tests/test_version.c -Iffi-tests \
   $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs ple) -o "$work/pc_version"
readelf -d "$work/pc_version" | grep -q "RUNPATH.*$prefix/lib" || { echo "pc_version has no RUNPATH to $prefix/lib" >&2; exit 1; }
env -u LD_LIBRARY_PATH "$work/pc_version"

step "CMake package version rule (SameMinorVersion at 0.x)"
mkdir -p "$work/vcheck"
for want in "0.3 ok" "0.3.0 ok" "0.2 refused" "0.4 refused" "1.0 refused"; do
  printf 'cmake_minimum_required(VERSION 3.16)\nproject(v NONE)\nfind_package(ple %s CONFIG REQUIRED)\n' \
    "${want% *}" > "$work/vcheck/CMakeLists.txt"
  if cmake -S "$work/vcheck" -B "$work/vcheck/build-${want% *}" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null 2>&1; then
    got=ok; else got=refused; fi
  [ "$got" = "${want#* }" ] || { echo "find_package(ple ${want% *}): $got, expected ${want#* }" >&2; exit 1; }
done
echo "find_package(ple 0.3 / 0.3.0) found; 0.2, 0.4 and 1.0 refused"

step "C tests through find_package(ple) and ctest"
cmake -S ffi-tests -B "$work/ffi" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$work/ffi" -j 2 >/dev/null
ctest --test-dir "$work/ffi" --output-on-failure -LE 'sanitize|valgrind'

step "C tests built with AddressSanitizer + UndefinedBehaviorSanitizer (ctest -L sanitize)"
ctest --test-dir "$work/ffi" --output-on-failure -L sanitize

step "examples (engine integration) through find_package(ple) and ctest"
cmake -S examples -B "$work/examples" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/examples" -j 2 >/dev/null
ctest --test-dir "$work/examples" --output-on-failure

step "GPU programs without a GPU: compile against PyPI's CUDA headers, reference dequant vs ml_dtypes"
ffi-tests/gpu/check-local.sh "$so"
# the C++ CUDA engine example, built against the CUDA runtime wheel; with no GPU it must say so and exit 0
venv="${PLE_KERNEL_VENV:-${CARGO_TARGET_DIR:-target}/kernel-tools}"
site=$("$venv/bin/python" -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))')
g++ -std=c++17 -Wall -Wextra -Werror -I"$prefix/include" -I"$site/nvidia/cuda_runtime/include" \
    -I"$site/nvidia/cuda_nvcc/include" examples/cuda_engine.cpp -o "$work/cuda_engine" \
    -L"$prefix/lib" -lple "$site/nvidia/cuda_runtime/lib/libcudart.so.12" \
    -Wl,-rpath,"$prefix/lib:$site/nvidia/cuda_runtime/lib"
"$work/cuda_engine" "$work/examples/example-table"

step "GPU path on the emulated CUDA driver (a test double in target/cuda-emu): libple's kernels built for the CPU, gpu_emu_test, gpu_test, gpu_robust, gpu_bench"
ffi-tests/gpu/emulated.sh "$so" "${CARGO_TARGET_DIR:-target}/gpu-emu-out"

step "C tests under valgrind (ctest -L valgrind)"
ctest --test-dir "$work/ffi" --output-on-failure -L valgrind

# --- engine integrations (issue 16): llama.cpp's llama_batch, the Python wheel -------------------
step "llama.cpp: a real llama_batch (llama.h from PyPI's llama-cpp-python sdist) through ple_submit_tokens, then in a ggml graph"
# fetch.sh fails (and so this script) when the download fails: no silent skip
tdir=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)
llama=$(examples/llama_cpp/fetch.sh "$tdir/llama-cpp")
# ggml's CPU backend, built once into target/ (about 70 s on 2 cores), for the ggml graph example
ggml=$(examples/llama_cpp/build-ggml.sh "$llama" "$tdir/llama-cpp/ggml-build")
cmake -S examples/llama_cpp -B "$work/llama" -DCMAKE_PREFIX_PATH="$prefix" -DLLAMA_CPP_DIR="$llama" \
  -DGGML_BUILD_DIR="$ggml" >/dev/null
cmake --build "$work/llama" -j 2 >/dev/null
ctest --test-dir "$work/llama" --output-on-failure

step "llama.cpp fork (integrations/llama.cpp): Qwen4Exp's PLE rows from libple, logits bit-identical to stock llama.cpp"
# build.sh fetches llama-cpp-python's sdist (pinned by sha256), patches and builds it once into
# target/llama.cpp-ple (~6 min on 2 cores; reruns rebuild what changed), against the libple of
# target/release; test.sh makes a tiny Qwen4Exp GGUF and its table in the torch venv (cached there too)
PLE_NO_BUILD=1 integrations/llama.cpp/test.sh "$tdir/llama.cpp-ple"

step "Python package: the wheel (with libple.so) in a fresh venv, pytest with no Rust toolchain on PATH"
PLE_NO_BUILD=1 scripts/build-wheel.sh "$work/wheels" >/dev/null
# pure Python over libple.so: tagged for any CPython 3 on the platform
whl=$(ls "$work"/wheels/ple-*.whl)
case "$(basename "$whl")" in
  ple-*-py3-none-linux_x86_64.whl) echo "wheel: $(basename "$whl")" ;;
  *) echo "wheel tag: $(basename "$whl"), expected py3-none-linux_x86_64" >&2; exit 1 ;;
esac
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$work"/wheels/ple-*.whl \
  "pytest>=7" "ml_dtypes>=0.4"
# PLE_CUDA_EMU: test_gpu_emulated.py runs the GPU calls on the emulated driver built above
(cd "$work" && env -i PATH=/usr/bin:/bin HOME="$work" PLE_BIN="$prefix/bin/ple" PLE_EXPECT_INSTALLED=1 \
  PLE_CUDA_EMU="$tdir/cuda-emu/libcuda.so.1" \
  "$work/venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/python/tests")
env -i PATH=/usr/bin:/bin HOME="$work" "$work/venv/bin/python" examples/python/vllm_style.py \
  "$work/examples/example-table" >/dev/null
echo "examples/python/vllm_style.py ran on the CPU"
# the same wheel on another CPython 3 (on PATH, or pyenv's), where one is installed
other=$(scripts/other-python.sh || true)
if [ -n "$other" ]; then
  "$other" -m venv "$work/venv-other"
  "$work/venv-other/bin/python" -m pip install -q --disable-pip-version-check "$whl"
  env -i PATH=/usr/bin:/bin HOME="$work" "$work/venv-other/bin/python" examples/python/vllm_style.py \
    "$work/examples/example-table" >/dev/null
  echo "the wheel installed and ran examples/python/vllm_style.py on $("$other" --version) ($other)"
else
  echo "no CPython 3 other than $(python3 --version) here: the wheel's tag was checked, not a second install"
fi

step "Hugging Face transformers: the wheel beside torch + transformers (scripts/torch-venv.sh), ple.transformers tests, examples/python/hf_generate.py"
# the venv is shared (target/torch-venv, or PLE_TORCH_VENV): the wheel goes to a private --target
# directory on PYTHONPATH instead of into it; torch-venv.sh fails (and so this script) if pip does
venv_py=$(scripts/torch-venv.sh)
"$venv_py" -m pip install -q --disable-pip-version-check --no-deps --target "$work/hf-site" "$work"/wheels/ple-*.whl
hf_env=(env -i PATH=/usr/bin:/bin HOME="$work" PYTHONPATH="$work/hf-site" HF_HUB_OFFLINE=1 PLE_BIN="$prefix/bin/ple")
(cd "$work" && "${hf_env[@]}" PLE_EXPECT_TORCH=1 "$venv_py" -m pytest -q -rs -p no:cacheprovider \
  "$root/python/tests/test_transformers.py" "$root/python/tests/test_transformers_geometry.py" \
  "$root/python/tests/test_transformers_import.py")
"${hf_env[@]}" "$venv_py" examples/python/hf_generate.py --tiny "$work/hf-tiny" --check --max-new-tokens 12

step "torch.distributed: head shards all-reduced over gloo (N = 2, 4) equal one unsharded handle bit for bit"
# the same private site as the transformers step: the shared venv is never written to
for n in 2 4; do
  "${hf_env[@]}" "$venv_py" examples/python/tp_allreduce.py "$work/examples/example-table" "$n"
done

echo
echo "all test stages passed"
