#!/usr/bin/env bash
# Soak test (not in CI): `scripts/soak.sh [seconds] [threads]` (default 600 s, 4 threads).
# Random mixed steps from several threads on libple.so (scripts/soak.c): own and shared handles,
# random closes/reopens, short timeouts, releases, bad tokens, missing context, stats; every row
# read is compared with the row file. Prints steps, statuses by kind, RSS and fd figures, and
# exits non-zero on a wrong row, a panic status, RSS growth from the second to the last quarter of
# the run past PLE_SOAK_MAX_RSS_GROWTH_MB (default 32), fd growth, or an fd not given back.
#
# The C program is built with AddressSanitizer + UBSan (its own code, and every malloc/free of the
# library through ASan's allocator, with LeakSanitizer at exit). PLE_SOAK_ASAN_RUST=1 also builds
# libple itself with -Zsanitizer=address on a nightly toolchain (slow to build; target/asan).
# PLE_SOAK_SANITIZE: the -fsanitize list (default address,undefined; empty for a plain build).
# PLE_SOAK_DIR: where the table is generated (default: a temporary directory, removed at exit).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-600}"
threads="${2:-4}"

host=$(rustc -vV | sed -n 's/^host: //p')
if [[ "${PLE_SOAK_ASAN_RUST:-0}" == 1 ]]; then
    RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers" \
        cargo +nightly build --release -p ple-capi --target "$host" --target-dir target/asan
    lib="target/asan/$host/release"
    export ASAN_OPTIONS="detect_odr_violation=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
else
    lib="target/release"
fi
cargo build --release -p ple-capi -p ple-cli

work="${PLE_SOAK_DIR:-}"
if [[ -z "$work" ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
target/release/ple synth-table "$work/table" --format nvfp4 --base 20000 --shards 8 --seed 3 >/dev/null
# The SONAME is libple.so.0.3 (scripts/install.sh makes that link when installing).
ln -sf "$PWD/$lib/libple.so" "$work/libple.so.0.3"
san="${PLE_SOAK_SANITIZE-address,undefined}"
sanflags=()
if [[ -n "$san" ]]; then sanflags=(-fsanitize="$san" -fno-sanitize-recover=undefined); fi
cc -std=c11 -O1 -g "${sanflags[@]}" -fno-omit-frame-pointer \
    -Wall -Wextra -Werror -Iinclude scripts/soak.c -o "$work/soak" -L"$lib" -lple -lpthread \
    -Wl,-rpath,"$work"
echo "soak: $secs s, $threads threads, sanitizers: ${san:-none}, libple from $lib, table $(du -h "$work/table/table.rows" | cut -f1)"
ASAN_OPTIONS="detect_leaks=1:quarantine_size_mb=16:malloc_context_size=8:abort_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
    PLE_LOG="${PLE_LOG:-off}" "$work/soak" "$work/table" "$secs" "$threads"
