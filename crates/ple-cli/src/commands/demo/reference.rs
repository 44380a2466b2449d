//! The demo's independent oracle: the n-gram hash rule and the row decoding written out plainly,
//! separately from the library's implementation.

use ple_core::model::{HashParams, RowFormat};

/// The row ids of token `pos` of `seq` by the hash rule, written out plainly: context with the EOS cut, mixes, plain `%`.
pub(super) fn reference_ids(p: &HashParams, seq: &[i32], pos: usize) -> Vec<u64> {
    let eos = p.eos_token_id;
    let n = p.ngram_size as usize;
    let mut ctx = vec![eos; n - 1];
    let mut cut = false;
    for (k, c) in ctx.iter_mut().enumerate() {
        let q = pos as i64 - 1 - k as i64;
        if cut || q < 0 {
            break;
        }
        *c = seq[q as usize];
        if *c == eos {
            cut = true;
        }
    }
    let mut ids = Vec::new();
    let mut mix = (seq[pos] as i64).wrapping_mul(p.multipliers[0] as i64);
    for (order, &c) in ctx.iter().enumerate() {
        mix ^= (c as i64).wrapping_mul(p.multipliers[order + 1] as i64);
        for j in 0..p.heads_per_ngram as usize {
            let h = order * p.heads_per_ngram as usize + j;
            ids.push((mix as u64) % p.head_sizes[h] + p.offsets[h]);
        }
    }
    ids
}

/// E4M3 byte → f32, by its definition.
fn e4m3(b: u8) -> f32 {
    let (s, e, m) = (b >> 7, (b >> 3) & 15, (b & 7) as i32);
    if e == 15 && m == 7 {
        return f32::NAN;
    }
    let v = if e == 0 {
        m as f32 * 2f32.powi(-9)
    } else {
        (8 + m) as f32 * 2f32.powi(e as i32 - 10)
    };
    if s == 1 { -v } else { v }
}

/// Decodes one row to f32 by the plain rule: NVFP4 e2m1 × e4m3 block scale × global scale,
/// FP8 e4m3 × global scale, BF16 and F32 as is.
pub(super) fn decode_row(format: RowFormat, global: f32, row: &[u8]) -> Vec<f32> {
    const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    (0..160)
        .map(|j| match format {
            RowFormat::Nvfp4 => {
                let byte = row[j / 2];
                let code = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
                let v = E2M1[(code & 7) as usize] * if code & 8 != 0 { -1.0 } else { 1.0 };
                (v * e4m3(row[80 + j / 16])) * global
            }
            RowFormat::Fp8 => e4m3(row[j]) * global,
            RowFormat::Bf16 => {
                f32::from_bits((u16::from_le_bytes([row[2 * j], row[2 * j + 1]]) as u32) << 16)
            }
            RowFormat::F32 => {
                f32::from_le_bytes(row[4 * j..4 * j + 4].try_into().expect("4 bytes"))
            }
        })
        .collect()
}
