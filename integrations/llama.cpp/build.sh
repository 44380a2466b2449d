#!/usr/bin/env bash
# Builds the libple fork of llama.cpp: fetches the llama.cpp vendored in PyPI's llama-cpp-python sdist
# (pinned by version and sha256), applies patches/*.patch, and builds it CPU-only linked to libple
# through find_package(ple).
#   integrations/llama.cpp/build.sh [OUT]            (default target/llama.cpp-ple)
# Leaves:
#   OUT/src     the patched sources: a git checkout, the pinned tree tagged `upstream`, one commit per
#               patch (rebase there, then refresh-patches.sh)
#   OUT/build   the build: bin/libllama.so, bin/llama-completion, bin/llama-bench, bin/llama-batched-bench,
#               bin/ple-fidelity
#               (the test driver), and bin/llama-cli + bin/llama-server with PLE_LLAMA_SERVER=1
# Environment:
#   PLE_PREFIX=DIR      an installed libple (scripts/install.sh DIR) to link; default: install this
#                       checkout's into OUT/ple-prefix (PLE_NO_BUILD=1: what target/release holds)
#   PLE_LLAMA_SERVER=1  also build llama-cli and llama-server (the server library; a few more minutes)
#   PLE_LLAMA_JOBS=N    parallel compile jobs (default: the number of CPUs)
# Cached: a rerun rebuilds only what changed (patches that changed re-apply; unchanged files keep
# their timestamps). On the 2-vCPU development VM, test.sh from scratch (download, this build, the
# model, the checks) took 8 minutes; PLE_LLAMA_SERVER=1 then added 5.4 minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/target/llama.cpp-ple}
mkdir -p "$out"
out=$(cd "$out" && pwd)
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
jobs=${PLE_LLAMA_JOBS:-$(nproc)}
log() { echo "build.sh: $*" >&2; }

# 1. the pinned sources
sdist=$out/llama_cpp_python-$version.tar.gz
if ! echo "$sha256  $sdist" | sha256sum -c --status 2>/dev/null; then
  rm -f "$sdist"
  log "downloading llama-cpp-python==$version (sdist) from PyPI"
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$version" -d "$out" >&2 || { log "pip download of llama-cpp-python==$version failed"; exit 1; }
  echo "$sha256  $sdist" | sha256sum -c --status || { log "$sdist: sha256 is not $sha256"; exit 1; }
fi
src=$out/src
git_() { git -C "$src" -c user.name=libple -c user.email=libple@localhost -c core.autocrlf=false "$@"; }
if ! git_ rev-parse -q --verify upstream >/dev/null 2>&1; then
  log "unpacking llama.cpp into $src"
  rm -rf "$src" "$out/unpack"
  mkdir -p "$out/unpack"
  tar -xzf "$sdist" -C "$out/unpack" "llama_cpp_python-$version/vendor/llama.cpp"
  mv "$out/unpack/llama_cpp_python-$version/vendor/llama.cpp" "$src"
  rm -rf "$out/unpack" "$src/.git" # the sdist keeps the submodule's .git pointer file
  git_ init -q
  git_ add -A -f .
  git_ commit -q -m "llama.cpp as vendored in llama-cpp-python $version"
  git_ tag upstream
  echo "/.ple-patches" >> "$src/.git/info/exclude"
fi

# 2. the patches, re-applied when they changed; files whose content comes out the same keep their
# timestamps, so the build stays incremental
stamp=$(cat "$here"/patches/*.patch | sha256sum | cut -d' ' -f1)
if [ "$(cat "$src/.ple-patches" 2>/dev/null)" != "$stamp" ]; then
  log "applying $(ls "$here"/patches/*.patch | wc -l) patches"
  snap=$out/.mtimes
  (cd "$src" && { git diff --name-only upstream; git ls-files --others --exclude-standard; } | sort -u |
    while read -r f; do [ -f "$f" ] && printf '%s\t%s\t%s\n' "$(sha256sum < "$f" | cut -d' ' -f1)" "$(stat -c %Y "$f")" "$f"; done) > "$snap"
  git_ reset -q --hard upstream
  git_ clean -q -fd
  for p in "$here"/patches/*.patch; do
    git_ apply --index "$p" || { log "$(basename "$p") does not apply"; exit 1; }
    sed -n '/^diff --git /q;p' "$p" | git_ commit -q -F -
  done
  (cd "$src" && while IFS=$'\t' read -r h m f; do
    [ -f "$f" ] && [ "$(sha256sum < "$f" | cut -d' ' -f1)" = "$h" ] && touch -d "@$m" "$f"; done < "$snap")
  echo "$stamp" > "$src/.ple-patches"
fi

# 3. libple
if [ -n "${PLE_PREFIX:-}" ]; then
  prefix=$(cd "$PLE_PREFIX" && pwd)
else
  prefix=$out/ple-prefix
  "$root/scripts/install.sh" "$prefix" >&2
fi
[ -f "$prefix/lib/cmake/ple/pleConfig.cmake" ] || { log "$prefix holds no libple CMake package"; exit 1; }

# 4. the build
build=$out/build
server=OFF
[ "${PLE_LLAMA_SERVER:-0}" = 1 ] && server=ON
if [ ! -f "$build/CMakeCache.txt" ] || ! grep -q "^CMAKE_PREFIX_PATH:.*=$prefix\$" "$build/CMakeCache.txt" ||
   ! grep -q "^LLAMA_BUILD_SERVER:BOOL=$server\$" "$build/CMakeCache.txt"; then
  log "configuring $build"
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DLLAMA_BUILD_SERVER=$server -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=OFF \
    > "$out/configure.log" 2>&1 || { tail -n 40 "$out/configure.log" >&2; exit 1; }
fi
targets=(llama llama-completion llama-bench llama-batched-bench)
[ "$server" = ON ] && targets+=(llama-cli llama-server)
log "building ${targets[*]} (log: $out/build.log)"
cmake --build "$build" -j "$jobs" --target "${targets[@]}" > "$out/build.log" 2>&1 ||
  { grep -m 20 -B2 -A5 'error' "$out/build.log" >&2 || tail -n 40 "$out/build.log" >&2; exit 1; }

# 5. the fidelity test's driver, against llama.h
drv=$build/bin/ple-fidelity
if [ ! -x "$drv" ] || [ "$here/test/fidelity.cpp" -nt "$drv" ] || [ "$build/bin/libllama.so" -nt "$drv" ] ||
   [ "$src/include/llama.h" -nt "$drv" ]; then
  "${CXX:-c++}" -O2 -std=c++17 -Wall -Werror -I "$src/include" -I "$src/ggml/include" "$here/test/fidelity.cpp" \
    -L "$build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$build/bin" -o "$drv"
fi
for f in libllama.so llama-completion llama-bench ple-fidelity; do
  [ -e "$build/bin/$f" ] || { log "$build/bin/$f missing"; exit 1; }
done
echo "$build"
