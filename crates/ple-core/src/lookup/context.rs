//! Request context: batch validation, stateless context and tracked per-request history
//! (`docs/FORMAT.md#the-n-gram-hash`, the context rule and its invariants 1–3).
//!
//! The context of the token at position `p` of a sequence `t` is, for `k = 1 ..= ngram_size - 1`,
//! `ctx_k = t[p-k]` if `p-k >= s`, else EOS, where `s` is one past the last EOS strictly before `p`
//! (or 0). So an EOS cuts all older context, the current token being EOS does not cut its own
//! context, and positions before 0 read EOS. Equivalently, walking back from `p`: `ctx_1 = t[p-1]`
//! and `ctx_k = EOS` if `ctx_{k-1}` is EOS, else `t[p-k]`.
//!
//! A step's tokens come in a [`Batch`] of spans, one per request, each at consecutive positions.
//! The tokens just before a span come either from the caller (stateless mode, `Batch::context`)
//! or from a [`Tracker`] that remembers each request's recent tokens by position (tracked mode).
//! Per-token batches (llama.cpp's shape: tokens in any order, each with its own request id) are
//! grouped into this form by [`crate::lookup::tokens::group_tokens`].
//!
//! How the pipeline uses this module (all on the submitting thread, so errors surface at submit):
//!
//! ```text
//! validate_batch(&b, vocab_size, max_tokens)?;
//! let ctx = resolve_contexts(&b, tracker_or_none, eos, ngram_size)?; // reads, changes nothing
//! if b.context.is_none() { tracker.commit(&b)?; }                    // ple_submit only
//! compute_ids(&hasher, &b, &ctx, &mut ids);                          // per chunk, on the worker
//! ```

use crate::error::{Error, Result};
use crate::lookup::hash::Hasher;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;

/// A borrowed view of one step's batch (the C `ple_batch`, checked for NULLs and lengths).
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub tokens: &'a [i32],
    pub positions: &'a [i32],
    pub request_ids: &'a [u64],
    /// `num_requests + 1` offsets into `tokens`.
    pub query_start: &'a [u32],
    /// Stateless mode: `[num_requests][ngram_size - 1]`, oldest first.
    pub context: Option<&'a [i32]>,
}

impl Batch<'_> {
    /// Tokens in the batch.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Requests (spans) in the batch.
    pub fn num_requests(&self) -> usize {
        self.request_ids.len()
    }

    /// The token range of request `i`. Only meaningful for a batch that passed validation.
    pub fn span(&self, i: usize) -> Range<usize> {
        self.query_start[i] as usize..self.query_start[i + 1] as usize
    }
}

fn err<T>(msg: String) -> Result<T> {
    Err(Error::InvalidArgument(msg))
}

/// Shape checks that every use of a batch relies on: lengths, spans tiling the tokens, unique
/// request ids, non-negative positions consecutive within each span.
/// The first repeated id: `(j, i)` with `ids[j] == ids[i]`, `j < i`, `i` as small as possible.
/// A decode batch has a few requests: compared pairwise (no hashing, no allocation); big
/// batches go through a map.
fn first_duplicate(ids: &[u64]) -> Option<(usize, usize)> {
    if ids.len() <= 32 {
        for i in 1..ids.len() {
            if let Some(j) = ids[..i].iter().position(|&x| x == ids[i]) {
                return Some((j, i));
            }
        }
        return None;
    }
    let mut seen: HashMap<u64, usize> = HashMap::with_capacity(ids.len());
    for (i, &id) in ids.iter().enumerate() {
        if let Some(first) = seen.insert(id, i) {
            return Some((first, i));
        }
    }
    None
}

fn check_structure(b: &Batch) -> Result<()> {
    let n = b.tokens.len();
    if b.positions.len() != n {
        return err(format!(
            "batch has {n} tokens but {} positions",
            b.positions.len()
        ));
    }
    let r = b.request_ids.len();
    if b.query_start.len() != r + 1 {
        return err(format!(
            "batch has {r} requests but {} query_start offsets (expected {})",
            b.query_start.len(),
            r + 1
        ));
    }
    if b.query_start[0] != 0 {
        return err(format!(
            "batch.query_start[0] is {}, expected 0",
            b.query_start[0]
        ));
    }
    for i in 0..r {
        let (a, e) = (b.query_start[i], b.query_start[i + 1]);
        if e < a {
            return err(format!(
                "batch.query_start decreases at request {i} (id {}): {a} then {e}",
                b.request_ids[i]
            ));
        }
        if e as usize > n {
            return err(format!(
                "request {i} (id {}) ends at token {e}, past the batch's {n} tokens",
                b.request_ids[i]
            ));
        }
    }
    if b.query_start[r] as usize != n {
        return err(format!(
            "batch.query_start[{r}] is {}, expected num_tokens {n} (spans must cover every token)",
            b.query_start[r]
        ));
    }
    if let Some((first, i)) = first_duplicate(b.request_ids) {
        return err(format!(
            "request id {} appears twice in the batch (requests {first} and {i})",
            b.request_ids[i]
        ));
    }
    for i in 0..r {
        let span = b.span(i);
        let id = b.request_ids[i];
        if span.is_empty() {
            continue;
        }
        let p0 = b.positions[span.start];
        if p0 < 0 {
            return err(format!(
                "request {i} (id {id}) token {}: negative position {p0}",
                span.start
            ));
        }
        for j in span.start + 1..span.end {
            let (prev, cur) = (b.positions[j - 1], b.positions[j]);
            if prev.checked_add(1) != Some(cur) {
                return err(format!(
                    "request {i} (id {id}) token {j}: position {cur} follows position {prev} (positions must be consecutive within a span)"
                ));
            }
        }
    }
    Ok(())
}

