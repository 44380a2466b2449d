//! CPU dequantisation throughput of the shipped geometry (16 heads of 160) and of two others
//! (12 × 128, 16 × 64): one 2,048-token step of random rows per row format, into f32 and bf16,
//! on the calling thread (no pool), ns per token (the fastest of `PLE_BENCH_REPS` runs, default
//! 20). `cargo bench -p ple-core --bench dequant`; under callgrind `PLE_BENCH_REPS=1`,
//! `PLE_BENCH_SHIPPED_ONLY=1` and `PLE_BENCH_FORMAT=nvfp4` keep the count to one run of the
//! shipped geometry in one format, and `--toggle-collect='*timed_step*'` to the library's code.

use half::bf16;
use ple_core::dequant::{Out, dequant_rows};
use ple_core::model::{RowFormat, RowSpec, splitmix64};
use std::hint::black_box;
use std::time::Instant;

const TOKENS: usize = 2048;

/// One step's dequantisation, a function of its own: `valgrind --tool=callgrind
/// --toggle-collect='*timed_step*'` counts the library's instructions only.
#[inline(never)]
fn timed_step(spec: &RowSpec, rows: &[u8], out: Out<'_>, dim: usize) {
    dequant_rows(spec, rows, TOKENS, out, dim, false, None).unwrap();
}

fn main() {
    let reps: usize = std::env::var("PLE_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let shipped_only = std::env::var_os("PLE_BENCH_SHIPPED_ONLY").is_some();
    // one row format only (`nvfp4`, `fp8`, `bf16`, `f32`), e.g. for a callgrind count per format
    let only = std::env::var("PLE_BENCH_FORMAT").ok();
    let geometries: &[(usize, usize)] = if shipped_only {
        &[(16, 160)]
    } else {
        &[(16, 160), (12, 128), (16, 64)]
    };
    for &(heads, hd) in geometries {
        for format in [
            RowFormat::Nvfp4,
            RowFormat::Fp8,
            RowFormat::Bf16,
            RowFormat::F32,
        ] {
            if only.as_deref().is_some_and(|f| f != format.name()) {
                continue;
            }
            let spec = RowSpec {
                format,
                global_scale: 0.015625,
                num_heads: heads,
                head_dim: hd,
            };
            let scale = if matches!(format, RowFormat::Bf16 | RowFormat::F32) {
                1.0
            } else {
                spec.global_scale
            };
            let spec = RowSpec {
                global_scale: scale,
                ..spec
            };
            let dim = spec.embed_dim();
            let mut x = 7u64;
            let rows: Vec<u8> = (0..TOKENS * heads * spec.row_bytes())
                .map(|_| {
                    x = splitmix64(x);
                    // finite values in every format: no NaN bytes, small bf16/f32 exponents
                    (x as u8) & 0x3F
                })
                .collect();
            let mut o32 = vec![0f32; TOKENS * dim];
            let mut o16 = vec![bf16::ZERO; TOKENS * dim];
            for (name, f32_out) in [("f32", true), ("bf16", false)] {
                let mut best = f64::MAX;
                for _ in 0..reps {
                    let t = Instant::now();
                    let out = if f32_out {
                        Out::F32(&mut o32)
                    } else {
                        Out::Bf16(&mut o16)
                    };
                    timed_step(&spec, black_box(&rows), out, dim);
                    best = best.min(t.elapsed().as_secs_f64());
                }
                black_box((&o32, &o16));
                println!(
                    "dequant {heads:>2} x {hd:>3} {:>5} -> {name:<4}: {:8.1} ns/token",
                    format.name(),
                    best * 1e9 / TOKENS as f64
                );
            }
        }
    }
}
