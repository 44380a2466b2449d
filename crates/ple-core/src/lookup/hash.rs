//! N-gram row ids (`docs/FORMAT.md#the-n-gram-hash`), bit-exact with the reference model.
//!
//! For the token `t` at position `p` with context `ctx[k-1] = ctx_k` (already EOS-cut by
//! [`crate::lookup::context`]), the order-`k+1` mix is
//!
//! ```text
//! mix_2 = t·m[0] XOR ctx_1·m[1]
//! mix_k = mix_{k-1} XOR ctx_{k-1}·m[k-1]        (k = 3 ..= ngram_size)
//! ```
//!
//! and head `h` (order `h / heads_per_ngram + 2`) gets `id[h] = (mix mod size[h]) + offset[h]`.
//! The reference computes in signed 64-bit; with token ids in `[0, vocab_size)` no product
//! overflows (checked by [`HashParams::validate`]), every mix is below 2^63 and unsigned
//! arithmetic gives the same bits.
//!
//! The modulo is [`FastMod`]: a precomputed reciprocal turns each 64-bit division into two
//! multiplications and a conditional subtraction, exact for every 64-bit dividend and divisor.

use crate::error::Result;
use crate::model::HashParams;
use crate::shard::Heads;

/// Exact `a % d` for any `u64` `a` by a fixed divisor `d >= 1`, without a division instruction:
/// a Barrett reduction with a precomputed 64-bit reciprocal `m = min(floor(2^64 / d), 2^64 - 1)`.
///
/// `q = floor(a·m / 2^64)` is `floor(a / d)` or one less: `a/d - a·m/2^64 = a·(2^64/d - m)/2^64`
/// lies in `[0, 1)` because `0 <= 2^64/d - m < 1` (for `d = 1`, `2^64/d - m = 1` but `a < 2^64`)
/// and `a < 2^64`. So `r = a - q·d` (no overflow: `q·d <= a`) is in `[0, 2d)` and one conditional
/// subtraction finishes. One widening and one plain multiplication per remainder; measured faster
/// than both the `%` instruction and Lemire's 128-bit-reciprocal "fastmod" (see `benches/hash.rs`).
/// Proven equal to `%` over the whole `u64` range by the tests below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastMod {
    /// `min(floor(2^64 / d), 2^64 - 1)`
    m: u64,
    d: u64,
}

impl FastMod {
    /// Precomputes the reciprocal of `d`. Panics if `d` is 0 (use [`FastMod::try_new`] to check).
    pub const fn new(d: u64) -> FastMod {
        assert!(d != 0, "FastMod divisor is 0");
        let m = (1u128 << 64) / d as u128;
        FastMod {
            m: if m > u64::MAX as u128 {
                u64::MAX
            } else {
                m as u64
            },
            d,
        }
    }

    /// `None` for `d = 0`.
    pub const fn try_new(d: u64) -> Option<FastMod> {
        if d == 0 { None } else { Some(FastMod::new(d)) }
    }

    /// The divisor.
    #[inline]
    pub const fn divisor(&self) -> u64 {
        self.d
    }

    /// `a % d`.
    #[inline(always)]
    pub const fn rem(&self, a: u64) -> u64 {
        let q = ((a as u128 * self.m as u128) >> 64) as u64;
        let r = a - q * self.d;
        if r >= self.d { r - self.d } else { r }
    }
}

/// The n-gram hash of one table: multipliers, head moduli and offsets, ready to use.
#[derive(Clone, Debug)]
pub struct Hasher {
    params: HashParams,
    /// `[ngram_size]`: multiplier of the current token, then of ctx_1, ctx_2, ...
    mults: Vec<u64>,
    /// `[num_heads]`
    mods: Vec<FastMod>,
    /// `[num_heads]`
    offsets: Vec<u64>,
    heads_per_ngram: usize,
    ctx_len: usize,
}

impl Hasher {
    /// Builds the hash from validated parameters (`params.validate()` is called here).
    pub fn new(params: &HashParams) -> Result<Hasher> {
        params.validate()?;
        Ok(Hasher {
            params: params.clone(),
            mults: params.multipliers.clone(),
            mods: params.head_sizes.iter().map(|&s| FastMod::new(s)).collect(),
            offsets: params.offsets.clone(),
            heads_per_ngram: params.heads_per_ngram as usize,
            ctx_len: params.ngram_size as usize - 1,
        })
    }

