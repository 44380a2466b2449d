//! Dequantisation on the CPU: a step's packed rows `[tokens][num_heads][row_bytes]` → one
//! embedding of `num_heads * head_dim` elements per token (the table's geometry, a [`RowSpec`];
//! the shipped model: 16 × 160 = 2,560), as f32, f16 or bf16, row `t` at `out + t * stride`. A head shard's
//! rows `[tokens][heads][row_bytes]` (`crate::shard`) fill their heads' columns; the other
//! columns are written as -0.0 (the additive identity: `x + -0.0 == x` for every `x`, +0.0
//! included, where `+0.0` would turn a -0.0 into +0.0), or left untouched when accumulating.
//!
//! The rule — decode, one fp32 multiply by the global scale, optional fp32 accumulate, one
//! round-to-nearest-even store, canonical NaN — is written once, in
//! `docs/FORMAT.md#row-formats-and-dequantisation`; this file, the GPU kernel
//! (`kernels/ple_kernels.cu`) and the oracles implement it bit for bit.

use crate::error::Result;
use crate::model::{HEAD_DIM, RowFormat, RowSpec};
use crate::shard::Heads;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;
use std::ops::Range;

/// Output element type of a dequantisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            _ => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }
}

/// Where a dequant writes, checked once for the CPU and the GPU path: `[tokens]` rows of
/// `embed_dim` elements of `dtype` (the table's), token `t` at element `t * stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutArgs {
    /// Output element type.
    pub dtype: Dtype,
    /// Elements from one token's output row to the next (`>= embed_dim`).
    pub stride: usize,
    /// Add into the existing values (fp32 add, one rounding) instead of overwriting them.
    pub accumulate: bool,
}

impl OutArgs {
    /// Largest stride accepted: beyond it `tokens * stride * 4` could overflow an address.
    pub const MAX_STRIDE: usize = 1 << 40;

    /// Checks the stride against rows of `embed_dim` elements.
    pub fn check(&self, embed_dim: usize) -> Result<()> {
        if self.stride < embed_dim {
            return crate::invalid!(
                "out_stride {} < {embed_dim} elements (the table's embedding width)",
                self.stride
            );
        }
        self.check_max()
    }

    /// Checks the stride is not above [`Self::MAX_STRIDE`] (what can be checked without a table).
    pub fn check_max(&self) -> Result<()> {
        if self.stride > Self::MAX_STRIDE {
            return crate::invalid!(
                "out_stride {} is larger than {} elements",
                self.stride,
                Self::MAX_STRIDE
            );
        }
        Ok(())
    }

    /// Checks the stride and that `out` is aligned for the element type.
    pub fn check_ptr(&self, out: usize, embed_dim: usize) -> Result<()> {
        self.check(embed_dim)?;
        if out == 0 {
            return crate::invalid!("out is NULL");
        }
        if out % self.dtype.size() != 0 {
            return crate::invalid!("out is not aligned for {}", self.dtype.name());
        }
        Ok(())
    }

    /// Bytes from `out` that `num_tokens` tokens touch (the last token's row ends at
    /// `embed_dim` elements; its padding is not needed).
    pub fn extent_bytes(&self, num_tokens: u32, embed_dim: usize) -> u64 {
        if num_tokens == 0 {
            return 0;
        }
        ((num_tokens as u64 - 1) * self.stride as u64 + embed_dim as u64) * self.dtype.size() as u64
    }
}

/// E4M3 ("fn") byte → f32, exactly.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((b >> 3) & 0xF) as i32;
    let m = (b & 7) as f32;
    if e == 15 && b & 7 == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m * (2.0f32).powi(-9)
    } else {
        (1.0 + m / 8.0) * (2.0f32).powi(e - 7)
    };
    sign * mag
}

/// E2M1 code (low 4 bits) → f32, exactly.
pub fn e2m1_to_f32(c: u8) -> f32 {
    const MAG: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let m = MAG[(c & 7) as usize];
    if c & 8 != 0 { -m } else { m }
}

/// Precomputed tables for one (format, global scale, head dim).
pub struct Dequantizer {
    format: RowFormat,
    /// Elements per row.
    head_dim: usize,
    /// E4M3 byte → value (scale of an NVFP4 block).
    e4m3: [f32; 256],
    /// FP8: E4M3 byte → value × global (the same single fp32 multiply).
    fp8_scaled: [f32; 256],
    e2m1: [f32; 16],
    global: f32,
}

