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
use std::borrow::Cow;
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
    tokens: Cow<'a, [i32]>,
    positions: Cow<'a, [i32]>,
    request_ids: Vec<u64>,
    query_start: Vec<u32>,
    context: Option<&'a [i32]>,
    /// `order[g]` = the caller's index of grouped token `g`; `None` when the caller's order is
    /// already grouped (the identity).
    order: Option<Vec<u32>>,
}

impl<'a> Grouped<'a> {
    /// Requests in the batch.
    pub fn num_requests(&self) -> usize {
        self.request_ids.len()
    }

    /// The same grouping with stateless `context` (`[num_requests][ngram_size - 1]`, requests in
    /// order of first appearance) or none (tracked mode).
    pub fn with_context(self, context: Option<&'a [i32]>) -> Grouped<'a> {
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

/// The request ids and `query_start` of a batch that already is in the offsets form: each
/// request's tokens contiguous and at consecutive positions. `None` otherwise. One pass, and a
/// search of the requests seen so far only where the request id changes.
fn spans_if_grouped(b: &TokenBatch) -> Option<(Vec<u64>, Vec<u32>)> {
    let (ids, pos) = (b.request_ids, b.positions);
    let mut distinct: Vec<u64> = Vec::new();
    let mut seen: HashMap<u64, ()> = HashMap::new();
    let mut query_start = vec![0u32];
    for i in 0..ids.len() {
        if i > 0 && ids[i] == ids[i - 1] {
            if pos[i - 1].checked_add(1) != Some(pos[i]) {
                return None;
            }
            continue;
        }
        // a new span: its request must not have had one before
        let again = if distinct.len() <= 32 {
            distinct.contains(&ids[i])
        } else {
            if seen.is_empty() {
                seen.extend(distinct.iter().map(|&x| (x, ())));
            }
            seen.insert(ids[i], ()).is_some()
        };
        if again {
            return None;
        }
        distinct.push(ids[i]);
        if i > 0 {
            query_start.push(i as u32);
        }
    }
    if !ids.is_empty() {
        query_start.push(ids.len() as u32);
    }
    Some((distinct, query_start))
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
    if let Some((request_ids, query_start)) = spans_if_grouped(b) {
        return Ok(Grouped {
            tokens: Cow::Borrowed(b.tokens),
            positions: Cow::Borrowed(b.positions),
            request_ids,
            query_start,
            context: b.context,
            order: None,
        });
    }
    let (req, distinct) = number_requests(b.request_ids);
    // Counting placement, no sort: token i of request r goes to slot start[r] + pos - low[r].
    // Positions distinct and consecutive <=> every slot is in range and taken exactly once.
    let r = distinct.len();
    let mut count = vec![0u32; r];
    let mut low = vec![i32::MAX; r];
    for (i, &q) in req.iter().enumerate() {
        count[q as usize] += 1;
        low[q as usize] = low[q as usize].min(b.positions[i]);
    }
    let mut query_start = Vec::with_capacity(r + 1);
    query_start.push(0u32);
    for &c in &count {
        query_start.push(query_start.last().unwrap() + c);
    }
    const FREE: u32 = u32::MAX;
    let mut order = vec![FREE; n];
    for (i, &q) in req.iter().enumerate() {
        let q = q as usize;
        let off = (b.positions[i] - low[q]) as u32; // >= 0: low is the minimum
        if off >= count[q] {
            return err(format!(
                "request id {}: token {i} at position {} but its {} tokens start at position {} (each request's positions in a step must be distinct and consecutive)",
                distinct[q], b.positions[i], count[q], low[q]
            ));
        }
        let slot = &mut order[(query_start[q] + off) as usize];
        if *slot != FREE {
            return err(format!(
                "request id {}: tokens {} and {i} both at position {} (each request's positions in a step must be distinct and consecutive)",
                distinct[q], *slot, b.positions[i]
            ));
        }
        *slot = i as u32;
    }
    let pick = |v: &[i32]| -> Vec<i32> { order.iter().map(|&i| v[i as usize]).collect() };
    Ok(Grouped {
        tokens: Cow::Owned(pick(b.tokens)),
        positions: Cow::Owned(pick(b.positions)),
        request_ids: distinct,
        query_start,
        context: b.context,
        order: Some(order),
    })
}

#[cfg(test)]
mod tests;
