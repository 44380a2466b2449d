//! The model's constants (`docs/FORMAT.md#model-constants`), the hash parameters derived from
//! them (`docs/FORMAT.md#the-n-gram-hash`) and the row formats
//! (`docs/FORMAT.md#row-formats-and-dequantisation`), with the bounds a file's values must keep
//! (`docs/FORMAT.md#limits-on-what-a-file-may-say`).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

// The shipped model's constants: the defaults of a config.json that lacks a field. A table's
// own geometry (heads, head dim, n-gram size) is data (`TableMeta`), bounded by the maxima below.
pub const VOCAB_SIZE: u32 = 248_320;
pub const EOS_TOKEN_ID: i32 = 248_044;
pub const NGRAM_SIZE: u32 = 3;
pub const HEADS_PER_NGRAM: u32 = 8;
/// Heads in all: (ngram_size - 1) * heads_per_ngram.
pub const NUM_HEADS: usize = 16;
pub const PLE_EMBED_DIM: usize = 2560;
pub const HEAD_DIM: usize = 160;
pub const NGRAM_VOCAB_SIZE_BASE: u64 = 20_000_000;
pub const DIVISIBLE_BY: u64 = 128;
pub const SPLIT_NGRAM_PARTS: u32 = 128;
pub const SEED: u64 = 1234;
pub const PLE_LAYER_INDEX: u64 = 0;
/// Most heads a table may have (`PLE_MAX_HEADS`): the rows per token libple gathers, hashes
/// and dequantises; the GPU kernel's head fields are 16-bit.
pub const MAX_HEADS: usize = 64;
/// Largest head dim (elements per row) a table may have (`PLE_MAX_HEAD_DIM`).
pub const MAX_HEAD_DIM: usize = 4096;
/// Largest embedding width `num_heads * head_dim` a table may have (`PLE_MAX_EMBED_DIM`).
pub const MAX_EMBED_DIM: usize = 32768;
/// Largest n-gram order accepted from a file (the window is `ngram_size` tokens).
pub const MAX_NGRAM_SIZE: u32 = 8;
/// Largest `heads_per_ngram` accepted from a file; with [`MAX_NGRAM_SIZE`] the head count
/// `(ngram_size - 1) * heads_per_ngram` stays ≤ 7 × 1024, far from any integer limit.
pub const MAX_HEADS_PER_NGRAM: u32 = 1024;

/// Largest `ngram_vocab_size_base` accepted from config.json (head sizes are primes just above it).
pub const MAX_VOCAB_BASE: u64 = 1 << 32;
/// Most head sizes the derivation may search for: `(ple_layer_index + 1) * num_heads`.
pub const MAX_PRIMES: u64 = 1024;
/// Largest head size (rows of one head) accepted from a file, exclusive.
pub const MAX_HEAD_SIZE: u64 = 1 << 40;

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
const M1: u64 = 0xBF58_476D_1CE4_E5B9;
const M2: u64 = 0x94D0_49BB_1331_11EB;

/// splitmix64 (`docs/FORMAT.md#the-n-gram-hash`).
pub fn splitmix64(mut v: u64) -> u64 {
    v = v.wrapping_add(GAMMA);
    v = (v ^ (v >> 30)).wrapping_mul(M1);
    v = (v ^ (v >> 27)).wrapping_mul(M2);
    v ^ (v >> 31)
}

/// The model constants that decide the hash and the table shape (`text_config` of `config.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub vocab_size: u32,
    pub eos_token_id: i32,
    pub ngram_size: u32,
    pub heads_per_ngram: u32,
    pub ple_embed_dim: u32,
    pub ngram_vocab_size_base: u64,
    pub make_ngram_vocab_size_divisible_by: u64,
    pub split_ngram_parts: u32,
    pub seed: u64,
    /// Index of the PLE layer among PLE layers (0 for the shipped model).
    pub ple_layer_index: u64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            vocab_size: VOCAB_SIZE,
            eos_token_id: EOS_TOKEN_ID,
            ngram_size: NGRAM_SIZE,
            heads_per_ngram: HEADS_PER_NGRAM,
            ple_embed_dim: PLE_EMBED_DIM as u32,
            ngram_vocab_size_base: NGRAM_VOCAB_SIZE_BASE,
            make_ngram_vocab_size_divisible_by: DIVISIBLE_BY,
            split_ngram_parts: SPLIT_NGRAM_PARTS,
            seed: SEED,
            ple_layer_index: PLE_LAYER_INDEX,
        }
    }
}