/// Checks a batch before anything is done with it: `1 <= num_tokens <= max_tokens`, token ids in
/// `[0, vocab_size)`, spans tiling the tokens (`query_start[0] = 0`, non-decreasing, last =
/// `num_tokens`), request ids unique, positions non-negative and consecutive within each span,
/// stateless context tokens in `[0, vocab_size)`. Errors are [`Error::InvalidArgument`] naming the
/// request (index and id), the token index and the offending values.
pub fn validate_batch(b: &Batch, vocab_size: u32, max_tokens: u32) -> Result<()> {
    let n = b.tokens.len();
    if n == 0 {
        return err("batch has no tokens (num_tokens is 0)".into());
    }
    if n > max_tokens as usize {
        return err(format!(
            "batch has {n} tokens, more than max_tokens_per_step {max_tokens}"
        ));
    }
    check_structure(b)?;
    let in_vocab = |t: i32| t >= 0 && (t as u32) < vocab_size;
    for i in 0..b.num_requests() {
        for j in b.span(i) {
            let t = b.tokens[j];
            if !in_vocab(t) {
                return err(format!(
                    "request {i} (id {}) token {j} (position {}): token id {t} outside [0, {vocab_size})",
                    b.request_ids[i], b.positions[j]
                ));
            }
        }
    }
    if let Some(c) = b.context {
        let r = b.num_requests();
        let per = c.len().checked_div(r).unwrap_or(0);
        for (k, &t) in c.iter().enumerate() {
            if !in_vocab(t) {
                let i = k.checked_div(per).unwrap_or(0);
                return err(format!(
                    "request {i} (id {}) context token {}: token id {t} outside [0, {vocab_size})",
                    b.request_ids.get(i).copied().unwrap_or(0),
                    k - i * per
                ));
            }
        }
    }
    Ok(())
}

/// One request's recent tokens: positions `start .. start + toks.len()`.
#[derive(Clone, Debug, Default)]
struct History {
    start: i64,
    toks: VecDeque<i32>,
}

impl History {
    fn end(&self) -> i64 {
        self.start + self.toks.len() as i64
    }

    fn get(&self, pos: i64) -> Option<i32> {
        if pos < self.start {
            return None;
        }
        self.toks.get((pos - self.start) as usize).copied()
    }

    /// Forgets position `p` and everything after it, then appends `tokens` at `p ..`, keeping at
    /// most `window` tokens (the newest).
    fn write(&mut self, p: i64, tokens: &[i32], window: usize) {
        if p <= self.start || p > self.end() {
            // Replaces everything (a restart, a rollback past what is kept, or a gap).
            self.toks.clear();
            self.start = p;
        } else {
            self.toks.truncate((p - self.start) as usize);
        }
        let tail = &tokens[tokens.len().saturating_sub(window)..];
        let drop_new = tokens.len() - tail.len();
        if drop_new > 0 {
            self.toks.clear();
            self.start = p + drop_new as i64;
        }
        self.toks.extend(tail);
        let excess = self.toks.len().saturating_sub(window);
        self.toks.drain(..excess);
        self.start += excess as i64;
    }
}

/// Most requests a [`Tracker`] remembers at once (`PLE_MAX_TRACKED_REQUESTS` in C).
pub const MAX_TRACKED_REQUESTS: usize = 65_536;

/// Tracked mode: each request's most recent tokens by position (at most `history_window` per
/// request), for context across steps and speculative rollback.
///
/// Submitting a span at position `p` reads positions `p-1 ..= p-(ngram_size-1)` (positions below 0
/// read EOS, and nothing older than an EOS is read). A needed position that is not known — a gap,
/// an unknown request at `p > 0`, a rollback further back than the window — is an error, never a
/// guess. Submitting a position again replaces it and forgets every later position.
#[derive(Clone, Debug)]
pub struct Tracker {
    ctx_len: usize,
    eos: i32,
    window: usize,
    reqs: HashMap<u64, History>,
}

