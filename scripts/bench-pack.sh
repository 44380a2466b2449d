#!/usr/bin/env bash
# Benchmarks `ple pack` against `cat` of the same shard files.
#
#   scripts/bench-pack.sh [DIR]        (DIR: scratch directory, default a new one under /tmp)
#
# Generates an NVFP4 checkpoint of >= 4 GiB (ngram_vocab_size_base 3,000,000 -> ~48M rows x 90 B,
# 128 shards in 16 files) with the hidden `ple synth-checkpoint`, then runs, twice and in
# alternating order, each from a cold page cache for its inputs (POSIX_FADV_DONTNEED on every
# file involved, after a sync; the machine-wide drop_caches is left alone):
#   cat  : cat <all safetensors files> > cat.out && sync cat.out
#   pack : /usr/bin/time -v ple pack <ckpt> <out>       (pack fsyncs its output too)
# and prints each run's throughput, the ratio pack/cat (target >= 0.7) and pack's peak RSS
# (target <= 256 MiB). Everything it wrote is deleted at the end.
#
# Env: BASE (default 3000000), SHARDS (128), SHARDS_PER_FILE (8), PLE (path of a built binary),
# MIN_BYTES (smallest checkpoint accepted, default 4 GiB; 0 for a quick smoke run).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${BASE:-3000000}
SHARDS=${SHARDS:-128}
SHARDS_PER_FILE=${SHARDS_PER_FILE:-8}
MIN_BYTES=${MIN_BYTES:-4294967296}

if [[ -z "${PLE:-}" ]]; then
    cargo build --release --bin ple >&2
    PLE=$PWD/target/release/ple
fi
if [[ ! -x /usr/bin/time ]]; then
    echo "bench-pack: /usr/bin/time missing; installing (apt-get install -y time)" >&2
    apt-get install -y time >&2
fi

if [[ $# -ge 1 ]]; then
    mkdir -p "$1"
    WORK=$(mktemp -d "$1/bench-pack.XXXXXX")
else
    WORK=$(mktemp -d /tmp/bench-pack.XXXXXX)
fi
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

CK=$WORK/ckpt
echo "== generating the checkpoint in $CK (base $BASE, $SHARDS shards)" >&2
"$PLE" synth-checkpoint "$CK" --format nvfp4 --base "$BASE" --shards "$SHARDS" \
    --shards-per-file "$SHARDS_PER_FILE" --seed 1 >&2
mapfile -t FILES < <(ls "$CK"/*.safetensors | sort)
CK_BYTES=$(du -cb "${FILES[@]}" | tail -1 | cut -f1)
echo "checkpoint: ${#FILES[@]} files, $CK_BYTES bytes" >&2
if (( CK_BYTES < MIN_BYTES )); then
    echo "bench-pack: checkpoint smaller than 4 GiB; raise BASE" >&2
    exit 1
fi

# Drops the given files' pages from the page cache (clean pages only, hence the sync first).
evict() {
    sync
    python3 - "$@" <<'EOF'
import os, sys
for p in sys.argv[1:]:
    if os.path.isfile(p):
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
EOF
}

now() { date +%s.%N; }

run_cat() {
    rm -f "$WORK/cat.out"
    evict "${FILES[@]}"
    local t0 t1
    t0=$(now)
    cat "${FILES[@]}" > "$WORK/cat.out"
    sync "$WORK/cat.out"
    t1=$(now)
    local secs bytes
    secs=$(echo "$t1 - $t0" | bc -l)
    bytes=$(stat -c %s "$WORK/cat.out")
    rm -f "$WORK/cat.out"
    echo "$bytes $secs"
}

run_pack() {
    rm -rf "$WORK/out"
    evict "${FILES[@]}"
    local t0 t1
    t0=$(now)
    /usr/bin/time -v -o "$WORK/time.txt" "$PLE" pack "$CK" "$WORK/out" > "$WORK/pack.txt" 2>/dev/null
    t1=$(now)
    local secs bytes rss
    secs=$(echo "$t1 - $t0" | bc -l)
    bytes=$(stat -c %s "$WORK/out/table.rows")
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$WORK/time.txt")
    echo "pack: $(cat "$WORK/pack.txt")" >&2
    rm -rf "$WORK/out"
    echo "$bytes $secs $rss"
}

declare -a CAT_MBS PACK_MBS RSS
order=(cat pack pack cat)
for what in "${order[@]}"; do
    if [[ $what == cat ]]; then
        read -r b s < <(run_cat)
        mbs=$(echo "$b / $s / 1000000" | bc -l)
        CAT_MBS+=("$mbs")
        printf 'cat : %d bytes in %.2f s = %.1f MB/s\n' "$b" "$s" "$mbs"
    else
        read -r b s r < <(run_pack)
        mbs=$(echo "$b / $s / 1000000" | bc -l)
        PACK_MBS+=("$mbs")
        RSS+=("$r")
        printf 'pack: %d bytes in %.2f s = %.1f MB/s, peak RSS %d KiB\n' "$b" "$s" "$mbs" "$r"
    fi
done

cat_avg=$(echo "(${CAT_MBS[0]} + ${CAT_MBS[1]}) / 2" | bc -l)
pack_avg=$(echo "(${PACK_MBS[0]} + ${PACK_MBS[1]}) / 2" | bc -l)
ratio=$(echo "$pack_avg / $cat_avg" | bc -l)
max_rss=$(printf '%s\n' "${RSS[@]}" | sort -n | tail -1)
printf '\nresult: cat %.1f MB/s, pack %.1f MB/s, ratio %.2f (target >= 0.70); pack peak RSS %.1f MiB (target <= 256)\n' \
    "$cat_avg" "$pack_avg" "$ratio" "$(echo "$max_rss / 1024" | bc -l)"
