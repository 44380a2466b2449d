#!/usr/bin/env bash
# The side-by-side bench (issue 42, item 4, in part): the test's tiny Qwen4Exp, so the PLE path
# dominates, re-keyed to a generated NVFP4 table of about 16 x BASE rows; stock llama.cpp's lazy path
# with that table in the GGUF as BF16 and as Q4_0 against the fork with --ple-table (test/bench.py).
#   integrations/llama.cpp/bench.sh [OUT]      (default target/llama.cpp-ple; run test.sh first)
# Environment: PLE_BENCH_BASE (default 250000: 4,000,768 rows), PLE_BENCH_THREADS (default 2).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(cd "${1:-$root/target/llama.cpp-ple}" && pwd)
base=${PLE_BENCH_BASE:-250000}
data=$out/bench-data-$base
ple=${PLE_PREFIX:-$out/ple-prefix}/bin/ple
py=$("$root/scripts/torch-venv.sh")
[ -x "$out/build/bin/llama-bench" ] && [ -f "$out/test-data/model.gguf" ] || { echo "bench.sh: run test.sh $out first" >&2; exit 1; }
if [ ! -f "$data/model-q4_0.gguf" ]; then
  mkdir -p "$data"
  "$ple" synth-checkpoint "$data/ckpt" --base "$base" --shards 16 --seed 21 >/dev/null
  "$ple" pack "$data/ckpt" "$data/table" >/dev/null
  "$py" "$here/test/make_bench_gguf.py" "$out/src" "$out/test-data/model.gguf" "$data/table" "$data" >/dev/null
fi
echo "table: $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['total_rows'])" "$data/table/table.json") rows;" \
  "on disk: NVFP4 table.rows $(du -m "$data/table/table.rows" | cut -f1) MiB," \
  "GGUF with BF16 $(du -m "$data/model-bf16.gguf" | cut -f1) MiB, with Q4_0 $(du -m "$data/model-q4_0.gguf" | cut -f1) MiB," \
  "without $(du -m "$data/model-nople.gguf" | cut -f1) MiB"
echo "| run | test | configuration | tokens/s, median (min-max) | read from storage (MiB) | peak RSS (MiB) |"
echo "|---|---|---|---|---|---|"
"$py" "$here/test/bench.py" "$out/build/bin" "$data" "${PLE_BENCH_THREADS:-2}"
