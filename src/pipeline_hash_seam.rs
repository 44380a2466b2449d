//! HASH SEAM — a private, minimal stand-in for `crate::hash` and `crate::context` so the step
//! pipeline builds and is tested before the hash issue lands.
//!
//! The integrator replaces it by changing ONE line in `src/pipeline.rs` (marked `HASH SEAM`):
//!
//! ```text
//! use crate::pipeline_hash_seam::{Hasher, Tracker, resolve_contexts, validate_batch};
//! // becomes
//! use crate::{context::{Tracker, resolve_contexts, validate_batch}, hash::Hasher};
//! ```
//!
//! and then deleting this file and its `mod` line in `lib.rs`. The names and signatures below are
//! the ones the hash issue specifies:
//! - `Hasher::new(&HashParams) -> Result<Hasher>`, `Hasher::ids(&self, token, ctx, out)` with
//!   `ctx[0] = t[p-1]`, `ctx[1] = t[p-2]` (EOS cut already applied), 16 ids into `out`;
//! - `validate_batch(b, vocab_size, max_tokens) -> Result<()>`;
//! - `Tracker::new(history_window)`, `resolve`, `commit(b)`, `release(id)`;
//! - `resolve_contexts(b, tracker, eos, ngram_size) -> Result<Vec<i32>>`: per token
//!   `ngram_size - 1` context ids, ctx1 first.
//!
//! What this version is: the plain rule of SPEC §3 (ids with `%`, no fast modulo), the segment
//! rule for context, and a simple per-request history. It is correct but not tuned.

use crate::context::Batch;
use crate::error::{Error, Result};
use crate::model::HashParams;
use std::collections::HashMap;

/// Row ids of the n-gram hash, plain `%` (SPEC §3).
#[derive(Clone, Debug)]
pub struct Hasher {
    mult: Vec<u64>,
    sizes: Vec<u64>,
    offsets: Vec<u64>,
    heads_per_ngram: usize,
}

impl Hasher {
    pub fn new(p: &HashParams) -> Result<Hasher> {
        p.validate()?;
        Ok(Hasher {
            mult: p.multipliers.clone(),
            sizes: p.head_sizes.clone(),
            offsets: p.offsets.clone(),
            heads_per_ngram: p.heads_per_ngram as usize,
        })
    }

    /// The row ids of `token` with context `ctx` (`ctx[k-1] = t[p-k]`, EOS cut applied) into
    /// `out[..num_heads]`.
    pub fn ids(&self, token: i32, ctx: &[i32], out: &mut [u64]) {
        let mut mix = (token as u64).wrapping_mul(self.mult[0]);
        let hpn = self.heads_per_ngram;
        for (order, (&c, &m)) in ctx.iter().zip(&self.mult[1..]).enumerate() {
            mix ^= (c as u64).wrapping_mul(m);
            let heads = order * hpn..(order + 1) * hpn;
            for ((o, &size), &off) in out[heads.clone()]
                .iter_mut()
                .zip(&self.sizes[heads.clone()])
                .zip(&self.offsets[heads])
            {
                *o = mix % size + off;
            }
        }
    }
}

/// Structural checks of a batch (SPEC §9): sizes, offsets, unique request ids, token range,
/// consecutive non-negative positions inside each span.
pub fn validate_batch(b: &Batch, vocab_size: u32, max_tokens: u32) -> Result<()> {
    let n = b.tokens.len();
    if n == 0 || n > max_tokens as usize {
        return crate::invalid!(
            "batch.num_tokens {n} not in [1, max_tokens_per_step {max_tokens}]"
        );
    }
    if b.positions.len() != n {
        return crate::invalid!("batch has {} positions for {n} tokens", b.positions.len());
    }
    let r = b.request_ids.len();
    if r == 0 {
        return crate::invalid!("batch.num_requests is 0");
    }
    if b.query_start.len() != r + 1 || b.query_start[0] != 0 || b.query_start[r] as usize != n {
        return crate::invalid!(
            "batch.query_start must have num_requests + 1 entries from 0 to num_tokens {n}"
        );
    }
    for w in b.query_start.windows(2) {
        if w[1] < w[0] {
            return crate::invalid!("batch.query_start is decreasing ({} then {})", w[0], w[1]);
        }
    }
    let mut seen = std::collections::HashSet::with_capacity(r);
    for &id in b.request_ids {
        if !seen.insert(id) {
            return crate::invalid!("request id {id} appears twice in one batch");
        }
    }
    for (i, &t) in b.tokens.iter().enumerate() {
        if t < 0 || t as u32 >= vocab_size {
            return crate::invalid!("token {i} is {t}, not in [0, vocab_size {vocab_size})");
        }
    }
    for (ri, w) in b.query_start.windows(2).enumerate() {
        let (s, e) = (w[0] as usize, w[1] as usize);
        for i in s..e {
            let p = b.positions[i];
            if p < 0 {
                return crate::invalid!("position of token {i} is {p} (negative)");
            }
            if i > s && p != b.positions[i - 1] + 1 {
                return crate::invalid!(
                    "positions of request {} are not consecutive at token {i} ({} then {p})",
                    b.request_ids[ri],
                    b.positions[i - 1]
                );
            }
        }
    }
    if let Some(c) = b.context {
        for &t in c {
            if t < 0 || t as u32 >= vocab_size {
                return crate::invalid!("context token {t} not in [0, vocab_size {vocab_size})");
            }
        }
    }
    Ok(())
}

struct History {
    /// One past the last position held.
    end: i64,
    /// The tokens at positions `end - toks.len() .. end`.
    toks: Vec<i32>,
}

