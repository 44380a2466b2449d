//! Tables of other geometries than the shipped 16 × 160 through the whole pipeline: the rows a
//! step stages are the generated rows (`synth::expected_row_of`) of the ids the plain-`%` hash
//! (`Hasher::ids_reference`) gives for each token's context; the ids path stages the same rows
//! and writes the same output as the token path; the output is the rows decoded one by one
//! (`Dequantizer::row_f32`); head shards of the table serve their heads; a shard count above
//! the table's heads is refused.

use super::*;
use crate::lookup::hash::Hasher;
use crate::model::{HashParams, ModelConfig};
use crate::shard::Shard;

/// (format, ngram_size, heads_per_ngram, head_dim)
const SHAPES: [(RowFormat, u32, u32, usize); 6] = [
    (RowFormat::Nvfp4, 4, 4, 128), // 12 heads of 128
    (RowFormat::Fp8, 2, 16, 64),   // 16 heads of 64
    (RowFormat::Bf16, 4, 4, 128),
    (RowFormat::Nvfp4, 2, 5, 48), // rows of 27 bytes
    (RowFormat::F32, 3, 2, 7),    // a head dim no block divides
    (RowFormat::Fp8, 3, 8, 160),  // the shipped geometry, as a control
];

fn config(ngram_size: u32, heads_per_ngram: u32, head_dim: usize) -> ModelConfig {
    let heads = (ngram_size - 1) * heads_per_ngram;
    ModelConfig {
        ngram_size,
        heads_per_ngram,
        ple_embed_dim: heads * head_dim as u32,
        ..synth::small_config(700, 3)
    }
}

/// One-token requests with stateless context (oldest first, no EOS): each token's context is
/// its request's, so the expected ids need no context resolution.
fn batch(rng: &mut Rng, n: usize, k: usize) -> (B, Vec<Vec<i32>>) {
    let mut reqs = Vec::new();
    let (mut ctx, mut per_token) = (Vec::new(), Vec::new());
    for r in 0..n {
        let tok = rng.below(200_000) as i32;
        reqs.push((r as u64 + 1, 5, vec![tok]));
        let c: Vec<i32> = (0..k).map(|_| rng.below(200_000) as i32).collect();
        ctx.extend_from_slice(&c);
        // the hash takes ctx_1 (the newest) first
        per_token.push(c.into_iter().rev().collect());
    }
    (B::new(&reqs, Some(ctx)), per_token)
}

