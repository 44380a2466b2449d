//! Head shards (`crate::shard`) through the pipeline: a shard handle's rows are its heads' rows
//! of the whole ids; the sum of all shards' dequantised outputs is the whole table's output bit
//! for bit (f32, f16, bf16); accumulating every shard into one buffer is the whole table's
//! accumulate, and a shard's accumulate leaves the other heads' columns untouched.

use super::*;
use crate::shard::Shard;
use half::{bf16, f16};

fn shard_handle(dir: &Path, index: u32, count: u32) -> Pipeline {
    open(dir, |o| o.shard = Shard { index, count })
}

/// Dequantises step `seq` of `p` into `out` (`tokens × 2560` elements of `dtype`; f16 and
/// bf16 two to a word).
fn dequant_into(p: &Pipeline, seq: u64, out: &mut [u32], dtype: Dtype, accumulate: bool) {
    let args = OutArgs {
        dtype,
        stride: 2560,
        accumulate,
    };
    // SAFETY: `out` holds the step's tokens × 2560 elements of `dtype` (callers size it so),
    // 4-byte aligned, and nobody else uses it during the call.
    unsafe { p.dequant_cpu(seq, out.as_mut_ptr() as *mut u8, args) }.unwrap();
}

/// An output buffer of `n` elements of `dtype` (n even), each word `fill(i)`.
fn buffer(n: usize, dtype: Dtype, fill: impl Fn(usize) -> u32) -> Vec<u32> {
    (0..n * dtype.size() / 4).map(fill).collect()
}

/// The bytes of element `e`'s .. `e + len`'s of `dtype` in `v`.
fn elems(v: &[u32], dtype: Dtype, e: usize, len: usize) -> Vec<u8> {
    let bytes: Vec<u8> = v.iter().flat_map(|w| w.to_le_bytes()).collect();
    let es = dtype.size();
    bytes[e * es..(e + len) * es].to_vec()
}

/// `a + b` element-wise in `dtype`, as an all-reduce sums (f16 and bf16 through f32, one
/// rounding).
fn add(a: &mut [u32], b: &[u32], dtype: Dtype) {
    let add16 = |x: u16, y: u16| -> u16 {
        match dtype {
            Dtype::F16 => {
                f16::from_f32(f16::from_bits(x).to_f32() + f16::from_bits(y).to_f32()).to_bits()
            }
            _ => {
                bf16::from_f32(bf16::from_bits(x).to_f32() + bf16::from_bits(y).to_f32()).to_bits()
            }
        }
    };
    for (x, &y) in a.iter_mut().zip(b) {
        *x = match dtype {
            Dtype::F32 => (f32::from_bits(*x) + f32::from_bits(y)).to_bits(),
            _ => {
                let lo = add16(*x as u16, y as u16) as u32;
                let hi = add16((*x >> 16) as u16, (y >> 16) as u16) as u32;
                lo | hi << 16
            }
        };
    }
}

#[test]
fn shard_rows_are_the_whole_ids_of_its_heads() {
    let format = RowFormat::Nvfp4;
    let d = make_table(format, 2000);
    let whole = open(d.path(), |_| {});
    let mut rng = Rng(11);
    let b = random_batch(&mut rng, 4, 20);
    let ids = ids_of(&whole, &b);
    let n = b.tokens.len();
    for (index, count) in [(0, 3), (1, 3), (2, 3), (7, 16), (1, 2)] {
        let p = shard_handle(d.path(), index, count);
        let heads = Shard { index, count }.heads(16);
        // round-robin: heads index, index + count, …
        let want_heads: Vec<usize> = (index as usize..16).step_by(count as usize).collect();
        assert_eq!(heads.iter().collect::<Vec<_>>(), want_heads);
        assert_eq!(p.heads(), heads);
        let info = p.table_info();
        assert_eq!(info.shard, Shard { index, count });
        assert_eq!(
            (info.first_head, info.head_stride, info.shard_heads as usize),
            (index, count, want_heads.len())
        );
        // ngram_ids stays the whole table's 16 ids per token
        assert_eq!(ids_of(&p, &b), ids);
        p.submit(&b.view(), 1).unwrap();
        let (ptr, tokens) = p.packed_rows(1).unwrap();
        assert_eq!(tokens as usize, n);
        let rb = format.row_bytes(160);
        // SAFETY: the step is Ready: `tokens × heads × row_bytes` bytes at `ptr` until consumed.
        let rows = unsafe { std::slice::from_raw_parts(ptr, n * heads.len() * rb) };
        for t in 0..n {
            for (j, h) in heads.iter().enumerate() {
                let got = &rows[(t * heads.len() + j) * rb..][..rb];
                let want = synth::expected_row(SEED, format, ids[t * 16 + h] as u64);
                assert_eq!(got, &want[..], "{index}/{count} token {t} head {h}");
            }
        }
        p.release_step(1).unwrap();
        let c = p.counters();
        assert_eq!(c.prefill_rows + c.decode_rows, (n * heads.len()) as u64);
    }
}