impl Dequantizer {
    /// For rows of `head_dim` elements (valid for `format`: `RowFormat::check_head_dim`).
    pub fn new(format: RowFormat, global_scale: f32, head_dim: usize) -> Dequantizer {
        let mut e4m3 = [0f32; 256];
        let mut fp8_scaled = [0f32; 256];
        for b in 0..256usize {
            e4m3[b] = e4m3_to_f32(b as u8);
            fp8_scaled[b] = e4m3[b] * global_scale;
        }
        let mut e2m1 = [0f32; 16];
        for (c, v) in e2m1.iter_mut().enumerate() {
            *v = e2m1_to_f32(c as u8);
        }
        Dequantizer {
            format,
            head_dim,
            e4m3,
            fp8_scaled,
            e2m1,
            global: global_scale,
        }
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.format.row_bytes(self.head_dim)
    }

    /// Elements per row.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// One row → `head_dim` fp32 values (steps 1–2 of the rule).
    pub fn row_f32(&self, row: &[u8], out: &mut [f32]) {
        // The shipped model's head dim gets its own copy of the loops, with the length known
        // at compile time (unrolled, no bounds checks); any other head dim the general one.
        if self.head_dim == HEAD_DIM {
            self.row_f32_n(row, out, HEAD_DIM)
        } else {
            self.row_f32_n(row, out, self.head_dim)
        }
    }

    #[inline(always)]
    fn row_f32_n(&self, row: &[u8], out: &mut [f32], hd: usize) {
        let out = &mut out[..hd];
        match self.format {
            RowFormat::Nvfp4 => {
                let codes = &row[..hd / 2];
                let scales = &row[hd / 2..hd / 2 + hd / 16];
                for (blk, (o, c)) in out
                    .chunks_exact_mut(16)
                    .zip(codes.chunks_exact(8))
                    .enumerate()
                {
                    let s = self.e4m3[scales[blk] as usize];
                    let mut lut = [0f32; 16];
                    for (l, &e) in lut.iter_mut().zip(&self.e2m1) {
                        *l = (e * s) * self.global;
                    }
                    for (pair, &b) in o.chunks_exact_mut(2).zip(c) {
                        pair[0] = lut[(b & 15) as usize];
                        pair[1] = lut[(b >> 4) as usize];
                    }
                }
            }
            RowFormat::Fp8 => {
                for (o, &b) in out.iter_mut().zip(&row[..hd]) {
                    *o = self.fp8_scaled[b as usize];
                }
            }
            RowFormat::Bf16 => {
                for (o, b) in out.iter_mut().zip(row[..hd * 2].chunks_exact(2)) {
                    *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
                }
            }
            RowFormat::F32 => {
                for (o, b) in out.iter_mut().zip(row[..hd * 4].chunks_exact(4)) {
                    *o = f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                }
            }
        }
    }

    /// One token's rows (`[out.len() / head_dim][row_bytes]`) → its `out.len()` fp32 values.
    pub fn token_f32(&self, rows: &[u8], out: &mut [f32]) {
        self.token_f32_heads(rows, Heads::all(out.len() / self.head_dim), out);
    }

    /// One token's rows of the heads `heads` (`[heads.len()][row_bytes]`) → its embedding
    /// `out` (`num_heads * head_dim` fp32 values), -0.0 in the other heads' columns.
    pub fn token_f32_heads(&self, rows: &[u8], heads: Heads, out: &mut [f32]) {
        // (the shipped head dim: its own copy, the row loop inlined with constant lengths)
        if self.head_dim == HEAD_DIM {
            self.token_f32_heads_n(rows, heads, out, HEAD_DIM)
        } else {
            self.token_f32_heads_n(rows, heads, out, self.head_dim)
        }
    }

    #[inline(always)]
    fn token_f32_heads_n(&self, rows: &[u8], heads: Heads, out: &mut [f32], hd: usize) {
        let rb = self.format.row_bytes(hd);
        for (h, o) in out.chunks_exact_mut(hd).enumerate() {
            match heads.position(h) {
                Some(j) => self.row_f32_n(&rows[j * rb..(j + 1) * rb], o, hd),
                None => o.fill(-0.0),
            }
        }
    }
}

/// A typed, strided output (`[tokens]` rows of `embed_dim` elements, `stride` elements apart).
pub enum Out<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    Bf16(&'a mut [bf16]),
}

impl Out<'_> {
    fn len(&self) -> usize {
        match self {
            Out::F32(s) => s.len(),
            Out::F16(s) => s.len(),
            Out::Bf16(s) => s.len(),
        }
    }
}