#[test]
fn other_geometries_serve_the_rows_of_their_hash_and_decode_them() {
    let mut rng = Rng(77);
    for (format, ngram, hpn, hd) in SHAPES {
        let cfg = config(ngram, hpn, hd);
        let d = tempfile::tempdir().unwrap();
        synth::write_table(d.path(), format, &cfg, SEED).unwrap();
        let heads = cfg.num_heads();
        let dim = heads * hd;
        let hasher = Hasher::new(&HashParams::derive(&cfg)).unwrap();
        let what = format!("{format:?} ngram {ngram} × {hpn} heads of {hd}");
        for shard in [Shard::WHOLE, Shard { index: 1, count: 3 }] {
            let p = open(d.path(), |o| o.shard = shard);
            let info = p.table_info();
            assert_eq!(
                (info.num_heads as usize, info.head_dim as usize),
                (heads, hd)
            );
            assert_eq!((info.ngram_size, info.heads_per_ngram), (ngram, hpn));
            let (b, ctx) = batch(&mut rng, 9, ngram as usize - 1);
            let n = b.tokens.len();
            // the ids: the plain-% hash of every token's context
            let mut want_ids = vec![0u64; n * heads];
            for (t, c) in ctx.iter().enumerate() {
                hasher.ids_reference(b.tokens[t], c, &mut want_ids[t * heads..(t + 1) * heads]);
            }
            let mut ids = vec![0i64; n * heads];
            p.ngram_ids(&b.view(), &mut ids).unwrap();
            assert!(
                ids.iter().zip(&want_ids).all(|(&a, &b)| a as u64 == b),
                "{what}"
            );
            let sh = p.heads();
            let rb = format.row_bytes(hd);
            let mut outs = Vec::new();
            for (seq, by_ids) in [(1u64, false), (2, true)] {
                if by_ids {
                    p.submit_ids(&ids, false, seq).unwrap();
                } else {
                    p.submit(&b.view(), seq).unwrap();
                }
                let (ptr, got_n) = p.packed_rows(seq).unwrap();
                assert_eq!(got_n as usize, n);
                // SAFETY: the step is Ready: `tokens × heads × row_bytes` bytes at `ptr` until consumed.
                let rows = unsafe { std::slice::from_raw_parts(ptr, n * sh.len() * rb) };
                for (i, row) in rows.chunks(rb).enumerate() {
                    let (t, j) = (i / sh.len(), i % sh.len());
                    let id = want_ids[t * heads + sh.get(j)];
                    let want = synth::expected_row_of(SEED, format, hd, id);
                    assert_eq!(
                        row,
                        &want[..],
                        "{what} {shard:?} token {t} row {j} ids {by_ids}"
                    );
                }
                let stride = dim + 5;
                let mut out = vec![7f32; (n - 1) * stride + dim];
                // too short a stride for this table is refused, and the step stays
                // SAFETY: refused for its stride before anything is written.
                let e = unsafe { p.dequant_cpu(seq, out.as_mut_ptr().cast(), f32_out(dim - 1)) };
                assert_eq!(e.unwrap_err().kind(), crate::ErrorKind::InvalidArgument);
                // SAFETY: `out` holds the step's tokens at `stride` f32 apart, used by nobody else.
                unsafe { p.dequant_cpu(seq, out.as_mut_ptr().cast(), f32_out(stride)) }.unwrap();
                outs.push(out);
            }
            assert!(
                outs[0]
                    .iter()
                    .zip(&outs[1])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what} {shard:?}: the ids path's output differs from the token path's"
            );
            // the output: each row decoded on its own; other shards' heads -0.0
            let dq = dequant::Dequantizer::new(format, synth::global_scale(format), hd);
            let mut want = vec![0f32; hd];
            let stride = dim + 5;
            for t in 0..n {
                for h in 0..heads {
                    let got = &outs[0][t * stride + h * hd..t * stride + (h + 1) * hd];
                    if sh.position(h).is_some() {
                        let row = synth::expected_row_of(SEED, format, hd, want_ids[t * heads + h]);
                        dq.row_f32(&row, &mut want);
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{what} {shard:?} token {t} head {h}");
                    } else {
                        assert!(got.iter().all(|x| x.to_bits() == (-0.0f32).to_bits()));
                    }
                }
                if t + 1 < n {
                    assert!(
                        outs[0][t * stride + dim..(t + 1) * stride]
                            .iter()
                            .all(|&x| x == 7.0)
                    );
                }
            }
        }
    }
}

#[test]
fn a_shard_count_above_the_tables_heads_is_refused() {
    let d = tempfile::tempdir().unwrap();
    // 2 heads (n-gram 3 × 1) of 16
    synth::write_table(d.path(), RowFormat::Fp8, &config(3, 1, 16), SEED).unwrap();
    let r = Pipeline::open(
        d.path(),
        OpenOptions {
            shard: Shard { index: 0, count: 3 },
            ..OpenOptions::default()
        },
    );
    let e = r.err().expect("3 shards of 2 heads opened");
    assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("2 heads"), "{e}");
}

#[test]
fn a_table_is_checked_against_the_config_it_is_opened_with() {
    let d = tempfile::tempdir().unwrap();
    let table = d.path().join("table");
    let cfg = config(4, 4, 128);
    synth::write_table(&table, RowFormat::Fp8, &cfg, SEED).unwrap();
    let open_with = |c: &ModelConfig| {
        let path = d.path().join("config.json");
        std::fs::write(&path, serde_json::to_vec(c).unwrap()).unwrap();
        Pipeline::open(
            &table,
            OpenOptions {
                config_json_path: Some(path),
                ..OpenOptions::default()
            },
        )
    };
    // the model's own config: opens
    open_with(&cfg).unwrap();
    // another geometry, layer or hash: refused, naming the field and both values
    for (other, field) in [
        (config(2, 16, 64), "ngram_size is 4 in the table but 2"),
        (config(4, 3, 128), "heads_per_ngram is 4 in the table but 3"),
        (config(4, 4, 64), "head_dim is 128 in the table but 64"),
        (
            ModelConfig {
                ple_layer_index: 1,
                ..cfg.clone()
            },
            "ple_layer_index is 0 in the table but 1",
        ),
        (
            ModelConfig {
                seed: 7,
                ..cfg.clone()
            },
            "hash.multipliers",
        ),
        (
            ModelConfig {
                ngram_vocab_size_base: 900,
                ..cfg.clone()
            },
            "hash.head_sizes",
        ),
    ] {
        let e = open_with(&other)
            .err()
            .expect("a table of another model opened");
        assert_eq!(e.kind(), crate::ErrorKind::Format, "{e}");
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
}