impl ModelConfig {
    /// Reads the constants from a parsed `config.json` (`text_config` or top level). Fields the
    /// file lacks take the model's defaults (the constants above); fields it has must be of the right type.
    pub fn from_config_json(v: &serde_json::Value) -> Result<ModelConfig> {
        let tc = v.get("text_config").filter(|t| t.is_object()).unwrap_or(v);
        let mut c = ModelConfig::default();
        fn get_u64(tc: &serde_json::Value, k: &str) -> Result<Option<u64>> {
            match tc.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x.as_u64().map(Some).ok_or_else(|| {
                    Error::Format(format!(
                        "config.json: field '{k}' is {x}, expected a non-negative integer"
                    ))
                }),
            }
        }
        if let Some(x) = get_u64(tc, "vocab_size")? {
            c.vocab_size = u32::try_from(x)
                .map_err(|_| Error::Format(format!("config.json: vocab_size {x} too large")))?;
        }
        fn get_u32(tc: &serde_json::Value, k: &str) -> Result<Option<u32>> {
            get_u64(tc, k)?
                .map(|x| {
                    u32::try_from(x)
                        .map_err(|_| Error::Format(format!("config.json: {k} {x} too large")))
                })
                .transpose()
        }
        let eos = match tc.get("eos_token_id") {
            Some(serde_json::Value::Array(a)) if !a.is_empty() => {
                Some(a[0].as_i64().ok_or_else(|| {
                    Error::Format("config.json: eos_token_id[0] is not an integer".into())
                })?)
            }
            Some(x) if x.is_i64() => x.as_i64(),
            _ => None,
        };
        if let Some(e) = eos {
            c.eos_token_id = i32::try_from(e).map_err(|_| {
                Error::Format(format!(
                    "config.json: eos_token_id {e} is not a 32-bit token id"
                ))
            })?;
        }
        if let Some(x) = get_u32(tc, "ngram_size")? {
            c.ngram_size = x;
        }
        if let Some(x) = get_u32(tc, "heads_per_ngram")? {
            c.heads_per_ngram = x;
        }
        if let Some(x) = get_u32(tc, "ple_embed_dim")? {
            c.ple_embed_dim = x;
        }
        if let Some(x) = get_u64(tc, "ngram_vocab_size_base")? {
            c.ngram_vocab_size_base = x;
        }
        if let Some(x) = get_u64(tc, "make_ngram_vocab_size_divisible_by")? {
            c.make_ngram_vocab_size_divisible_by = x;
        }
        if let Some(x) = get_u32(tc, "split_ngram_parts")? {
            c.split_ngram_parts = x;
        }
        if let Some(x) = get_u64(tc, "seed")? {
            c.seed = x;
        }
        if let Some(x) = get_u64(tc, "ple_layer_index")? {
            c.ple_layer_index = x;
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks the constants are usable (positive, consistent).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Format(format!("model config: {m}")));
        if self.vocab_size == 0 {
            return bad("vocab_size is 0".into());
        }
        if self.eos_token_id < 0 || self.eos_token_id as u32 >= self.vocab_size {
            return bad(format!(
                "eos_token_id {} outside [0, vocab_size {})",
                self.eos_token_id, self.vocab_size
            ));
        }
        if !(2..=MAX_NGRAM_SIZE).contains(&self.ngram_size) {
            return bad(format!(
                "ngram_size {} not in [2, {MAX_NGRAM_SIZE}]",
                self.ngram_size
            ));
        }
        if !(1..=MAX_HEADS_PER_NGRAM).contains(&self.heads_per_ngram) {
            return bad(format!(
                "heads_per_ngram {} not in [1, {MAX_HEADS_PER_NGRAM}]",
                self.heads_per_ngram
            ));
        }
        // Both bounded above, so the product is at most 7 × 1024.
        let heads = (self.ngram_size - 1) * self.heads_per_ngram;
        if self.ple_embed_dim == 0 || self.ple_embed_dim % heads != 0 {
            return bad(format!(
                "ple_embed_dim {} not a positive multiple of the {heads} heads",
                self.ple_embed_dim
            ));
        }
        if !(2..=MAX_VOCAB_BASE).contains(&self.ngram_vocab_size_base) {
            return bad(format!(
                "ngram_vocab_size_base {} not in [2, {MAX_VOCAB_BASE}]",
                self.ngram_vocab_size_base
            ));
        }
        // The head sizes are the (layer * heads + 1)-th .. primes above the base: bounding the
        // count bounds the prime search (trial division up to 2^16 per candidate).
        let primes = self
            .ple_layer_index
            .checked_add(1)
            .and_then(|l| l.checked_mul(heads as u64));
        if primes.is_none_or(|p| p > MAX_PRIMES) {
            return bad(format!(
                "(ple_layer_index {} + 1) × {heads} heads is more than the {MAX_PRIMES} head sizes libple derives",
                self.ple_layer_index
            ));
        }
        if self.make_ngram_vocab_size_divisible_by == 0 {
            return bad("make_ngram_vocab_size_divisible_by is 0".into());
        }
        if self.split_ngram_parts == 0 {
            return bad("split_ngram_parts is 0".into());
        }
        Ok(())
    }

    /// Number of heads: (ngram_size - 1) * heads_per_ngram (computed in 64 bits, so it cannot
    /// wrap even for constants [`ModelConfig::validate`] would refuse).
    pub fn num_heads(&self) -> usize {
        heads_of(self.ngram_size, self.heads_per_ngram) as usize
    }

    /// Elements per row: ple_embed_dim / num_heads (0 when there are no heads).
    pub fn head_dim(&self) -> usize {
        (self.ple_embed_dim as usize)
            .checked_div(self.num_heads())
            .unwrap_or(0)
    }
}

