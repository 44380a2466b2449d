#!/usr/bin/env bash
# Fetches the llama.cpp sources vendored in the llama-cpp-python source distribution from PyPI
# (pinned) and prints the llama.cpp directory. Cached: reruns reuse CACHE_DIR.
#   examples/llama_cpp/fetch.sh [CACHE_DIR]        (default target/llama-cpp)
# Fails (exit 1, with pip's message) when the download fails: callers must not skip silently.
set -euo pipefail
version=0.3.16
cache=${1:-$(cd "$(dirname "$0")/../.." && pwd)/target/llama-cpp}
src="$cache/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -f "$src/include/llama.h" ]; then
  mkdir -p "$cache"
  sdist="$cache/llama_cpp_python-$version.tar.gz"
  if [ ! -f "$sdist" ]; then
    python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$version" -d "$cache" >&2 \
      || { echo "fetch.sh: pip download of llama-cpp-python==$version failed" >&2; exit 1; }
  fi
  tar -xzf "$sdist" -C "$cache" "llama_cpp_python-$version/vendor/llama.cpp/include" \
    "llama_cpp_python-$version/vendor/llama.cpp/ggml"
fi
[ -f "$src/include/llama.h" ] || { echo "fetch.sh: $src/include/llama.h missing after unpacking" >&2; exit 1; }
echo "$src"