    /// The parameters this hash was built from.
    pub fn params(&self) -> &HashParams {
        &self.params
    }

    /// Ids per token: `(ngram_size - 1) * heads_per_ngram`.
    #[inline]
    pub fn num_heads(&self) -> usize {
        self.mods.len()
    }

    /// Context tokens per token: `ngram_size - 1`.
    #[inline]
    pub fn context_len(&self) -> usize {
        self.ctx_len
    }

    #[inline(always)]
    fn prod(tok: i32, m: u64) -> u64 {
        // Same bits as the reference's signed i64 product (wrapping); never wraps for valid ids.
        (tok as i64 as u64).wrapping_mul(m)
    }

    /// Writes the `num_heads` row ids of `token` into `out`.
    ///
    /// `ctx` holds `ngram_size - 1` tokens, `ctx[0] = ctx_1 = t[p-1]`, `ctx[1] = t[p-2]`, ...,
    /// already EOS-cut (see [`crate::lookup::context`]). Tokens must be in `[0, vocab_size)`; the batch
    /// validation guarantees it. Panics if `ctx` or `out` is too short.
    #[inline]
    pub fn ids(&self, token: i32, ctx: &[i32], out: &mut [u64]) {
        let hpn = self.heads_per_ngram;
        let ctx = &ctx[..self.ctx_len];
        let out = &mut out[..self.mods.len()];
        let mut mix = Self::prod(token, self.mults[0]);
        let orders = out.chunks_exact_mut(hpn).zip(
            self.mods
                .chunks_exact(hpn)
                .zip(self.offsets.chunks_exact(hpn)),
        );
        for ((&c, &m), (out, (mods, offs))) in ctx.iter().zip(&self.mults[1..]).zip(orders) {
            mix ^= Self::prod(c, m);
            for ((dst, md), &off) in out.iter_mut().zip(mods).zip(offs) {
                *dst = md.rem(mix) + off;
            }
        }
    }

    /// [`Hasher::ids`] computed plainly from the parameters, with the `%` operator (tests, bench).
    pub fn ids_reference(&self, token: i32, ctx: &[i32], out: &mut [u64]) {
        let p = &self.params;
        let hpn = p.heads_per_ngram as usize;
        let mut mix = (token as i64).wrapping_mul(p.multipliers[0] as i64);
        for (order, &c) in ctx[..self.ctx_len].iter().enumerate() {
            mix ^= (c as i64).wrapping_mul(p.multipliers[order + 1] as i64);
            for j in 0..hpn {
                let h = order * hpn + j;
                out[h] = (mix as u64 % p.head_sizes[h]) + p.offsets[h];
            }
        }
    }

    fn check_lens(&self, tokens: &[i32], ctx: &[i32], out: &[u64]) {
        assert!(
            ctx.len() == tokens.len() * self.ctx_len
                && out.len() == tokens.len() * self.num_heads(),
            "ids_for_tokens: {} tokens need {} context tokens and {} ids, got {} and {}",
            tokens.len(),
            tokens.len() * self.ctx_len,
            tokens.len() * self.num_heads(),
            ctx.len(),
            out.len()
        );
    }

    /// Ids of many tokens: `ctx` is `[tokens.len()][ngram_size - 1]` (per token, ctx_1 first, as
    /// [`crate::lookup::context::resolve_contexts`] returns it), `out` is `[tokens.len()][num_heads]`.
    /// Single-threaded; callers parallelise over chunks. Panics on mismatched lengths.
    pub fn ids_for_tokens(&self, tokens: &[i32], ctx: &[i32], out: &mut [u64]) {
        self.check_lens(tokens, ctx, out);
        let h = self.num_heads();
        if self.ctx_len == 2 && self.heads_per_ngram == 8 {
            // The shipped model: a monomorphic loop the compiler unrolls.
            for ((&t, c), o) in tokens
                .iter()
                .zip(ctx.chunks_exact(2))
                .zip(out.chunks_exact_mut(16))
            {
                self.ids_3x8(t, [c[0], c[1]], o.try_into().unwrap());
            }
        } else {
            for ((&t, c), o) in tokens
                .iter()
                .zip(ctx.chunks_exact(self.ctx_len))
                .zip(out.chunks_exact_mut(h))
            {
                self.ids(t, c, o);
            }
        }
    }