#[test]
fn the_sum_of_all_shards_is_the_whole_output_bit_for_bit() {
    for format in [RowFormat::Nvfp4, RowFormat::Fp8, RowFormat::Bf16] {
        let d = make_table(format, 1500);
        let whole = open(d.path(), |_| {});
        let mut rng = Rng(5 + format as u64);
        let b = random_batch(&mut rng, 5, 40);
        let n = b.tokens.len();
        let mut seq = 0;
        for count in [2u32, 3, 4, 5, 16] {
            let shards: Vec<Pipeline> = (0..count)
                .map(|i| shard_handle(d.path(), i, count))
                .collect();
            for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
                seq += 1;
                whole.submit(&b.view(), seq).unwrap();
                let mut want = buffer(n * 2560, dtype, |_| 0x5A5A_5A5A);
                dequant_into(&whole, seq, &mut want, dtype, false);
                // (a full shard sum, in rank order, from buffers that held other values)
                let mut sum: Option<Vec<u32>> = None;
                for p in &shards {
                    p.submit(&b.view(), seq).unwrap();
                    let mut out = buffer(n * 2560, dtype, |i| i as u32);
                    dequant_into(p, seq, &mut out, dtype, false);
                    match &mut sum {
                        None => sum = Some(out),
                        Some(s) => add(s, &out, dtype),
                    }
                }
                let sum = sum.unwrap();
                // (the check is not vacuous: the whole output is not all -0.0 or 0.0)
                assert!(want.iter().filter(|&&w| w & 0x7FFF_7FFF != 0).count() > want.len() / 2);
                assert!(
                    sum == want,
                    "{} {count} shards {}: the sum differs from the whole output",
                    format.name(),
                    dtype.name()
                );
            }
        }
    }
}

#[test]
fn accumulating_every_shard_is_the_whole_accumulate() {
    let format = RowFormat::Nvfp4;
    let d = make_table(format, 1500);
    let whole = open(d.path(), |_| {});
    let mut rng = Rng(77);
    let b = random_batch(&mut rng, 3, 30);
    let n = b.tokens.len();
    let mut seq = 0;
    for count in [3u32, 5, 16] {
        let shards: Vec<Pipeline> = (0..count)
            .map(|i| shard_handle(d.path(), i, count))
            .collect();
        for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            seq += 2;
            // a base of arbitrary bits: -0.0, NaNs and infinities included
            let base = buffer(n * 2560, dtype, |i| splitmix64(i as u64 + seq) as u32);
            let mut want = base.clone();
            whole.submit(&b.view(), seq).unwrap();
            dequant_into(&whole, seq, &mut want, dtype, true);
            let mut got = base.clone();
            for (i, p) in shards.iter().enumerate() {
                p.submit(&b.view(), seq).unwrap();
                dequant_into(p, seq, &mut got, dtype, true);
                // alone: the shard's columns as the whole accumulate's, the others untouched
                let mut alone = base.clone();
                p.submit(&b.view(), seq + 1).unwrap();
                dequant_into(p, seq + 1, &mut alone, dtype, true);
                let heads = Shard::new(i as u32, count).unwrap().heads(16);
                for t in 0..n {
                    for h in 0..16 {
                        let e = t * 2560 + h * 160;
                        let other = if heads.position(h).is_some() {
                            &want
                        } else {
                            &base
                        };
                        assert_eq!(
                            elems(&alone, dtype, e, 160),
                            elems(other, dtype, e, 160),
                            "{count} shards, shard {i}, {} token {t} head {h}",
                            dtype.name()
                        );
                    }
                }
            }
            assert!(
                got == want,
                "{count} shards {}: accumulating every shard differs from the whole accumulate",
                dtype.name()
            );
        }
    }
}

#[test]
fn bad_shard_options_are_invalid_arguments() {
    let d = make_table(RowFormat::Fp8, 1000);
    for (index, count) in [(0, 0), (0, 17), (2, 2), (16, 16)] {
        let o = OpenOptions {
            shard: Shard { index, count },
            ..OpenOptions::default()
        };
        let e = Pipeline::open(d.path(), o).err().expect("refused");
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("options.shard_"), "{e}");
    }
}
