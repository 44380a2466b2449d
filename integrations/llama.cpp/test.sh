#!/usr/bin/env bash
# Fidelity test of the libple fork of llama.cpp: stock llama.cpp's own PLE path (the GGUF's
# per_layer_token_embd gathered by ggml_get_rows) against --ple-table (libple's rows), same binary.
#   integrations/llama.cpp/test.sh [OUT]        (default target/llama.cpp-ple; builds with build.sh)
# The model: a tiny random Qwen4ExpForCausalLM (transformers) whose n-gram weight holds exactly the
# rows of a generated NVFP4 checkpoint, converted by the tree's convert_hf_to_gguf.py to an F32 GGUF;
# the table: the same checkpoint packed by `ple pack` (test/make_model.py; cached in OUT/test-data).
# The driver (test/fidelity.cpp) prints a hash of every logit row of a fixed script: 3 sequences in
# one batch, n_ubatch 8 < the prompts, EOS inside the prompts, 32 greedy decode steps, a rollback
# (llama_memory_seq_rm) and re-decode; F32 KV cache, 2 threads. Checks:
#   1. --ple-table gives bit-identical logits (row ids checked against llama.cpp's; MMAP and DIRECT),
#      the prompt batch's rows read ahead (libple's read-ahead counters)
#   2. ... also from the GGUF without per_layer_token_embd, which stock llama.cpp refuses
#   3. a table of another checkpoint (other head sizes) is refused at load, naming the field
#   4. a table with the same hash but other rows loads and changes the logits (the test can fail)
#   5. a table truncated after the load makes llama_decode return an error; the process goes on
#   6. llama-completion --ple-table (and LLAMA_ARG_PLE_TABLE) generates the same text as stock
#   7. `ple pack MODEL.gguf` of the converter's F32 / F16 / BF16 GGUFs gives the checkpoint's rows
#      (test/gguf_pack.py); its Q8_0 GGUF and a truncated GGUF are refused, leaving no table
# Needs the torch venv (scripts/torch-venv.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/target/llama.cpp-ple}
build=$("$here/build.sh" "$out")
out=$(cd "$out" && pwd)
bin=$build/bin
ple=${PLE_PREFIX:-$out/ple-prefix}/bin/ple
py=$("$root/scripts/torch-venv.sh")
data=$out/test-data

# the model and tables (rebuilt when make_model.py or the ple tool changes)
stamp=$(cat "$here/test/make_model.py" "$here/test/convert.py" "$ple" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$data/.stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$data"
  "$py" "$here/test/make_model.py" "$out/src" "$ple" "$data" > "$out/make_model.log" 2>&1 ||
    { tail -n 30 "$out/make_model.log" >&2; exit 1; }
  "$ple" synth-checkpoint "$data/ckpt-rows" --base 2000 --shards 4 --seed 12 >/dev/null
  "$ple" pack "$data/ckpt-rows" "$data/table-rows" >/dev/null
  echo "$stamp" > "$data/.stamp"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ple-llama-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "llama.cpp test: FAIL: $*" >&2; exit 1; }
drive() { # name model [args...]: runs the driver, stdout to $work/name.txt, stderr to $work/name.err
  local name=$1; shift
  set +e; "$bin/ple-fidelity" "$@" > "$work/$name.txt" 2> "$work/$name.err"; local rc=$?; set -e
  echo "$rc"
}
same() { # name: its logits equal stock's
  cmp -s "$work/stock.txt" "$work/$1.txt" || { diff "$work/stock.txt" "$work/$1.txt" | head -n 5 >&2; fail "$1: logits differ from stock llama.cpp"; }
}

rc=$(drive stock "$data/model.gguf")
[ "$rc" = 0 ] || { tail -n 20 "$work/stock.err" >&2; fail "stock llama.cpp run failed ($rc)"; }
rows=$(grep -c ': [0-9a-f]\{16\}$' "$work/stock.txt")
[ "$rows" = 173 ] || fail "stock run printed $rows logit rows, expected 173"
[ "$(awk '{print $NF}' "$work/stock.txt" | sort -u | wc -l)" -gt 150 ] || fail "stock logit rows are not distinct"
echo "llama.cpp test: stock llama.cpp: $rows logit rows (prompts of 3 sequences, 32 decode steps, rollback, re-decode, fork)"

