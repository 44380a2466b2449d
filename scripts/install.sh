#!/usr/bin/env bash
# Builds libple (release) and installs it into a prefix:
#   scripts/install.sh /opt/ple
# installs lib/libple.so.X.Y.Z with its SONAME and dev symlinks, include/ple.h and include/ple-cpp.h
# (the header-only C++ layer), bin/ple, lib/cmake/ple/pleConfig{,Version}.cmake (imported target
# ple::ple) and lib/pkgconfig/ple.pc.
# Everything is relocatable: move the prefix anywhere. Set PLE_NO_BUILD=1 to install what
# target/release already holds.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 PREFIX" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=$1
cd "$root"
if [ "${PLE_NO_BUILD:-0}" != 1 ]; then
  cargo build --release --lib --bins
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
major=${version%%.*}; rest=${version#*.}; minor=${rest%%.*}
if [ "$major" = 0 ]; then soname="libple.so.0.$minor"; else soname="libple.so.$major"; fi
lib=target/release/libple.so
actual=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$actual" = "$soname" ] || { echo "install: $lib has SONAME '$actual', expected '$soname'" >&2; exit 1; }

mkdir -p "$prefix/lib/cmake/ple" "$prefix/lib/pkgconfig" "$prefix/include" "$prefix/bin"
install -m 0755 "$lib" "$prefix/lib/libple.so.$version"
ln -sfn "libple.so.$version" "$prefix/lib/$soname"
ln -sfn "$soname" "$prefix/lib/libple.so"
install -m 0644 include/ple.h "$prefix/include/ple.h"
install -m 0644 include/ple-cpp.h "$prefix/include/ple-cpp.h"
install -m 0755 target/release/ple "$prefix/bin/ple"
subst() {
  sed -e "s|@PLE_VERSION@|$version|g" -e "s|@PLE_VERSION_MAJOR@|$major|g" \
      -e "s|@PLE_VERSION_MINOR@|$minor|g" -e "s|@PLE_SONAME@|$soname|g" "$1" > "$2"
}
subst cmake/pleConfig.cmake.in "$prefix/lib/cmake/ple/pleConfig.cmake"
cmake -DPLE_VERSION="$version" -DOUT="$prefix/lib/cmake/ple/pleConfigVersion.cmake" \
      -P cmake/pleConfigVersion.cmake
subst cmake/ple.pc.in "$prefix/lib/pkgconfig/ple.pc"
echo "installed libple $version into $prefix"
