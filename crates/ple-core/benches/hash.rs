//! Hashing throughput for one 2,048-token prefill chunk (16 ids per token), tokens/s:
//! the library's path (Barrett `FastMod`) against the same loop with the plain `%` operator and
//! with Lemire's 128-bit fastmod, plus the context resolution that precedes hashing.
//!
//! `cargo bench --bench hash` (add `-- --quick` for a short run). All three loops have the
//! library's shape (two unrolled groups of 8 heads), so only the remainder differs.
#![allow(
    clippy::needless_range_loop,
    reason = "index loops mirror the reference hash"
)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ple_core::lookup::context::{Batch, Tracker, compute_ids, resolve_contexts};
use ple_core::lookup::hash::Hasher;
use ple_core::model::{EOS_TOKEN_ID, HashParams, ModelConfig, VOCAB_SIZE, splitmix64};
use std::hint::black_box;

const CHUNK: usize = 2048;

/// The shipped model's hash with the `%` operator, in the same shape as the library's fast loop.
struct PlainRem {
    m: [u64; 3],
    sizes: [u64; 16],
    offsets: [u64; 16],
}

impl PlainRem {
    fn new(p: &HashParams) -> PlainRem {
        PlainRem {
            m: p.multipliers[..].try_into().unwrap(),
            sizes: p.head_sizes[..].try_into().unwrap(),
            offsets: p.offsets[..].try_into().unwrap(),
        }
    }

    fn ids_for_tokens(&self, tokens: &[i32], ctx: &[i32], out: &mut [u64]) {
        for ((&t, c), o) in tokens
            .iter()
            .zip(ctx.chunks_exact(2))
            .zip(out.chunks_exact_mut(16))
        {
            let b = (t as u64).wrapping_mul(self.m[0]) ^ (c[0] as u64).wrapping_mul(self.m[1]);
            let c3 = b ^ (c[1] as u64).wrapping_mul(self.m[2]);
            for h in 0..8 {
                o[h] = b % self.sizes[h] + self.offsets[h];
            }
            for h in 8..16 {
                o[h] = c3 % self.sizes[h] + self.offsets[h];
            }
        }
    }
}

/// Lemire, Kaser, Kurz "fastmod" (128-bit reciprocal, exact for all 64-bit operands), same loop.
struct Lemire {
    m: [u64; 3],
    rec: [(u128, u64); 16],
    offsets: [u64; 16],
}

impl Lemire {
    fn new(p: &HashParams) -> Lemire {
        let mut rec = [(0u128, 0u64); 16];
        for (r, &d) in rec.iter_mut().zip(&p.head_sizes) {
            *r = ((u128::MAX / d as u128).wrapping_add(1), d);
        }
        Lemire {
            m: p.multipliers[..].try_into().unwrap(),
            rec,
            offsets: p.offsets[..].try_into().unwrap(),
        }
    }

    #[inline(always)]
    fn rem((m, d): (u128, u64), a: u64) -> u64 {
        let low = m.wrapping_mul(a as u128);
        let d = d as u128;
        let bottom = ((low as u64) as u128 * d) >> 64;
        ((bottom + (low >> 64) * d) >> 64) as u64
    }

    fn ids_for_tokens(&self, tokens: &[i32], ctx: &[i32], out: &mut [u64]) {
        for ((&t, c), o) in tokens
            .iter()
            .zip(ctx.chunks_exact(2))
            .zip(out.chunks_exact_mut(16))
        {
            let b = (t as u64).wrapping_mul(self.m[0]) ^ (c[0] as u64).wrapping_mul(self.m[1]);
            let c3 = b ^ (c[1] as u64).wrapping_mul(self.m[2]);
            for h in 0..8 {
                o[h] = Self::rem(self.rec[h], b) + self.offsets[h];
            }
            for h in 8..16 {
                o[h] = Self::rem(self.rec[h], c3) + self.offsets[h];
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    let params = HashParams::derive(&ModelConfig::default());
    let h = Hasher::new(&params).unwrap();
    let plain = PlainRem::new(&params);
    let lemire = Lemire::new(&params);
    // A prefill chunk with EOS now and then.
    let tokens: Vec<i32> = (0..CHUNK as u64)
        .map(|i| {
            let r = splitmix64(i);
            if r % 97 == 0 {
                EOS_TOKEN_ID
            } else {
                (r % VOCAB_SIZE as u64) as i32
            }
        })
        .collect();
    let positions: Vec<i32> = (0..CHUNK as i32).collect();
    let ids = [1u64];
    let qs = [0u32, CHUNK as u32];
    let batch = Batch {
        tokens: &tokens,
        positions: &positions,
        request_ids: &ids,
        query_start: &qs,
        context: None,
    };
    let tracker = Tracker::new(3, EOS_TOKEN_ID, 64).unwrap();
    let ctx = resolve_contexts(&batch, Some(&tracker), EOS_TOKEN_ID, 3).unwrap();
    let mut out = vec![0u64; CHUNK * 16];
    let mut check = vec![0u64; CHUNK * 16];
    compute_ids(&h, &batch, &ctx, &mut out);
    plain.ids_for_tokens(&tokens, &ctx, &mut check);
    assert_eq!(out, check, "fastmod and plain % disagree");
    lemire.ids_for_tokens(&tokens, &ctx, &mut check);
    assert_eq!(out, check, "fastmod and Lemire's fastmod disagree");

    let mut g = c.benchmark_group("hash_2048_tokens");
    g.throughput(Throughput::Elements(CHUNK as u64));
    g.bench_function("fastmod", |b| {
        b.iter(|| h.ids_for_tokens(black_box(&tokens), black_box(&ctx), black_box(&mut out)))
    });
    g.bench_function("plain_rem", |b| {
        b.iter(|| plain.ids_for_tokens(black_box(&tokens), black_box(&ctx), black_box(&mut out)))
    });
    g.bench_function("lemire_fastmod", |b| {
        b.iter(|| lemire.ids_for_tokens(black_box(&tokens), black_box(&ctx), black_box(&mut out)))
    });
    g.bench_function("reference_generic_rem", |b| {
        b.iter(|| {
            h.ids_for_tokens_reference(black_box(&tokens), black_box(&ctx), black_box(&mut out))
        })
    });
    g.bench_function("resolve_contexts", |b| {
        b.iter(|| resolve_contexts(black_box(&batch), Some(&tracker), EOS_TOKEN_ID, 3).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
