#!/usr/bin/env bash
# Builds ggml's CPU backend (static, portable: no -march=native, no OpenMP) from the llama.cpp tree
# fetch.sh unpacked, into BUILD_DIR; a rerun only checks it is up to date. About 70 s on 2 cores.
#   examples/llama_cpp/build-ggml.sh LLAMA_CPP_DIR BUILD_DIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 LLAMA_CPP_DIR BUILD_DIR" >&2; exit 2; }
src=$1/ggml
build=$2
# the sdist leaves out ggml.pc.in (only used to install a pkg-config file, which we do not)
[ -f "$src/ggml.pc.in" ] || : > "$src/ggml.pc.in"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
    -DGGML_BACKEND_DL=OFF -DGGML_OPENMP=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF \
    >"$build.configure.log" 2>&1 || { tail -n 40 "$build.configure.log" >&2; exit 1; }
fi
cmake --build "$build" -j 2 >"$build/build.log" 2>&1 || { tail -n 40 "$build/build.log" >&2; exit 1; }
for lib in libggml.a libggml-cpu.a libggml-base.a; do
  [ -f "$build/src/$lib" ] || { echo "build-ggml.sh: $build/src/$lib missing" >&2; exit 1; }
done
echo "$build"
