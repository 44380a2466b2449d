#!/usr/bin/env bash
# Several engine processes on one host (tensor-parallel ranks looking up the same tokens): PROCS
# processes run the same `ple bench steady` load at once on TABLE_DIR, in three set-ups:
#   mmap    MMAP, no row cache: the processes share the page cache
#   direct  DIRECT, a CACHE row cache each (every process caches and reads all 16 heads)
#   shards  DIRECT, a CACHE row cache each, process r serving head shard r of PROCS
# Before each set-up the table's pages are dropped from the page cache (POSIX_FADV_DONTNEED on
# the row file only). SECONDS-5 s into each run it samples every process's RSS and PSS
# (/proc/PID/smaps_rollup), the table's page-cache residency (fincore) and MemAvailable; then it
# prints per process and in total: RSS/PSS, table page cache, hit rate, storage reads and KiB
# per token, step p50/p99 (from each process's --json).
# Usage: scripts/bench-tp-procs.sh TABLE_DIR [SECONDS=60] [CACHE=256M] [OUT=bench-tp-procs] [PROCS=4]
set -euo pipefail
table=${1:?usage: $0 TABLE_DIR [SECONDS] [CACHE] [OUT] [PROCS]}
secs=${2:-60}
cache=${3:-256M}
out=${4:-bench-tp-procs}
procs=${5:-4}
ple=${PLE:-target/release/ple}
mkdir -p "$out"
evict() {
  python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' \
    "$table/table.rows"
}
sample() { # setup pids...
  local s=$1; shift
  for p in "$@"; do
    awk -v pid="$p" '/^(Rss|Pss):/ {printf "%s %s %s\n", pid, $1, $2}' "/proc/$p/smaps_rollup"
  done > "$out/$s-mem.txt"
  fincore -b -n -o RES "$table/table.rows" > "$out/$s-pagecache.txt"
  grep MemAvailable /proc/meminfo >> "$out/$s-pagecache.txt"
}
for setup in mmap direct shards; do
  evict
  pids=()
  for ((r = 0; r < procs; r++)); do
    args=(--io-mode direct --cache-bytes "$cache")
    [ "$setup" = mmap ] && args=(--io-mode mmap --cache-bytes 0)
    [ "$setup" = shards ] && args+=(--shard "$r/$procs" --no-whole)
    "$ple" bench steady "$table" "${args[@]}" --seconds "$secs" --steps 100000000 \
      --interval 100000000 --no-reference --threads 1 --json "$out/$setup-$r.json" \
      > "$out/$setup-$r.txt" 2>&1 &
    pids+=($!)
  done
  sleep $((secs - 5))
  sample "$setup" "${pids[@]}"
  wait "${pids[@]}"
done
python3 - "$out" "$procs" <<'EOF'
import json, sys
out, procs = sys.argv[1], int(sys.argv[2])
print(f"{'set-up':>7} {'proc':>5} {'RSS MiB':>8} {'PSS MiB':>8} {'hit%':>6} {'reads/tok':>9} {'KiB/tok':>8} "
      f"{'p50 µs':>8} {'p99 µs':>8} {'tokens':>9}")
for setup in ["mmap", "direct", "shards"]:
    mem = {}
    for line in open(f"{out}/{setup}-mem.txt"):
        pid, k, v = line.split()
        mem.setdefault(pid, {})[k.rstrip(":")] = int(v) / 1024
    pc = open(f"{out}/{setup}-pagecache.txt").read().split()
    tot = {"rss": 0, "pss": 0, "reads": 0, "kib": 0, "tokens": 0}
    for r, m in zip(range(procs), mem.values()):
        o = json.load(open(f"{out}/{setup}-{r}.json"))["overall"]
        t = o["tokens"]
        hit = 100 * o["hit_rate"] if setup != "mmap" else float("nan")
        print(f"{setup:>7} {r:>5} {m['Rss']:>8.0f} {m['Pss']:>8.0f} {hit:>6.1f} {o['storage_reads_per_token']:>9.3f} "
              f"{o['storage_kib_per_token']:>8.2f} {o['p50_us']:>8.0f} {o['p99_us']:>8.0f} {t:>9}")
        tot["rss"] += m["Rss"]; tot["pss"] += m["Pss"]; tot["tokens"] += t
        # every token of the load is looked up by every process: the node's storage per token is
        # the sum of the processes' per-token figures
        tot["reads"] += o["storage_reads_per_token"]; tot["kib"] += o["storage_kib_per_token"]
    print(f"{setup:>7} {'all':>5} {tot['rss']:>8.0f} {tot['pss']:>8.0f} {'':>6} {tot['reads']:>9.3f} "
          f"{tot['kib']:>8.2f} {'':>8} {'':>8} {tot['tokens']:>9}   table page cache "
          f"{int(pc[0]) / 2**20:.0f} MiB, MemAvailable {int(pc[2]) / 1024:.0f} MiB")
EOF