/// `(ngram_size - 1) * heads_per_ngram` in 64 bits: at most 2^64 - 2^33, never wraps.
pub fn heads_of(ngram_size: u32, heads_per_ngram: u32) -> u64 {
    (ngram_size as u64).saturating_sub(1) * heads_per_ngram as u64
}

fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    if n % 2 == 0 {
        return n == 2;
    }
    let mut d = 3u64;
    while d.saturating_mul(d) <= n {
        if n % d == 0 {
            return false;
        }
        d += 2;
    }
    true
}

/// The parameters of the n-gram hash (`docs/FORMAT.md#the-n-gram-hash`), as stored in a table's
/// metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashParams {
    /// One multiplier per position in the window: [current, ctx1, ctx2, ...] (ngram_size values).
    pub multipliers: Vec<u64>,
    /// Rows of each head (num_heads values).
    pub head_sizes: Vec<u64>,
    /// First row of each head (running sum of head_sizes).
    pub offsets: Vec<u64>,
    pub eos_token_id: i32,
    pub vocab_size: u32,
    pub ngram_size: u32,
    pub heads_per_ngram: u32,
}

impl HashParams {
    /// Derives the parameters from the model constants, as the reference model does.
    pub fn derive(c: &ModelConfig) -> HashParams {
        let half = std::cmp::max(1, (i64::MAX as u64 / c.vocab_size as u64) / 2);
        let base = c
            .seed
            .wrapping_add(10007u64.wrapping_mul(c.ple_layer_index));
        let multipliers = (0..c.ngram_size as u64)
            .map(|i| 2 * (splitmix64(base.wrapping_add(GAMMA.wrapping_mul(i + 1))) % half) + 1)
            .collect();
        let heads = c.num_heads() as u64;
        // head h uses the (layer * heads + h + 1)-th prime strictly greater than base - 1.
        let skip = c.ple_layer_index * heads;
        let mut p = c.ngram_vocab_size_base - 1;
        let mut found = 0u64;
        let mut head_sizes = Vec::with_capacity(heads as usize);
        while (head_sizes.len() as u64) < heads {
            p += 1;
            if is_prime(p) {
                found += 1;
                if found > skip {
                    head_sizes.push(p);
                }
            }
        }
        let mut offsets = Vec::with_capacity(heads as usize);
        let mut acc = 0u64;
        for s in &head_sizes {
            offsets.push(acc);
            acc += s;
        }
        HashParams {
            multipliers,
            head_sizes,
            offsets,
            eos_token_id: c.eos_token_id,
            vocab_size: c.vocab_size,
            ngram_size: c.ngram_size,
            heads_per_ngram: c.heads_per_ngram,
        }
    }

