#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for a fixed time: `scripts/fuzz.sh [seconds per target] [target...]`
# (default 60 s, all targets). Not part of CI (scripts/test.sh builds and smoke-runs the stable
# driver only).
#
# With a nightly toolchain (`rustup toolchain list`), the targets are libFuzzer binaries built with
# sanitizer coverage and AddressSanitizer, exactly as `cargo fuzz build` builds them (cargo-fuzz
# itself is used when installed; otherwise the same flags are passed here). Without nightly, the
# same target bodies run under the stable driver `fuzz-stable` (a seeded mutator without coverage
# feedback). Either way: seed corpora are written to fuzz/corpus/<target>/, crashes to
# fuzz/artifacts/<target>/ (both ignored by git), and the script exits non-zero on a crash.
# Overflow checks and debug assertions are on in both builds (fuzz/Cargo.toml).
#
# Environment: PLE_FUZZ_ENGINE=libfuzzer|stable forces an engine; PLE_FUZZ_SEED (stable, default 1);
# PLE_FUZZ_JOBS (libFuzzer -fork, default 1).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs="${1:-60}"
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    targets=(safetensors_header checkpoint_dir table_json python_table_json batch_context)
fi

engine="${PLE_FUZZ_ENGINE:-}"
if [[ -z "$engine" ]]; then
    if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then engine=libfuzzer; else engine=stable; fi
fi
host=$(rustc -vV | sed -n 's/^host: //p')

# Seed corpora (valid files from the test kit and hand-written edge cases).
cargo build --release --quiet --bin fuzz-stable
./target/release/fuzz-stable --seeds corpus

status=0
if [[ "$engine" == libfuzzer ]]; then
    if cargo +nightly fuzz --version >/dev/null 2>&1; then
        cargo +nightly fuzz build --release --features libfuzzer
    else
        # The flags `cargo fuzz build` passes (cargo-fuzz 0.12, ASan, inline 8-bit counters).
        RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Zsanitizer=address \
-Cforce-frame-pointers -Cdebug-assertions -Coverflow-checks" \
            cargo +nightly build --release --features libfuzzer --target "$host" \
            --target-dir target/libfuzzer --bins
    fi
    fork=()
    if [[ "${PLE_FUZZ_JOBS:-1}" -gt 1 ]]; then fork=(-fork="$PLE_FUZZ_JOBS"); fi
    bin="target/libfuzzer/$host/release"
    [[ -d "$bin" ]] || bin="target/$host/release"
    for t in "${targets[@]}"; do
        mkdir -p "artifacts/$t"
        log="artifacts/$t/last-run.log"
        echo "fuzz: $t (libFuzzer, ${secs} s)"
        if ! "$bin/$t" "corpus/$t" -max_total_time="$secs" -max_len=65536 -timeout=20 \
            -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="artifacts/$t/" \
            "${fork[@]}" >"$log" 2>&1; then
            echo "fuzz: $t: CRASH (see $log and artifacts/$t/)"
            status=1
        fi
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
        echo "fuzz: $t: ${runs:-?} executions, $cov, corpus $(ls "corpus/$t" | wc -l) inputs"
    done
else
    for t in "${targets[@]}"; do
        ./target/release/fuzz-stable --target "$t" --seconds "$secs" --seed "${PLE_FUZZ_SEED:-1}" || status=1
    done
fi
exit $status
