//! Per-token batches: the shape of llama.cpp's `llama_batch`, where every token carries its own
//! request id and position and a step's tokens may come in any order.
//!
//! A [`TokenBatch`] is grouped into the offsets form ([`Batch`]) the rest of the lookup works on:
//! requests in order of their first token in the batch, each request's tokens by position. The
//! grouping keeps the permutation ([`Grouped::order`]) so that everything a step produces per token
//! (row ids, staged rows, dequantised rows) is put back into the caller's token order. Row ids do
//! not depend on the order: the id of a token depends only on the token and the tokens before it
//! in its own request, which the grouped batch presents exactly as the offsets form would.
//!
//! Rules (checked by [`group_tokens`], errors naming the caller's token indices):
//! - `tokens`, `positions` and `request_ids` have one entry per token;
//! - positions are non-negative, and each request's positions in the step are distinct and
//!   consecutive (`p, p+1, …, p+m-1` in any order);
//! - stateless `context` is `[num_requests][ngram_size - 1]` with the requests in order of their
//!   first token in the batch: the tokens before the request's lowest position, oldest first.

use crate::error::{Error, Result};
use crate::lookup::context::Batch;
use std::collections::HashMap;

/// A borrowed view of one step's per-token batch (the C `ple_token_batch`, checked for NULLs).
#[derive(Clone, Copy, Debug)]
pub struct TokenBatch<'a> {
    pub tokens: &'a [i32],
    pub positions: &'a [i32],
    /// `[num_tokens]`: the request each token belongs to.
    pub request_ids: &'a [u64],
    /// Stateless mode: `[num_requests][ngram_size - 1]`, requests in order of first appearance.
    pub context: Option<&'a [i32]>,
}

/// A [`TokenBatch`] regrouped into the offsets form, with the way back to the caller's order.
#[derive(Clone, Debug)]
pub struct Grouped<'a> {
    tokens: Vec<i32>,
    positions: Vec<i32>,
    request_ids: Vec<u64>,
    query_start: Vec<u32>,
    context: Option<&'a [i32]>,
    /// `order[g]` = the caller's index of grouped token `g`; `None` when the caller's order is
    /// already grouped (the identity).
    order: Option<Vec<u32>>,
}

impl Grouped<'_> {
    /// Requests in the batch.
    pub fn num_requests(&self) -> usize {
        self.request_ids.len()
    }

    /// The same grouping with stateless `context` (`[num_requests][ngram_size - 1]`, requests in
    /// order of first appearance) or none (tracked mode).
    pub fn with_context<'b>(self, context: Option<&'b [i32]>) -> Grouped<'b> {
        Grouped { context, ..self }
    }

    /// The grouped batch, offsets form.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            request_ids: &self.request_ids,
            query_start: &self.query_start,
            context: self.context,
        }
    }

    /// `order[g]` = the caller's index of grouped token `g`, or `None` for the identity.
    pub fn order(&self) -> Option<&[u32]> {
        self.order.as_deref()
    }

    /// Rows of `width` values in grouped order, put into the caller's order.
    pub fn to_caller_order<T: Copy>(&self, grouped: &[T], width: usize) -> Vec<T> {
        match &self.order {
            None => grouped.to_vec(),
            Some(o) => scatter_rows(grouped, o, width),
        }
    }
}

/// `out[order[g]] = src[g]` for rows of `width` values. Panics unless `src` holds
/// `order.len()` rows and `order` is a permutation.
pub fn scatter_rows<T: Copy>(src: &[T], order: &[u32], width: usize) -> Vec<T> {
    assert_eq!(src.len(), order.len() * width, "one row per token");
    let mut out = src.to_vec();
    for (g, &c) in order.iter().enumerate() {
        let c = c as usize;
        out[c * width..(c + 1) * width].copy_from_slice(&src[g * width..(g + 1) * width]);
    }
    out
}

fn err<T>(msg: String) -> Result<T> {
    Err(Error::InvalidArgument(msg))
}

/// Each token's request index, requests numbered in order of first appearance; and the
/// distinct ids in that order.
fn number_requests(ids: &[u64]) -> (Vec<u32>, Vec<u64>) {
    let mut distinct: Vec<u64> = Vec::new();
    let mut idx = Vec::with_capacity(ids.len());
    let mut map: HashMap<u64, u32> = HashMap::new();
    for &id in ids {
        let r = if distinct.len() <= 16 && map.is_empty() {
            // a decode step has a few requests: a linear search, no hashing
            match distinct.iter().position(|&x| x == id) {
                Some(r) => r as u32,
                None => {
                    distinct.push(id);
                    if distinct.len() > 16 {
                        map.extend(distinct.iter().enumerate().map(|(i, &x)| (x, i as u32)));
                    }
                    distinct.len() as u32 - 1
                }
            }
        } else {
            *map.entry(id).or_insert_with(|| {
                distinct.push(id);
                distinct.len() as u32 - 1
            })
        };
        idx.push(r);
    }
    (idx, distinct)
}

/// Groups a per-token batch into the offsets form (see the module rules). Token ids, the token
/// count and the context's length and values are checked afterwards by
/// [`crate::lookup::context::validate_batch`] and the context resolution, on the grouped batch.
pub fn group_tokens<'a>(b: &TokenBatch<'a>) -> Result<Grouped<'a>> {
    let n = b.tokens.len();
    if b.positions.len() != n || b.request_ids.len() != n {
        return err(format!(
            "per-token batch has {n} tokens, {} positions and {} request ids (one each per token)",
            b.positions.len(),
            b.request_ids.len()
        ));
    }
    if let Some(i) = b.positions.iter().position(|&p| p < 0) {
        return err(format!(
            "token {i} (request id {}): negative position {}",
            b.request_ids[i], b.positions[i]
        ));
    }
    let (req, distinct) = number_requests(b.request_ids);
    // Already grouped and in position order: the identity, no sort.
    let in_order = (1..n).all(|i| {
        // request numbers non-decreasing = each request contiguous (first-appearance numbering)
        req[i] > req[i - 1]
            || req[i] == req[i - 1] && b.positions[i - 1].checked_add(1) == Some(b.positions[i])
    });
    let order: Option<Vec<u32>> = if in_order {
        None
    } else {
        let mut o: Vec<u32> = (0..n as u32).collect();
        o.sort_unstable_by_key(|&i| (req[i as usize], b.positions[i as usize], i));
        Some(o)
    };
    let at = |g: usize| order.as_ref().map_or(g, |o| o[g] as usize);
    let mut query_start = Vec::with_capacity(distinct.len() + 1);
    query_start.push(0u32);
    for g in 1..n {
        let (prev, cur) = (at(g - 1), at(g));
        if req[cur] != req[prev] {
            query_start.push(g as u32);
            continue;
        }
        let (p0, p1) = (b.positions[prev], b.positions[cur]);
        if p0.checked_add(1) != Some(p1) {
            let what = if p1 == p0 {
                "both at position".to_string()
            } else {
                format!("at positions {p0} and {p1}, a gap after position")
            };
            return err(format!(
                "request id {}: tokens {prev} and {cur} {what} {p0} (each request's positions in a step must be distinct and consecutive)",
                b.request_ids[cur]
            ));
        }
    }
    if n > 0 {
        query_start.push(n as u32);
    }
    let pick = |v: &[i32]| -> Vec<i32> { (0..n).map(|g| v[at(g)]).collect() };
    Ok(Grouped {
        tokens: pick(b.tokens),
        positions: pick(b.positions),
        request_ids: distinct,
        query_start,
        context: b.context,
        order,
    })
}

#[cfg(test)]
mod tests;