impl Tracker {
    /// A tracker for an n-gram hash of `ngram_size` (>= 2) that remembers `history_window`
    /// (>= ngram_size - 1) tokens per request.
    pub fn new(ngram_size: u32, eos: i32, history_window: u32) -> Result<Tracker> {
        if ngram_size < 2 {
            return err(format!("ngram_size {ngram_size} < 2"));
        }
        if (history_window as u64) < ngram_size as u64 - 1 {
            return err(format!(
                "history_window {history_window} is smaller than the {} context tokens of ngram_size {ngram_size}",
                ngram_size - 1
            ));
        }
        Ok(Tracker {
            ctx_len: ngram_size as usize - 1,
            eos,
            window: history_window as usize,
            reqs: HashMap::new(),
        })
    }

    /// Tokens remembered per request.
    pub fn history_window(&self) -> usize {
        self.window
    }

    /// Requests with remembered tokens.
    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }

    /// The positions remembered for request `id` (`start..end`), if any.
    pub fn known_positions(&self, id: u64) -> Option<Range<i64>> {
        self.reqs.get(&id).map(|h| h.start..h.end())
    }

    /// Forgets request `id`; returns whether it was known.
    pub fn release(&mut self, id: u64) -> bool {
        self.reqs.remove(&id).is_some()
    }

    /// The tokens just before each span of `b`, `[num_requests][ngram_size - 1]` oldest first
    /// (the layout of [`Batch::context`]), with positions below 0 and everything older than an
    /// EOS read as EOS; EOS for empty spans. Reads only: the history is not changed.
    pub fn resolve(&self, b: &Batch) -> Result<Vec<i32>> {
        check_structure(b)?;
        let k = self.ctx_len;
        let mut out = vec![self.eos; b.num_requests() * k];
        for i in 0..b.num_requests() {
            let span = b.span(i);
            if span.is_empty() {
                continue;
            }
            let id = b.request_ids[i];
            let p = b.positions[span.start] as i64;
            let hist = self.reqs.get(&id);
            let slot = &mut out[i * k..(i + 1) * k];
            for j in 1..=k {
                let pos = p - j as i64;
                if pos < 0 {
                    break;
                }
                match hist.and_then(|h| h.get(pos)) {
                    Some(t) => {
                        slot[k - j] = t;
                        if t == self.eos {
                            break;
                        }
                    }
                    None => {
                        let known = match hist {
                            Some(h) if !h.toks.is_empty() => {
                                format!("positions {}..={} are known", h.start, h.end() - 1)
                            }
                            _ => "no tokens of it are known".to_string(),
                        };
                        return err(format!(
                            "missing context: request {i} (id {id}) starts at position {p} but position {pos} is not known ({known}; history window {}): submit every position in order, or pass the context (stateless mode)",
                            self.window
                        ));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Refuses a batch that would make more than [`MAX_TRACKED_REQUESTS`] requests tracked at
    /// once (`Error::State`): requests are forgotten only by `release`, never evicted, since an
    /// evicted request's next span would read wrong context.
    pub fn check_room(&self, b: &Batch) -> Result<()> {
        // far from the bound (every step of a running server): no per-request lookups
        if self.reqs.len() + b.request_ids.len() <= MAX_TRACKED_REQUESTS {
            return Ok(());
        }
        check_structure(b)?;
        let new = (0..b.num_requests())
            .filter(|&i| !b.span(i).is_empty() && !self.reqs.contains_key(&b.request_ids[i]))
            .count();
        if self.reqs.len() + new > MAX_TRACKED_REQUESTS {
            return Err(Error::State(format!(
                "{} requests are tracked and this batch adds {new}: at most {MAX_TRACKED_REQUESTS} \
                 are tracked at once; release finished requests (ple_release_request) or pass \
                 batch.context (stateless mode)",
                self.reqs.len()
            )));
        }
        Ok(())
    }

    /// Records the tokens of `b` (after [`Tracker::resolve`] accepted it): for each span at
    /// position `p`, forgets positions `>= p` and stores the span's tokens. Fails only if `b` is
    /// malformed, and then changes nothing.
    pub fn commit(&mut self, b: &Batch) -> Result<()> {
        check_structure(b)?;
        for i in 0..b.num_requests() {
            let span = b.span(i);
            if span.is_empty() {
                continue;
            }
            let p = b.positions[span.start] as i64;
            self.reqs
                .entry(b.request_ids[i])
                .or_default()
                .write(p, &b.tokens[span], self.window);
        }
        Ok(())
    }

    /// [`Tracker::resolve`] then, if it succeeded, [`Tracker::commit`]: all or nothing.
    pub fn submit(&mut self, b: &Batch) -> Result<Vec<i32>> {
        let ctx = self.resolve(b)?;
        self.commit(b)?;
        Ok(ctx)
    }
}

/// The context of every token of `b`: `[num_tokens][ngram_size - 1]`, ctx_1 (the previous
/// token) first, with the EOS-cut rule applied within the span and across its start.
///
/// The tokens before each span come from `b.context` when present (stateless mode; its slots for
/// positions below 0 must hold EOS), else from `tracker` (read only; see [`Tracker::commit`]);
/// with neither it is an error. Call [`validate_batch`] first: this checks the batch's shape but
/// not its token ranges.
pub fn resolve_contexts(
    b: &Batch,
    tracker: Option<&Tracker>,
    eos: i32,
    ngram_size: u32,
) -> Result<Vec<i32>> {
    check_structure(b)?;
    resolve_contexts_checked(b, tracker, eos, ngram_size)
}

/// [`resolve_contexts`] for a batch whose structure [`validate_batch`] already checked.
pub(crate) fn resolve_contexts_checked(
    b: &Batch,
    tracker: Option<&Tracker>,
    eos: i32,
    ngram_size: u32,
) -> Result<Vec<i32>> {
    if ngram_size < 2 {
        return err(format!("ngram_size {ngram_size} < 2"));
    }
    let k = ngram_size as usize - 1;
    let r = b.num_requests();
    let owned;
    let pre: &[i32] = match (b.context, tracker) {
        (Some(c), _) => {
            if c.len() != r * k {
                return err(format!(
                    "batch.context has {} tokens, expected {r} requests x {k}",
                    c.len()
                ));
            }
            for i in 0..r {
                let span = b.span(i);
                if span.is_empty() {
                    continue;
                }
                let p = b.positions[span.start] as i64;
                for s in 0..k {
                    let pos = p - (k - s) as i64;
                    let t = c[i * k + s];
                    if pos < 0 && t != eos {
                        return err(format!(
                            "request {i} (id {}) context token {s} stands for position {pos} < 0 and must be EOS ({eos}), got {t}",
                            b.request_ids[i]
                        ));
                    }
                }
            }
            c
        }
        (None, Some(t)) => {
            if t.ctx_len != k || t.eos != eos {
                return err(format!(
                    "tracker was made for ngram_size {} / eos {}, not {ngram_size} / {eos}",
                    t.ctx_len + 1,
                    t.eos
                ));
            }
            owned = t.resolve(b)?;
            &owned
        }
        (None, None) => {
            return err(
                "batch has no context and this handle does not track requests (pass batch.context)"
                    .into(),
            );
        }
    };
    let mut out = vec![eos; b.num_tokens() * k];
    let mut win = vec![eos; k]; // win[j] = ctx_{j+1}, cut applied
    for i in 0..r {
        let span = b.span(i);
        // Context of the span's first token, from the oldest-first slots.
        let slots = &pre[i * k..(i + 1) * k];
        let mut cut = false;
        for j in 0..k {
            win[j] = if cut { eos } else { slots[k - 1 - j] };
            cut = win[j] == eos;
        }
        let dst = out[span.start * k..span.end * k].chunks_exact_mut(k);
        if k == 2 {
            // The shipped model, without the slice shuffling.
            let (mut c1, mut c2) = (win[0], win[1]);
            for (o, &cur) in dst.zip(&b.tokens[span]) {
                o[0] = c1;
                o[1] = c2;
                (c1, c2) = if cur == eos { (eos, eos) } else { (cur, c1) };
            }
            continue;
        }
        for (o, &cur) in dst.zip(&b.tokens[span]) {
            o.copy_from_slice(&win);
            // Shift in the current token; an EOS cuts everything older.
            if cur == eos {
                win.fill(eos);
            } else {
                win.copy_within(0..k - 1, 1);
                win[0] = cur;
            }
        }
    }
    Ok(out)
}

/// The row ids of every token of `b` into `out` (`[num_tokens][num_heads]`), from the per-token
/// context `ctx` of [`resolve_contexts`]. Panics on mismatched lengths.
pub fn compute_ids(hasher: &Hasher, b: &Batch, ctx: &[i32], out: &mut [u64]) {
    hasher.ids_for_tokens(b.tokens, ctx, out);
}

/// [`compute_ids`] into signed ids, as `ple_ngram_ids` returns them (ids are below 2^40).
pub fn compute_ids_i64(hasher: &Hasher, b: &Batch, ctx: &[i32], out: &mut [i64]) {
    // SAFETY: i64 and u64 have the same size and alignment and every bit pattern is valid for
    // both; the slice is borrowed mutably for the whole call.
    let out = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u64, out.len()) };
    hasher.ids_for_tokens(b.tokens, ctx, out);
}

#[cfg(test)]
mod tests;