    /// [`Hasher::ids_for_tokens`] for the heads `heads` only (a head shard, `crate::shard`),
    /// each head's id placed by `starts`: `out` is `[tokens.len()][heads.len()]`, id `j` of a
    /// token being `starts[j]` plus head `heads.get(j)`'s remainder — its row in a file whose
    /// head `j` rows begin at `starts[j]` (the whole table: `starts[j] = offset[heads.get(j)]`).
    /// Only those heads' remainders are computed. Panics on mismatched lengths or heads out of
    /// range.
    pub fn ids_for_heads(
        &self,
        tokens: &[i32],
        ctx: &[i32],
        heads: Heads,
        starts: &[u64],
        out: &mut [u64],
    ) {
        let w = heads.len();
        let whole = heads.is_all(self.num_heads());
        if whole && starts == &self.offsets[..] {
            return self.ids_for_tokens(tokens, ctx, out);
        }
        assert!(
            heads.end() <= self.num_heads()
                && w > 0
                && starts.len() == w
                && ctx.len() == tokens.len() * self.ctx_len
                && out.len() == tokens.len() * w,
            "ids_for_heads: heads {heads:?}, {} starts, {} tokens, {} context, {} ids",
            starts.len(),
            tokens.len(),
            ctx.len(),
            out.len()
        );
        let hpn = self.heads_per_ngram;
        // the orders whose heads the shard has: order k (0-based) holds heads [k·hpn, (k+1)·hpn)
        let last_order = (heads.end() - 1) / hpn;
        for ((&t, c), o) in tokens
            .iter()
            .zip(ctx.chunks_exact(self.ctx_len))
            .zip(out.chunks_exact_mut(w))
        {
            let mut mix = Self::prod(t, self.mults[0]);
            let mut j = 0;
            for (k, &cx) in c[..=last_order].iter().enumerate() {
                mix ^= Self::prod(cx, self.mults[k + 1]);
                // the shard's heads of order k, in order
                while j < w && heads.get(j) < (k + 1) * hpn {
                    o[j] = self.mods[heads.get(j)].rem(mix) + starts[j];
                    j += 1;
                }
            }
        }
    }

    #[inline(always)]
    fn ids_3x8(&self, t: i32, c: [i32; 2], out: &mut [u64; 16]) {
        let b = Self::prod(t, self.mults[0]) ^ Self::prod(c[0], self.mults[1]);
        let c3 = b ^ Self::prod(c[1], self.mults[2]);
        let mods: &[FastMod; 16] = self.mods[..16].try_into().unwrap();
        let offs: &[u64; 16] = self.offsets[..16].try_into().unwrap();
        for h in 0..8 {
            out[h] = mods[h].rem(b) + offs[h];
        }
        for h in 8..16 {
            out[h] = mods[h].rem(c3) + offs[h];
        }
    }