/// The canonical NaN every path writes (f32 `0x7FC00000`; it converts to f16 `0x7E00` and bf16
/// `0x7FC0`), so CPU and GPU outputs are bit-identical even for NaN inputs.
#[inline(always)]
fn canon(x: f32) -> f32 {
    if x.is_nan() {
        f32::from_bits(0x7FC0_0000)
    } else {
        x
    }
}

/// f32 → bf16 bits, round to nearest even; any NaN becomes the canonical `0x7FC0`. Branch-free so the loops
/// using it vectorise.
#[inline(always)]
fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16;
    let nan = 0x7FC0;
    (if b & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    }) as u16
}

/// Stores `vals` into `out` (the same length; `tmp` at least as long).
fn store(vals: &[f32], out: OutRow<'_>, accumulate: bool, tmp: &mut [f32]) {
    let tmp = &mut tmp[..vals.len()];
    match out {
        OutRow::F32(o) => {
            if accumulate {
                for (o, v) in o.iter_mut().zip(vals) {
                    *o = canon(*o + *v);
                }
            } else {
                for (o, v) in o.iter_mut().zip(vals) {
                    *o = canon(*v);
                }
            }
        }
        OutRow::F16(o) => {
            // half converts with F16C where the CPU has it (round to nearest even either way)
            if accumulate {
                o.convert_to_f32_slice(tmp);
                for (t, v) in tmp.iter_mut().zip(vals) {
                    *t = canon(*t + *v);
                }
            } else {
                for (t, v) in tmp.iter_mut().zip(vals) {
                    *t = canon(*v);
                }
            }
            o.convert_from_f32_slice(tmp);
        }
        OutRow::Bf16(o) => {
            if accumulate {
                for (o, v) in o.iter_mut().zip(vals) {
                    let x = f32::from_bits((o.to_bits() as u32) << 16) + *v;
                    *o = bf16::from_bits(f32_to_bf16_bits(x));
                }
            } else {
                for (o, v) in o.iter_mut().zip(vals) {
                    *o = bf16::from_bits(f32_to_bf16_bits(*v));
                }
            }
        }
    }
}

enum OutRow<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    Bf16(&'a mut [bf16]),
}

impl<'a> OutRow<'a> {
    /// The same row, borrowed for a shorter time.
    fn reborrow(&mut self) -> OutRow<'_> {
        match self {
            OutRow::F32(o) => OutRow::F32(o),
            OutRow::F16(o) => OutRow::F16(o),
            OutRow::Bf16(o) => OutRow::Bf16(o),
        }
    }

    /// The elements `r` of the row.
    fn cols(self, r: Range<usize>) -> OutRow<'a> {
        match self {
            OutRow::F32(o) => OutRow::F32(&mut o[r]),
            OutRow::F16(o) => OutRow::F16(&mut o[r]),
            OutRow::Bf16(o) => OutRow::Bf16(&mut o[r]),
        }
    }
}

/// Tokens per parallel task; steps with fewer than 2 tasks' worth run on the calling thread.
const TOKENS_PER_TASK: usize = 32;

/// Dequantises `num_tokens` tokens of `rows` (`[tokens][num_heads][row_bytes]`, as `spec`
/// says) into `out` with row stride `stride` elements (see the module doc for the rule). `out`
/// must hold at least `(num_tokens - 1) * stride + embed_dim` elements.
#[allow(
    clippy::too_many_arguments,
    reason = "the flat argument list the callers already hold"
)]
pub fn dequant_rows(
    spec: &RowSpec,
    rows: &[u8],
    num_tokens: usize,
    out: Out<'_>,
    stride: usize,
    accumulate: bool,
    pool: Option<&rayon::ThreadPool>,
) -> Result<()> {
    let args = (stride, accumulate);
    let all = Heads::all(spec.num_heads);
    dequant_rows_heads(spec, rows, num_tokens, all, out, args, pool)
}