    /// Number of heads.
    pub fn num_heads(&self) -> usize {
        self.head_sizes.len()
    }

    /// Rows addressed by the hash (sum of head sizes), before padding.
    pub fn addressed_rows(&self) -> u64 {
        self.head_sizes.iter().sum()
    }

    /// Checks internal consistency: lengths, offsets = running sum, multipliers odd and such that
    /// no product of a token id overflows i64 (the reference uses signed 64-bit arithmetic).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Format(format!("hash parameters: {m}")));
        if !(2..=MAX_NGRAM_SIZE).contains(&self.ngram_size)
            || self.multipliers.len() != self.ngram_size as usize
        {
            return bad(format!(
                "{} multipliers for ngram_size {} (must be in [2, {MAX_NGRAM_SIZE}])",
                self.multipliers.len(),
                self.ngram_size
            ));
        }
        if !(1..=MAX_HEADS_PER_NGRAM).contains(&self.heads_per_ngram) {
            return bad(format!(
                "heads_per_ngram {} not in [1, {MAX_HEADS_PER_NGRAM}]",
                self.heads_per_ngram
            ));
        }
        let heads = heads_of(self.ngram_size, self.heads_per_ngram);
        if self.head_sizes.len() as u64 != heads || self.offsets.len() as u64 != heads {
            return bad(format!(
                "{} head sizes and {} offsets, expected {heads}",
                self.head_sizes.len(),
                self.offsets.len()
            ));
        }
        let mut acc = 0u64;
        // At most 7168 heads of < 2^40 rows each: the running sum stays below 2^53.
        for (h, (&s, &o)) in self.head_sizes.iter().zip(&self.offsets).enumerate() {
            if s == 0 || s >= MAX_HEAD_SIZE {
                return bad(format!("head {h} size {s} out of range"));
            }
            if o != acc {
                return bad(format!("head {h} offset {o}, expected running sum {acc}"));
            }
            acc += s;
        }
        if self.vocab_size == 0
            || self.eos_token_id < 0
            || self.eos_token_id as u32 >= self.vocab_size
        {
            return bad(format!(
                "eos {} / vocab {}",
                self.eos_token_id, self.vocab_size
            ));
        }
        let max_tok = (self.vocab_size - 1) as u128;
        for (i, &m) in self.multipliers.iter().enumerate() {
            if (m as u128) * max_tok > i64::MAX as u128 {
                return bad(format!(
                    "multiplier {i} = {m} overflows i64 for token ids < {}",
                    self.vocab_size
                ));
            }
        }
        Ok(())
    }
}

/// How a table's rows decode: row format, global scale and geometry (`num_heads` rows of
/// `head_dim` elements per token, one embedding of `num_heads * head_dim` elements).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowSpec {
    pub format: RowFormat,
    pub global_scale: f32,
    pub num_heads: usize,
    pub head_dim: usize,
}

impl RowSpec {
    /// The shipped model's geometry (16 heads of 160) in `format`.
    pub fn shipped(format: RowFormat, global_scale: f32) -> RowSpec {
        RowSpec {
            format,
            global_scale,
            num_heads: NUM_HEADS,
            head_dim: HEAD_DIM,
        }
    }
    /// Elements of one token's embedding: `num_heads * head_dim`.
    pub fn embed_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.format.row_bytes(self.head_dim)
    }
}

