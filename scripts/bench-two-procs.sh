#!/usr/bin/env bash
# Two engine processes on one host (tensor-parallel ranks looking up the same tokens): both run
# `ple bench steady` at once on TABLE_DIR, first in DIRECT mode with a row cache each, then in
# MMAP mode sharing the page cache; the page cache is dropped before each set-up (needs root).
# Usage: scripts/bench-two-procs.sh TABLE_DIR [SECONDS=240] [CACHE=256M] [OUT=bench-two-procs]
set -euo pipefail
table=${1:?usage: $0 TABLE_DIR [SECONDS] [CACHE] [OUT]}
secs=${2:-240}
cache=${3:-256M}
out=${4:-bench-two-procs}
ple=${PLE:-target/release/ple}
mkdir -p "$out"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
for mode in direct mmap; do
  drop
  c=$cache; [ "$mode" = mmap ] && c=0
  free -m > "$out/$mode-mem-before.txt"
  for r in 0 1; do
    "$ple" bench steady "$table" --io-mode "$mode" --cache-bytes "$c" --seconds "$secs" \
      --steps 100000000 --interval 20 --no-reference > "$out/$mode-$r.txt" 2>&1 &
  done
  sleep $((secs - 10)); free -m > "$out/$mode-mem-end.txt"
  wait
  for r in 0 1; do echo "== $mode, process $r"; grep -E '^ overall|steps,' "$out/$mode-$r.txt"; done
done