/// [`dequant_rows`] of a head shard's rows (`[tokens][heads.len()][row_bytes]`, `crate::shard`):
/// the heads' columns get their values; the other columns are written as -0.0, or, with
/// `accumulate`, not touched at all — so the sum of every shard's output, in any order, is the
/// whole table's output bit for bit (`x + -0.0 == x` for every `x`), and accumulating every
/// shard into one buffer is the whole table's accumulate. `(stride, accumulate)` as in
/// [`dequant_rows`].
#[allow(
    clippy::too_many_arguments,
    reason = "the flat argument list the callers already hold"
)]
pub fn dequant_rows_heads(
    spec: &RowSpec,
    rows: &[u8],
    num_tokens: usize,
    heads: Heads,
    out: Out<'_>,
    (stride, accumulate): (usize, bool),
    pool: Option<&rayon::ThreadPool>,
) -> Result<()> {
    if let Err(m) = spec.format.check_head_dim(spec.head_dim) {
        return crate::invalid!("{m}");
    }
    let (num_heads, hd, dim) = (spec.num_heads, spec.head_dim, spec.embed_dim());
    let d = Dequantizer::new(spec.format, spec.global_scale, hd);
    if heads.is_empty() || heads.step == 0 || heads.end() > num_heads {
        return crate::invalid!(
            "heads [{}] not a set of the {num_heads} heads",
            heads.describe()
        );
    }
    let tok_bytes = heads.len() * d.row_bytes();
    if stride < dim {
        return crate::invalid!("out_stride {stride} < {dim} elements");
    }
    if rows.len() < num_tokens * tok_bytes {
        return crate::invalid!(
            "{} row bytes for {num_tokens} tokens of {tok_bytes}",
            rows.len()
        );
    }
    if num_tokens == 0 {
        return Ok(());
    }
    let need = (num_tokens - 1) * stride + dim;
    if out.len() < need {
        return crate::invalid!(
            "output holds {} elements, {num_tokens} tokens at stride {stride} need {need}",
            out.len()
        );
    }
    let one = |t: usize, o: OutRow<'_>, vals: &mut [f32], tmp: &mut [f32]| {
        let src = &rows[t * tok_bytes..(t + 1) * tok_bytes];
        match o {
            // f32 without accumulate: straight into the output, then every NaN made canonical
            // (a bf16 or f32 row's NaN keeps its sign and payload through the widening)
            OutRow::F32(o) if !accumulate => {
                d.token_f32_heads(src, heads, o);
                for x in o.iter_mut() {
                    *x = canon(*x);
                }
            }
            // accumulate: the shard's columns only (nothing is added to the others)
            mut o if accumulate => {
                d.token_f32_heads(src, heads, vals);
                // the shard's columns only, a run of adjacent heads at a time
                for r in heads.runs() {
                    let cols = r.start * hd..r.end * hd;
                    store(&vals[cols.clone()], o.reborrow().cols(cols), true, tmp);
                }
            }
            o => {
                d.token_f32_heads(src, heads, vals);
                store(vals, o, false, tmp);
            }
        }
    };
    // Each task owns `TOKENS_PER_TASK` output rows (disjoint sub-slices of `out`).
    macro_rules! run {
        ($slice:expr, $variant:ident) => {{
            let s = &mut $slice[..need];
            let task = |(ci, chunk): (usize, &mut [_])| {
                let mut vals = vec![0f32; dim];
                let mut tmp = vec![0f32; dim];
                for (k, row) in chunk.chunks_mut(stride).enumerate() {
                    let t = ci * TOKENS_PER_TASK + k;
                    one(t, OutRow::$variant(&mut row[..dim]), &mut vals, &mut tmp);
                }
            };
            match pool {
                Some(p) if num_tokens >= 2 * TOKENS_PER_TASK && p.current_num_threads() > 1 => p
                    .install(|| {
                        s.par_chunks_mut(TOKENS_PER_TASK * stride)
                            .enumerate()
                            .for_each(task)
                    }),
                _ => s
                    .chunks_mut(TOKENS_PER_TASK * stride)
                    .enumerate()
                    .for_each(task),
            }
        }};
    }
    match out {
        Out::F32(s) => run!(s, F32),
        Out::F16(s) => run!(s, F16),
        Out::Bf16(s) => run!(s, Bf16),
    }
    Ok(())
}