/// Tracked mode: the recent tokens of each request, keyed by request id and position.
pub struct Tracker {
    window: usize,
    reqs: HashMap<u64, History>,
}

impl Tracker {
    pub fn new(history_window: u32) -> Tracker {
        Tracker {
            window: history_window.max(2) as usize,
            reqs: HashMap::new(),
        }
    }

    /// The token at position `pos` of request `id`, if remembered.
    pub fn resolve(&self, id: u64, pos: i64) -> Option<i32> {
        let h = self.reqs.get(&id)?;
        let start = h.end - h.toks.len() as i64;
        if pos >= start && pos < h.end {
            Some(h.toks[(pos - start) as usize])
        } else {
            None
        }
    }

    /// Records the batch's spans (rolling back positions submitted before).
    pub fn commit(&mut self, b: &Batch) {
        for (ri, w) in b.query_start.windows(2).enumerate() {
            let (s, e) = (w[0] as usize, w[1] as usize);
            if s == e {
                continue;
            }
            let id = b.request_ids[ri];
            let p = b.positions[s] as i64;
            let h = self.reqs.entry(id).or_insert(History {
                end: p,
                toks: Vec::new(),
            });
            let start = h.end - h.toks.len() as i64;
            if p >= start && p <= h.end {
                h.toks.truncate((p - start) as usize);
            } else {
                h.toks.clear();
            }
            h.toks.extend_from_slice(&b.tokens[s..e]);
            h.end = p + (e - s) as i64;
            if h.toks.len() > self.window {
                let cut = h.toks.len() - self.window;
                h.toks.drain(..cut);
            }
        }
    }

    pub fn release(&mut self, id: u64) {
        self.reqs.remove(&id);
    }
}

/// Per-token context, `num_tokens × (ngram_size - 1)`, ctx1 first, with the EOS cut of SPEC §3.
/// Stateless mode (`b.context` set) uses the given tokens before each span; tracked mode reads the
/// tracker. Missing context (a span at position p > 0 whose earlier tokens are unknown) is an error.
pub fn resolve_contexts(
    b: &Batch,
    tracker: Option<&Tracker>,
    eos: i32,
    ngram_size: u32,
) -> Result<Vec<i32>> {
    let k = ngram_size as usize - 1;
    let mut out = vec![eos; b.tokens.len() * k];
    let mut window: Vec<i32> = Vec::new();
    for (ri, w) in b.query_start.windows(2).enumerate() {
        let (s, e) = (w[0] as usize, w[1] as usize);
        if s == e {
            continue;
        }
        let id = b.request_ids[ri];
        let p = b.positions[s] as i64;
        // window = the k tokens before the span (oldest first, EOS before the sequence start),
        // then the span
        window.clear();
        if let Some(c) = b.context {
            window.extend_from_slice(&c[ri * k..ri * k + k]);
        } else {
            // walk back from p-1; once an EOS is found older tokens are never read
            let mut before = vec![eos; k];
            for j in 1..=k {
                let q = p - j as i64;
                if q < 0 {
                    break;
                }
                let t = tracker.and_then(|t| t.resolve(id, q)).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "request {id}: span starts at position {p} but the token at position {q} \
                         is unknown (submit the sequence from position 0, or pass batch.context)"
                    ))
                })?;
                before[k - j] = t;
                if t == eos {
                    break;
                }
            }
            window.extend_from_slice(&before);
        }
        window.extend_from_slice(&b.tokens[s..e]);
        for i in 0..e - s {
            let cur = k + i;
            let mut cut = false;
            for j in 1..=k {
                let v = if cut { eos } else { window[cur - j] };
                out[(s + i) * k + j - 1] = v;
                if v == eos {
                    cut = true;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelConfig;

    #[test]
    fn spec_test_vector() {
        let h = Hasher::new(&HashParams::derive(&ModelConfig::default())).unwrap();
        let eos = crate::model::EOS_TOKEN_ID;
        let mut out = [0u64; 16];
        h.ids(9707, &[eos, eos], &mut out);
        assert_eq!(
            out,
            [
                16410909, 39682429, 55103279, 60931720, 87006904, 116506179, 131512017, 152932897,
                169641436, 182022480, 209277433, 237891023, 256841529, 277007269, 290665954,
                300984276
            ]
        );
    }

    #[test]
    fn segment_rule_and_tracking() {
        let eos = 9;
        let toks = [1, 2, eos, 3, 4];
        let pos = [0, 1, 2, 3, 4];
        let b = Batch {
            tokens: &toks,
            positions: &pos,
            request_ids: &[7],
            query_start: &[0, 5],
            context: None,
        };
        let t = Tracker::new(8);
        let c = resolve_contexts(&b, Some(&t), eos, 3).unwrap();
        assert_eq!(c, vec![eos, eos, 1, eos, 2, 1, eos, eos, 3, eos]);
        // chunked: first 3 tokens, then 2 with tracked history
        let mut t = Tracker::new(8);
        let b1 = Batch {
            tokens: &toks[..3],
            positions: &pos[..3],
            query_start: &[0, 3],
            ..b
        };
        t.commit(&b1);
        let b2 = Batch {
            tokens: &toks[3..],
            positions: &pos[3..],
            query_start: &[0, 2],
            ..b
        };
        assert_eq!(
            resolve_contexts(&b2, Some(&t), eos, 3).unwrap(),
            vec![eos, eos, 3, eos]
        );
        // unknown request at p > 0 → error
        let b3 = Batch {
            request_ids: &[8],
            ..b2
        };
        assert!(resolve_contexts(&b3, Some(&t), eos, 3).is_err());
    }
}