    /// [`Hasher::ids_for_tokens`] with [`Hasher::ids_reference`] (plain `%`).
    pub fn ids_for_tokens_reference(&self, tokens: &[i32], ctx: &[i32], out: &mut [u64]) {
        self.check_lens(tokens, ctx, out);
        for ((&t, c), o) in tokens
            .iter()
            .zip(ctx.chunks_exact(self.ctx_len))
            .zip(out.chunks_exact_mut(self.num_heads()))
        {
            self.ids_reference(t, c, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EOS_TOKEN_ID, ModelConfig};
    use proptest::prelude::*;

    const SPEC_SIZES: [u64; 16] = [
        20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077, 20000081,
        20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171,
    ];

    fn spec_hasher() -> Hasher {
        Hasher::new(&HashParams::derive(&ModelConfig::default())).unwrap()
    }

    #[test]
    fn spec_test_vector() {
        let h = spec_hasher();
        let want: [u64; 16] = [
            16410909, 39682429, 55103279, 60931720, 87006904, 116506179, 131512017, 152932897,
            169641436, 182022480, 209277433, 237891023, 256841529, 277007269, 290665954, 300984276,
        ];
        let mut fast = [0u64; 16];
        let mut slow = [0u64; 16];
        h.ids(9707, &[EOS_TOKEN_ID, EOS_TOKEN_ID], &mut fast);
        h.ids_reference(9707, &[EOS_TOKEN_ID, EOS_TOKEN_ID], &mut slow);
        assert_eq!(fast, want);
        assert_eq!(slow, want);
        let mut batch = [0u64; 16];
        h.ids_for_tokens(&[9707], &[EOS_TOKEN_ID, EOS_TOKEN_ID], &mut batch);
        assert_eq!(batch, want);
    }

    /// The test vector recomputed by hand from the published constants of docs/FORMAT.md (not from
    /// `HashParams::derive`), so the hash formula is checked independently of the derivation.
    #[test]
    fn spec_formula_by_hand() {
        let m: [i64; 3] = [23703573157769, 20109073645365, 8052911324071];
        let eos = EOS_TOKEN_ID as i64;
        let b = (9707 * m[0]) ^ (eos * m[1]);
        let c = b ^ (eos * m[2]);
        let mut off = 0;
        let mut want = [0u64; 16];
        for h in 0..16 {
            let mix = if h < 8 { b } else { c };
            want[h] = (mix % SPEC_SIZES[h] as i64) as u64 + off;
            off += SPEC_SIZES[h];
        }
        let mut got = [0u64; 16];
        spec_hasher().ids(9707, &[EOS_TOKEN_ID, EOS_TOKEN_ID], &mut got);
        assert_eq!(got, want);
    }

    #[test]
    fn invalid_params_are_refused() {
        let mut p = HashParams::derive(&ModelConfig::default());
        p.offsets[3] += 1;
        assert!(Hasher::new(&p).is_err());
        let mut p = HashParams::derive(&ModelConfig::default());
        p.multipliers.pop();
        assert!(Hasher::new(&p).is_err());
        let mut p = HashParams::derive(&ModelConfig::default());
        p.head_sizes[0] = 0;
        assert!(Hasher::new(&p).is_err());
        let mut p = HashParams::derive(&ModelConfig::default());
        p.multipliers[1] = u64::MAX / 2;
        assert!(Hasher::new(&p).is_err());
    }

    fn edge_dividends(d: u64) -> Vec<u64> {
        let mut v = vec![
            0,
            1,
            2,
            u64::MAX,
            u64::MAX - 1,
            1 << 63,
            (1 << 63) - 1,
            (1 << 63) + 1,
        ];
        v.extend([d - 1, d, d.wrapping_add(1), 2 * (d / 2)]);
        for k in [2u64, 3, 1000, u64::MAX / d, u64::MAX / d - 1, (1 << 63) / d] {
            let x = k.wrapping_mul(d);
            if k.checked_mul(d).is_some() {
                v.extend([x.wrapping_sub(1), x, x.wrapping_add(1)]);
            }
        }
        v
    }

    #[test]
    fn fastmod_edge_cases() {
        let mut divisors: Vec<u64> = SPEC_SIZES.to_vec();
        divisors.extend([
            1,
            2,
            3,
            7,
            128,
            (1 << 32) - 1,
            1 << 32,
            (1 << 32) + 1,
            (1 << 40) - 87,
            (1 << 63) - 1,
            1 << 63,
            (1 << 63) + 1,
            u64::MAX - 1,
            u64::MAX,
        ]);
        for d in divisors {
            let f = FastMod::new(d);
            for a in edge_dividends(d) {
                assert_eq!(f.rem(a), a % d, "{a} % {d}");
            }
        }
        assert_eq!(FastMod::try_new(0), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn fastmod_equals_rem_spec_sizes(a in any::<u64>(), h in 0usize..16) {
            let d = SPEC_SIZES[h];
            prop_assert_eq!(FastMod::new(d).rem(a), a % d);
        }

        #[test]
        fn fastmod_equals_rem_any_divisor(a in any::<u64>(), d in 1u64..=u64::MAX) {
            prop_assert_eq!(FastMod::new(d).rem(a), a % d);
        }

        #[test]
        fn fastmod_equals_rem_small_divisor(a in any::<u64>(), d in 1u64..(1 << 40)) {
            prop_assert_eq!(FastMod::new(d).rem(a), a % d);
        }

        /// Divisors spread over every magnitude (log-uniform), dividends too.
        #[test]
        fn fastmod_equals_rem_log_uniform(
            a in any::<u64>(), sa in 0u32..64, d in any::<u64>(), sd in 0u32..64
        ) {
            let (a, d) = (a >> sa, (d >> sd).max(1));
            prop_assert_eq!(FastMod::new(d).rem(a), a % d);
        }

        #[test]
        fn fastmod_near_multiples(k in any::<u64>(), d in 1u64..=u64::MAX, delta in -2i64..=2) {
            let a = (k % (u64::MAX / d).max(1)).wrapping_mul(d).wrapping_add(delta as u64);
            prop_assert_eq!(FastMod::new(d).rem(a), a % d);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Fast ids equal the plain-% reference for the shipped model, any valid tokens.
        #[test]
        fn ids_equal_reference_spec(
            toks in proptest::collection::vec((0i32..248_320, 0i32..248_320, 0i32..248_320), 1..64)
        ) {
            let h = spec_hasher();
            let tokens: Vec<i32> = toks.iter().map(|t| t.0).collect();
            let ctx: Vec<i32> = toks.iter().flat_map(|t| [t.1, t.2]).collect();
            let mut fast = vec![0; tokens.len() * 16];
            let mut slow = vec![0; tokens.len() * 16];
            h.ids_for_tokens(&tokens, &ctx, &mut fast);
            h.ids_for_tokens_reference(&tokens, &ctx, &mut slow);
            prop_assert_eq!(&fast, &slow);
            for (i, ids) in fast.chunks(16).enumerate() {
                let mut one = [0u64; 16];
                h.ids(tokens[i], &ctx[2 * i..2 * i + 2], &mut one);
                prop_assert_eq!(ids, &one[..]);
                for (hd, &id) in ids.iter().enumerate() {
                    let p = h.params();
                    prop_assert!(id >= p.offsets[hd] && id < p.offsets[hd] + p.head_sizes[hd]);
                }
            }
        }

        /// A shard's ids are the whole ids of its heads, each moved to its head's start.
        #[test]
        fn ids_for_heads_are_the_whole_ids_of_those_heads(
            toks in proptest::collection::vec((0i32..248_320, 0i32..248_320, 0i32..248_320), 1..32),
            count in 1u32..=16, pick in any::<u32>(), shift in 0u64..1_000_000
        ) {
            let h = spec_hasher();
            let shard = crate::shard::Shard::new(pick % count, count).unwrap();
            let heads = shard.heads(16);
            // each head's rows start somewhere else (as in a shard table's file)
            let starts: Vec<u64> = (0..heads.len() as u64).map(|j| j * shift).collect();
            let tokens: Vec<i32> = toks.iter().map(|t| t.0).collect();
            let ctx: Vec<i32> = toks.iter().flat_map(|t| [t.1, t.2]).collect();
            let mut whole = vec![0; tokens.len() * 16];
            h.ids_for_tokens_reference(&tokens, &ctx, &mut whole);
            let mut part = vec![0; tokens.len() * heads.len()];
            h.ids_for_heads(&tokens, &ctx, heads, &starts, &mut part);
            let offsets = &h.params().offsets;
            let want: Vec<u64> = whole
                .chunks(16)
                .flat_map(|w| {
                    heads.iter().zip(&starts).map(|(hd, &s)| w[hd] - offsets[hd] + s)
                })
                .collect();
            prop_assert_eq!(part, want);
        }

        /// Other shapes (ngram_size 2..=5, various heads per order, seeds, layers, vocabularies).
        #[test]
        fn ids_equal_reference_other_shapes(
            n in 2u32..=5, hpn in 1u32..=5, seed in any::<u32>(), layer in 0u64..3,
            vocab in 2u32..1_000_000, base in 2u64..100_000,
            raw in proptest::collection::vec(any::<u32>(), 5..40)
        ) {
            let cfg = ModelConfig {
                vocab_size: vocab,
                eos_token_id: (vocab - 1) as i32,
                ngram_size: n,
                heads_per_ngram: hpn,
                ple_embed_dim: (n - 1) * hpn * 4,
                ngram_vocab_size_base: base,
                seed: seed as u64,
                ple_layer_index: layer,
                ..ModelConfig::default()
            };
            let h = Hasher::new(&HashParams::derive(&cfg)).unwrap();
            let k = (n - 1) as usize;
            let toks: Vec<i32> = raw.iter().map(|&r| (r % vocab) as i32).collect();
            let cnt = toks.len() / (k + 1);
            let tokens = &toks[..cnt];
            let ctx = &toks[cnt..cnt + cnt * k];
            let mut fast = vec![0; cnt * h.num_heads()];
            let mut slow = vec![0; cnt * h.num_heads()];
            h.ids_for_tokens(tokens, ctx, &mut fast);
            h.ids_for_tokens_reference(tokens, ctx, &mut slow);
            prop_assert_eq!(fast, slow);
        }
    }
}