/// [`dequant_rows_heads`] into raw memory of `args.dtype` (for the C API).
///
/// # Safety
/// `out` must be valid for writes (and reads, with `accumulate`) of
/// `(num_tokens - 1) * stride + spec.embed_dim()` elements of `dtype`, and not be accessed by
/// anyone else during the call.
#[allow(
    clippy::too_many_arguments,
    reason = "the flat argument list the callers already hold"
)]
pub unsafe fn dequant_raw(
    spec: &RowSpec,
    rows: &[u8],
    num_tokens: usize,
    heads: Heads,
    out: *mut u8,
    args: OutArgs,
    pool: Option<&rayon::ThreadPool>,
) -> Result<()> {
    let OutArgs {
        dtype,
        stride,
        accumulate,
    } = args;
    let dim = spec.embed_dim();
    if stride < dim {
        return crate::invalid!("out_stride {stride} < {dim} elements");
    }
    if num_tokens == 0 {
        return Ok(());
    }
    if (out as usize) % dtype.size() != 0 {
        return crate::invalid!(
            "out is not aligned to {} bytes for {}",
            dtype.size(),
            dtype.name()
        );
    }
    let len = (num_tokens - 1)
        .checked_mul(stride)
        .and_then(|x| x.checked_add(dim))
        .filter(|x| {
            x.checked_mul(dtype.size())
                .is_some_and(|b| b <= isize::MAX as usize)
        })
        .ok_or_else(|| crate::Error::InvalidArgument("out_stride too large".into()))?;
    // SAFETY: the caller guarantees `len` elements of `dtype` at `out`, aligned (checked above).
    let o = unsafe {
        match dtype {
            Dtype::F32 => Out::F32(std::slice::from_raw_parts_mut(out as *mut f32, len)),
            Dtype::F16 => Out::F16(std::slice::from_raw_parts_mut(out as *mut f16, len)),
            Dtype::Bf16 => Out::Bf16(std::slice::from_raw_parts_mut(out as *mut bf16, len)),
        }
    };
    let args = (stride, accumulate);
    dequant_rows_heads(spec, rows, num_tokens, heads, o, args, pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half() {
        let mut x = 1u64;
        let check = |b: u32| {
            let f = f32::from_bits(b);
            let want = bf16::from_f32(f);
            let got = f32_to_bf16_bits(f);
            if f.is_nan() {
                assert!(bf16::from_bits(got).is_nan(), "{b:#x}");
            } else {
                assert_eq!(got, want.to_bits(), "{b:#x}");
            }
        };
        for b in [
            0u32,
            0x8000_0000,
            0x7F7F_FFFF,
            0xFF7F_FFFF,
            0x7F80_0000,
            0x3F80_8000,
            0x3F81_8000,
        ] {
            check(b);
        }
        for _ in 0..1_000_000 {
            x = crate::model::splitmix64(x);
            check(x as u32);
        }
    }

    #[test]
    fn e4m3_known_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6)); // smallest normal
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0); // largest
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
        assert_eq!(e4m3_to_f32(0x78), 256.0); // e = 15 with m != 7 is a number
    }

    #[test]
    fn nvfp4_nibble_order_and_scale() {
        let mut row = vec![0u8; 90];
        row[0] = 0x72; // code 0 = 2 (1.0), code 1 = 7 (6.0)
        row[8] = 0x0B; // code 16 = 0xB (-1.5)
        row[80] = 0x38; // block 0 scale 1.0
        row[81] = 0x40; // block 1 scale 2.0
        let d = Dequantizer::new(RowFormat::Nvfp4, 0.5, 160);
        let mut o = [0f32; 160];
        d.row_f32(&row, &mut o);
        assert_eq!((o[0], o[1], o[2]), (0.5, 3.0, 0.0));
        assert_eq!(o[16], -1.5);
    }

    #[test]
    fn accumulate_rounds_once_after_the_add() {
        // bf16 out = 1.0; v = 2^-8 + 2^-9: f32(1) + v = 1 + 0.75 ulp(bf16) → RNE 1.0078125.
        // Tie: 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7 → ties to even = 1.0.
        let mut rows = vec![0u8; 16 * 320];
        let v = f32::from_bits(0x3BC0_0000); // 2^-8 + 2^-9 = 0.005859375, exact in bf16
        rows[..2].copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
        let tie = f32::from_bits(0x3B80_0000); // 2^-8
        rows[2..4].copy_from_slice(&((tie.to_bits() >> 16) as u16).to_le_bytes());
        let mut out = vec![bf16::from_f32(1.0); 2560];
        dequant_rows(
            &RowSpec::shipped(RowFormat::Bf16, 1.0),
            &rows,
            1,
            Out::Bf16(&mut out),
            2560,
            true,
            None,
        )
        .unwrap();
        assert_eq!(out[0].to_f32(), 1.0078125);
        assert_eq!(out[1].to_f32(), 1.0);
        assert_eq!(out[2].to_f32(), 1.0);
    }

    #[test]
    fn every_nan_is_stored_canonical_in_every_dtype() {
        // bf16 rows with NaNs of either sign and any payload, and fp8 rows with both e4m3 NaNs
        let mut bf = vec![0u8; 16 * 320];
        for (i, bits) in [0xFF97u16, 0x7F81, 0xFFC0, 0x7FFF].iter().enumerate() {
            bf[2 * i..2 * i + 2].copy_from_slice(&bits.to_le_bytes());
        }
        let mut f8 = vec![0u8; 16 * 160];
        f8[0] = 0x7F;
        f8[1] = 0xFF;
        let mut fl = vec![0u8; 16 * 640];
        for (i, bits) in [0xFF80_0001u32, 0x7F80_0001, 0xFFC0_0000, 0x7FFF_FFFF]
            .iter()
            .enumerate()
        {
            fl[4 * i..4 * i + 4].copy_from_slice(&bits.to_le_bytes());
        }
        for (format, rows, nans) in [
            (RowFormat::Bf16, &bf, 4),
            (RowFormat::Fp8, &f8, 2),
            (RowFormat::F32, &fl, 4),
        ] {
            for accumulate in [false, true] {
                let mut o32 = vec![0f32; 2560];
                let mut o16 = vec![f16::ZERO; 2560];
                let mut ob = vec![bf16::ZERO; 2560];
                for out in [Out::F32(&mut o32), Out::F16(&mut o16), Out::Bf16(&mut ob)] {
                    dequant_rows(
                        &RowSpec::shipped(format, 1.0),
                        rows,
                        1,
                        out,
                        2560,
                        accumulate,
                        None,
                    )
                    .unwrap();
                }
                for e in 0..nans {
                    let what = format!("{format:?} acc {accumulate} element {e}");
                    assert_eq!(o32[e].to_bits(), 0x7FC0_0000, "f32 {what}");
                    assert_eq!(o16[e].to_bits(), 0x7E00, "f16 {what}");
                    assert_eq!(ob[e].to_bits(), 0x7FC0, "bf16 {what}");
                }
            }
        }
    }

    #[test]
    fn f32_rows_are_stored_exactly_in_f32() {
        // every finite f32 pattern class: normals, subnormals, signed zeros, infinities
        let vals: Vec<u32> = (0..2560u32)
            .map(|i| crate::model::splitmix64(i as u64) as u32)
            .map(|b| {
                if b & 0x7FFF_FFFF > 0x7F80_0000 {
                    b & 0xFF80_0000
                } else {
                    b
                }
            })
            .collect();
        let rows: Vec<u8> = vals.iter().flat_map(|b| b.to_le_bytes()).collect();
        let d = Dequantizer::new(RowFormat::F32, 1.0, 160);
        assert_eq!(d.row_bytes(), 640);
        let mut out = vec![7f32; 2560];
        dequant_rows(
            &RowSpec::shipped(RowFormat::F32, 1.0),
            &rows,
            1,
            Out::F32(&mut out),
            2560,
            false,
            None,
        )
        .unwrap();
        for (e, (o, v)) in out.iter().zip(&vals).enumerate() {
            assert_eq!(o.to_bits(), *v, "element {e}");
        }
    }

    #[test]
    fn strided_output_leaves_gaps_alone() {
        let rows: Vec<u8> = (0..3 * 16 * 160).map(|i| (i % 126) as u8).collect();
        let stride = 2600;
        let mut out = vec![-7.0f32; 2 * stride + 2560 + 3];
        dequant_rows(
            &RowSpec::shipped(RowFormat::Fp8, 0.25),
            &rows,
            3,
            Out::F32(&mut out),
            stride,
            false,
            None,
        )
        .unwrap();
        for t in 0..3 {
            for h in 0..16 {
                for j in 0..160 {
                    let b = rows[t * 2560 + h * 160 + j];
                    assert_eq!(out[t * stride + h * 160 + j], e4m3_to_f32(b) * 0.25);
                }
            }
            if t < 2 {
                assert!(
                    out[t * stride + 2560..(t + 1) * stride]
                        .iter()
                        .all(|&x| x == -7.0)
                );
            }
        }
        assert!(out[2 * stride + 2560..].iter().all(|&x| x == -7.0));
        // too small an output is an error, not a partial write
        let mut small = vec![0f32; 2 * stride + 2559];
        assert!(
            dequant_rows(
                &RowSpec::shipped(RowFormat::Fp8, 1.0),
                &rows,
                3,
                Out::F32(&mut small),
                stride,
                false,
                None
            )
            .is_err()
        );
    }
}