/// How the rows of a table are stored (`docs/FORMAT.md#row-formats-and-dequantisation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowFormat {
    Nvfp4,
    Fp8,
    Bf16,
    /// Unquantised rows: little-endian IEEE f32 (tables that were never quantised).
    F32,
}

impl RowFormat {
    /// Checks that rows of `head_dim` elements are representable in this format: NVFP4 needs a
    /// multiple of 16 (one E4M3 scale per 16-element block), the others any head dim >= 1; and
    /// `head_dim <= MAX_HEAD_DIM`.
    pub fn check_head_dim(self, head_dim: usize) -> std::result::Result<(), String> {
        if head_dim == 0 || head_dim > MAX_HEAD_DIM {
            return Err(format!("head_dim {head_dim} not in [1, {MAX_HEAD_DIM}]"));
        }
        if self == RowFormat::Nvfp4 && head_dim % 16 != 0 {
            return Err(format!(
                "head_dim {head_dim} is not a multiple of 16 (an nvfp4 row has one scale per 16 elements)"
            ));
        }
        Ok(())
    }

    /// Bytes of one row for a head of `head_dim` elements.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        self.code_bytes(head_dim) + self.scale_bytes(head_dim)
    }
    /// Bytes of element codes in one row.
    pub fn code_bytes(self, head_dim: usize) -> usize {
        match self {
            RowFormat::Nvfp4 => head_dim / 2,
            RowFormat::Fp8 => head_dim,
            RowFormat::Bf16 => head_dim * 2,
            RowFormat::F32 => head_dim * 4,
        }
    }
    /// Bytes of block scales in one row (NVFP4: one E4M3 per 16 elements).
    pub fn scale_bytes(self, head_dim: usize) -> usize {
        match self {
            RowFormat::Nvfp4 => head_dim / 16,
            _ => 0,
        }
    }
    /// Lower-case name, as in the metadata and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            RowFormat::Nvfp4 => "nvfp4",
            RowFormat::Fp8 => "fp8",
            RowFormat::Bf16 => "bf16",
            RowFormat::F32 => "f32",
        }
    }
    /// Parses a name.
    pub fn parse(s: &str) -> Result<RowFormat> {
        match s.to_ascii_lowercase().as_str() {
            "nvfp4" => Ok(RowFormat::Nvfp4),
            "fp8" | "f8_e4m3" => Ok(RowFormat::Fp8),
            "bf16" => Ok(RowFormat::Bf16),
            "f32" => Ok(RowFormat::F32),
            _ => Err(Error::Format(format!(
                "unknown row format '{s}' (expected nvfp4, fp8, bf16 or f32)"
            ))),
        }
    }
    /// The kernels' `FMT_*` value of this format (`kernels/ple_kernels.cu`).
    pub fn kernel_code(self) -> i32 {
        match self {
            RowFormat::Nvfp4 => 1,
            RowFormat::Fp8 => 2,
            RowFormat::Bf16 => 3,
            RowFormat::F32 => 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_params_match_spec() {
        let p = HashParams::derive(&ModelConfig::default());
        assert_eq!(
            p.multipliers,
            vec![23703573157769, 20109073645365, 8052911324071]
        );
        assert_eq!(
            p.head_sizes,
            vec![
                20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
                20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171
            ]
        );
        assert_eq!(p.addressed_rows(), 320_001_446);
        p.validate().unwrap();
    }

    #[test]
    fn row_bytes_per_format() {
        assert_eq!(RowFormat::Nvfp4.row_bytes(HEAD_DIM), 90);
        assert_eq!(RowFormat::Fp8.row_bytes(HEAD_DIM), 160);
        assert_eq!(RowFormat::Bf16.row_bytes(HEAD_DIM), 320);
        assert_eq!(RowFormat::F32.row_bytes(HEAD_DIM), 640);
        assert_eq!(RowFormat::parse("f32").unwrap(), RowFormat::F32);
        assert_eq!(RowFormat::F32.name(), "f32");
    }
}