rc=$(LLAMA_PLE_CHECK_IDS=1 LLAMA_PLE_IO=mmap drive ple-mmap "$data/model.gguf" --ple-table "$data/table")
[ "$rc" = 0 ] || { tail -n 20 "$work/ple-mmap.err" >&2; fail "--ple-table run failed ($rc)"; }
grep -q "row ids checked against llama.cpp's" "$work/ple-mmap.err" || fail "the row id check was not on"
grep -q "unused tensor per_layer_token_embd.weight" "$work/ple-mmap.err" || fail "per_layer_token_embd was not skipped"
same ple-mmap
rc=$(LLAMA_PLE_IO=direct drive ple-direct "$data/model.gguf" --ple-table "$data/table")
[ "$rc" = 0 ] || { tail -n 20 "$work/ple-direct.err" >&2; fail "--ple-table (DIRECT) run failed ($rc)"; }
grep -q "direct (.*) I/O" "$work/ple-direct.err" || fail "LLAMA_PLE_IO=direct did not open DIRECT"
same ple-direct
ahead=$(grep -o "libple read-ahead: [0-9]* rows asked" "$work/ple-direct.err" | grep -o "[0-9]*" || true)
[ "${ahead:-0}" -ge 800 ] || fail "the prompt batch's rows were not read ahead (${ahead:-no} rows asked, expected >= 800)"
# every decode step's batch fits one ubatch: submitted at llama_decode entry and taken, but the
# fork's, whose predecessors changed under it (released, and the ubatch's own step read)
early=$(grep -o "submitted at llama_decode entry: [0-9]* used, [0-9]* dropped" "$work/ple-direct.err" || true)
used=$(echo "$early" | grep -o "[0-9]* used" | grep -o "[0-9]*" || true)
dropped=$(echo "$early" | grep -o "[0-9]* dropped" | grep -o "[0-9]*" || true)
[ "${used:-0}" -ge 41 ] && [ "${dropped:-0}" -ge 1 ] ||
  fail "steps submitted at llama_decode entry: ${used:-no} used (expected >= 41), ${dropped:-no} dropped (expected >= 1: the fork)"
echo "llama.cpp test: --ple-table: logits bit-identical to stock (MMAP with row ids checked, DIRECT; $ahead rows read ahead; $used steps submitted at llama_decode entry, $dropped released)"

rc=$(drive stripped-stock "$data/model-nople.gguf")
[ "$rc" = 2 ] && grep -q "per_layer_token_embd.weight' not found" "$work/stripped-stock.err" ||
  fail "stock llama.cpp loaded the GGUF without per_layer_token_embd ($rc)"
rc=$(drive stripped "$data/model-nople.gguf" --ple-table "$data/table")
[ "$rc" = 0 ] || { tail -n 20 "$work/stripped.err" >&2; fail "--ple-table on the stripped GGUF failed ($rc)"; }
same stripped
echo "llama.cpp test: GGUF without per_layer_token_embd ($(du -h "$data/model-nople.gguf" | cut -f1) vs $(du -h "$data/model.gguf" | cut -f1)): bit-identical too"

rc=$(drive other "$data/model.gguf" --ple-table "$data/table-other")
msg=$(grep -o "libple table .* does not fit the model: .*" "$work/other.err" || true)
[ "$rc" = 2 ] && [[ "$msg" == *"hash.head_sizes[0] is 1009 in the table but 2003 in the GGUF"* ]] ||
  fail "a table of another checkpoint was not refused by name ($rc): $msg"
echo "llama.cpp test: another checkpoint's table refused: $msg"

rc=$(drive rows "$data/model.gguf" --ple-table "$data/table-rows")
[ "$rc" = 0 ] || fail "a table with the same hash did not load ($rc)"
! cmp -s "$work/stock.txt" "$work/rows.txt" || fail "other rows gave the same logits: the test cannot see the PLE rows"
echo "llama.cpp test: a table with the same hash but other rows changes the logits"

for io in mmap direct; do
  rm -rf "$work/broken" && cp -r "$data/table" "$work/broken"
  rc=$(LLAMA_PLE_IO=$io drive broken-$io "$data/model.gguf" --ple-table "$work/broken" --break-table)
  [ "$rc" = 0 ] && grep -q "llama_decode returned -3" "$work/broken-$io.txt" &&
    grep -q "libple: ple_dequant_cpu failed: I/O error" "$work/broken-$io.err" ||
    { tail -n 5 "$work/broken-$io.err" >&2; fail "a truncated table ($io) did not fail llama_decode cleanly ($rc)"; }
done
echo "llama.cpp test: a table truncated after load: llama_decode returns -3 with libple's message (MMAP, DIRECT)"

gen() { "$bin/llama-completion" -m "$data/model.gguf" -p "Hello world, the" -n 16 --temp 0 -t 2 -no-cnv \
          --no-warmup -ctk f32 -ctv f32 "$@" 2>"$work/gen.err" < /dev/null; }
a=$(gen) || { tail -n 5 "$work/gen.err" >&2; fail "llama-completion (stock) failed"; }
b=$(gen --ple-table "$data/table") || { tail -n 5 "$work/gen.err" >&2; fail "llama-completion --ple-table failed"; }
c=$(LLAMA_ARG_PLE_TABLE=$data/table gen) || fail "llama-completion with LLAMA_ARG_PLE_TABLE failed"
grep -q "unused tensor per_layer_token_embd.weight" "$work/gen.err" || fail "LLAMA_ARG_PLE_TABLE was not used"
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] || fail "llama-completion: --ple-table generated other text"
echo "llama.cpp test: llama-completion --ple-table / LLAMA_ARG_PLE_TABLE: the same 16 greedy tokens as stock"
"$py" "$here/test/gguf_pack.py" "$out/src" "$ple" "$data" "$work/gguf-pack" > "$work/gguf_pack.log" 2>&1 ||
  { tail -n 20 "$work/gguf_pack.log" >&2; fail "ple pack MODEL.gguf"; }
grep "^gguf_pack: " "$work/gguf_pack.log" | sed 's/^gguf_pack/llama.cpp test: ple pack GGUF/'
echo "llama.cpp test: OK"
