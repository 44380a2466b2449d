#!/usr/bin/env bash
# The side-by-side bench (issue 42, item 4): the test's tiny Qwen4Exp, so the PLE path dominates,
# re-keyed to a generated NVFP4 table of about 16 x BASE rows; stock llama.cpp's lazy path with that
# table in the GGUF as BF16 and as Q4_0 against the fork with --ple-table (MMAP; DIRECT + row cache),
# over the test kit's corpus (test/bench.py, test/bench_driver.cpp), beside fio's storage floor.
#   integrations/llama.cpp/bench.sh [OUT]      (default target/llama.cpp-ple; run test.sh first)
# Environment: PLE_BENCH_BASE (default 2000000: 32,002,176 rows; BF16 GGUF 10.4 GB, Q4_0 and NVFP4
# 2.9 GB each), PLE_BENCH_STOCK (default "bf16 q4_0": stock's GGUFs), PLE_BENCH_THREADS (llama.cpp's compute threads, default 1),
# PLE_BENCH_MODEL (default OUT/test-data/model.gguf: the model whose PLE tensor is replaced; the
# larger one: test/make_model.py SRC PLE OUT big), PLE_BENCH_DATA (default OUT/bench-data-BASE),
# PLE_BENCH_FIO=0 skips fio; bench.py's settings (rounds, memory limit, row cache, warm-up, tests,
# modes: see its doc) pass through. Needs root (memory cgroups; it evicts its own files from the
# page cache).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(cd "${1:-$root/target/llama.cpp-ple}" && pwd)
base=${PLE_BENCH_BASE:-2000000}
model=${PLE_BENCH_MODEL:-$out/test-data/model.gguf}
data=${PLE_BENCH_DATA:-$out/bench-data-$base}
ple=${PLE_PREFIX:-$out/ple-prefix}/bin/ple
py=$("$root/scripts/torch-venv.sh")
bin=$out/build/bin
[ -f "$bin/libllama.so" ] || { echo "bench.sh: run test.sh $out first" >&2; exit 1; }
if [ ! -f "$data/table/table.json" ]; then
  mkdir -p "$data"
  "$ple" synth-checkpoint "$data/ckpt" --base "$base" --shards 16 --seed 21 >/dev/null
  "$ple" pack "$data/ckpt" "$data/table" >/dev/null
  rm -rf "$data/ckpt"
fi
kinds="${PLE_BENCH_STOCK:-bf16 q4_0} nople"
for k in $kinds; do
  [ -f "$data/model-$k.gguf" ] || [ -f "$model" ] || { echo "bench.sh: $model missing (run test.sh $out first)" >&2; exit 1; }
done
for k in $kinds; do # one process each, two at a time: the encoding is CPU-bound
  [ -f "$data/model-$k.gguf" ] || "$py" "$here/test/make_bench_gguf.py" "$out/src" "$model" "$data/table" "$data" "$k" >/dev/null &
  if [ "$k" = q4_0 ]; then wait; fi
done
wait
for k in $kinds; do [ -f "$data/model-$k.gguf" ] || { echo "bench.sh: making model-$k.gguf failed" >&2; exit 1; }; done

drv=$bin/ple-bench-driver
if [ ! -x "$drv" ] || [ "$here/test/bench_driver.cpp" -nt "$drv" ] || [ "$bin/libllama.so" -nt "$drv" ]; then
  "${CXX:-c++}" -O2 -std=c++17 -Wall -Werror -I "$out/src/include" -I "$out/src/ggml/include" "$here/test/bench_driver.cpp" \
    -L "$bin" -lllama -lggml -lggml-base -Wl,-rpath,"$bin" -o "$drv"
fi
meta() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))$1)" "$data/table/table.json"; }
tokens=$data/corpus.i32 # the test kit's corpus stream: 16 x 2,048 warm-up tokens and what follows
[ -f "$tokens" ] || (cd "$root" && cargo run -q --release -p ple-testkit --example corpus_tokens -- \
  "$(meta "['hash']['vocab_size']")" "$(meta "['hash']['eos_token_id']")" 7 200000 "$tokens")

echo "table: $(meta "['total_rows']") rows; on disk: NVFP4 table.rows $(du -m "$data/table/table.rows" | cut -f1) MiB;" \
  "GGUF $(for k in $kinds; do echo -n "$k $(du -m "$data/model-$k.gguf" | cut -f1) MiB, "; done)"
if [ "${PLE_BENCH_FIO:-1}" = 1 ] && command -v fio >/dev/null; then
  # the storage floor of each configuration's reads, on its own file: libple DIRECT's (512 B
  # sectors, io_uring at its depth 128), stock's page faults (4 KiB, synchronous, one per gather
  # thread), and the device's 4 KiB ceiling (QD 128)
  floor() { # name file bs engine depth jobs
    fio --name=floor --readonly --direct=1 --rw=randread --filename="$2" --bs="$3" --ioengine="$4" \
      --iodepth="$5" --numjobs="$6" --group_reporting --runtime=5 --time_based --output-format=json 2>/dev/null |
      python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['read']; \
print(f\"fio $1: {j['iops']:,.0f} IOPS, {j['bw_bytes']/2**20:.1f} MiB/s, mean latency {j['lat_ns']['mean']/1e3:.0f} us\")"
  }
  floor "512 B random reads, io_uring QD128 (table.rows: libple DIRECT)" "$data/table/table.rows" 512 io_uring 128 1
  floor "4 KiB random reads, sync, ${PLE_BENCH_THREADS:-1} jobs (model-bf16.gguf: stock's page faults)" \
    "$data/model-bf16.gguf" 4k psync 1 "${PLE_BENCH_THREADS:-1}"
  floor "4 KiB random reads, io_uring QD128 (model-bf16.gguf)" "$data/model-bf16.gguf" 4k io_uring 128 1
fi
"$py" "$here/test/bench.py" "$bin" "$data" "${PLE_BENCH_THREADS:-1}" "$tokens"
