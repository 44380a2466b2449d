//! Rows by the engine's own ids (`ple_submit_ids`, `ple_prefetch_ahead_ids`): an engine that
//! computes the n-gram row ids itself hands `[tokens][num_heads]` whole-table row ids instead of
//! tokens. Each id is checked against its head's rows on the caller's thread (nothing is read, no
//! slot taken, when one is outside); the handle's heads' ids (a head shard: its heads only) are
//! placed in its row file and go through the same pipeline as hashed ones: row cache, DIRECT or
//! MMAP reads, read-ahead, the host and device views. Tracked request history is neither read
//! nor changed. Tested in `step/pipeline/tests/ids.rs`.
//!
//! Also the handle's read-ahead calls (`ple_prefetch_ahead*`): they hash or check the rows and
//! queue them for the runner of `ahead`.

use super::ahead::Runner;
use super::pipeline::Pipeline;
use super::worker::StepInput;
use crate::error::{Error, Result};
use crate::lookup::context::{Batch, resolve_contexts_checked, validate_batch};
use crate::sync::lock;
use std::sync::atomic::Ordering::Acquire;
use std::time::{Duration, Instant};

impl Pipeline {
    /// The 16 row ids of each token of `b` into `out` (`num_tokens × 16`), without side effects:
    /// tracked history is read, not changed.
    pub fn ngram_ids(&self, b: &Batch, out: &mut [i64]) -> Result<()> {
        let meta = self.sh.reader.table.meta();
        validate_batch(b, meta.hash.vocab_size, u32::MAX)?;
        let heads = self.num_heads();
        if out.len() != b.tokens.len() * heads {
            return crate::invalid!(
                "out_ids holds {} ids, {} tokens need {}",
                out.len(),
                b.tokens.len(),
                b.tokens.len() * heads
            );
        }
        let k = meta.ngram_size as usize - 1;
        if let Some(c) = b.context {
            if c.len() != b.request_ids.len() * k {
                return crate::invalid!(
                    "batch.context has {} entries, expected {}",
                    c.len(),
                    b.request_ids.len() * k
                );
            }
        }
        let ctx = {
            let t = lock(&self.tracker);
            resolve_contexts_checked(b, Some(&t), meta.hash.eos_token_id, meta.ngram_size)?
        };
        let mut ids = vec![0u64; heads];
        for (i, &t) in b.tokens.iter().enumerate() {
            self.sh
                .reader
                .hasher
                .ids(t, &ctx[i * k..(i + 1) * k], &mut ids);
            for (o, &v) in out[i * heads..(i + 1) * heads].iter_mut().zip(&ids) {
                *o = v as i64;
            }
        }
        Ok(())
    }

    /// The rows of the handle's row file that `ids` (`[tokens][num_heads]` whole-table ids)
    /// name for the handle's heads, `[tokens][heads]`; `Error::InvalidArgument` naming the token,
    /// the head and the id when an id is outside its head's rows, or when `ids` is not a whole
    /// number of tokens.
    fn rows_of_ids(&self, ids: &[i64]) -> Result<Vec<u64>> {
        let r = &self.sh.reader;
        let hash = &r.table.meta().hash;
        let nh = hash.offsets.len();
        if ids.len() % nh != 0 {
            return crate::invalid!(
                "ids holds {} entries, not a whole number of tokens of {nh} heads",
                ids.len()
            );
        }
        for (i, &id) in ids.iter().enumerate() {
            let (t, h) = (i / nh, i % nh);
            let (lo, hi) = (hash.offsets[h], hash.offsets[h] + hash.head_sizes[h]);
            if id < 0 || (id as u64) < lo || id as u64 >= hi {
                return crate::invalid!(
                    "ids[{t}][{h}] = {id} (token {t}, head {h}) is outside head {h}'s rows \
                     [{lo}, {hi})"
                );
            }
        }
        let mut rows = Vec::with_capacity(ids.len() / nh * r.heads.len());
        for tok in ids.chunks_exact(nh) {
            for (h, &start) in r.heads.iter().zip(&r.head_starts) {
                // checked above: offsets[h] <= tok[h] < offsets[h] + head_sizes[h]
                rows.push(tok[h] as u64 - hash.offsets[h] + start);
            }
        }
        Ok(rows)
    }

    /// Submits one step of `ids` (`[tokens][num_heads]` whole-table row ids, as
    /// [`Pipeline::ngram_ids`] gives them) instead of tokens (see `ple_submit_ids`): checked on
    /// this thread (see [`Pipeline::submit`] for `seq` and the ring), then read as a hashed step
    /// of the same rows would be, bit for bit. `prefill`: its rows count as prefill rows. At
    /// least one and at most `max_tokens_per_step` tokens.
    pub fn submit_ids(&self, ids: &[i64], prefill: bool, seq: u64) -> Result<()> {
        let mut sub = lock(&self.submit_state);
        Self::check_seq(&sub, seq)?;
        let nh = self.num_heads();
        let n = ids.len() / nh;
        let max = self.opts.max_tokens_per_step as usize;
        if ids.is_empty() || n > max {
            return crate::invalid!(
                "num_tokens is {n}: a step holds 1 to max_tokens_per_step = {max} tokens"
            );
        }
        let rows = self.rows_of_ids(ids)?;
        self.enqueue(&mut sub, seq, n, || StepInput::Rows(rows), prefill, None)
    }

    /// Queues the rows of `ids` (`[tokens][num_heads]` whole-table row ids, checked as
    /// [`Pipeline::submit_ids`] checks them) for read-ahead, as
    /// [`Pipeline::prefetch_ahead`] does for tokens. Not bounded by `max_tokens_per_step`.
    pub fn prefetch_ahead_ids(&self, ids: &[i64]) -> Result<()> {
        if self.sh.completion.closing() {
            return Err(Error::State("the handle is closing".into()));
        }
        let rows = self.rows_of_ids(ids)?;
        self.queue_ahead(&rows)
    }
}

impl Pipeline {
    /// Queues the rows of `b`'s tokens for read-ahead (see the module doc) and returns: the
    /// batch is validated and hashed as `submit` would (stateless context, or tracked history
    /// as it stands plus the batch's own earlier tokens), but no history changes and no ring
    /// slot is taken. Not bounded by `max_tokens_per_step` (a whole prompt may be asked at once).
    pub fn prefetch_ahead(&self, b: &crate::lookup::context::Batch) -> Result<()> {
        if self.sh.completion.closing() {
            return Err(Error::State("the handle is closing".into()));
        }
        let r = &self.sh.reader;
        let meta = r.table.meta();
        let ctx = self.checked_contexts(b, u32::MAX, false)?;
        let mut ids = vec![0u64; b.tokens.len() * r.heads.len()];
        r.hasher
            .ids_for_heads(b.tokens, &ctx, r.heads, &r.head_starts, &mut ids);
        crate::io::mmap::gather::check_ids(&ids, meta.total_rows)?;
        self.queue_ahead(&ids)
    }

    /// Queues `ids` (checked) for the read-ahead runner, which starts on the first call with
    /// the handles it reads with (see `ahead`).
    fn queue_ahead(&self, ids: &[u64]) -> Result<()> {
        let (sh, r) = (&self.sh, &self.sh.reader);
        self.ahead.queue(ids, &sh.stats, || Runner {
            table: r.table.clone(),
            source: r.ahead_source,
            cache: r.cache.clone(),
            residency: r.residency.clone(),
            gate: sh.completion.gate().clone(),
            stats: sh.stats.clone(),
        })
    }

    /// [`prefetch_ahead`](Self::prefetch_ahead) of a per-token batch (`ple_prefetch_ahead_tokens`).
    pub fn prefetch_ahead_tokens(&self, g: &crate::lookup::tokens::Grouped) -> Result<()> {
        self.prefetch_ahead(&g.batch())
    }

    /// Tests only: the reader's injected delay and its log of batches.
    #[cfg(test)]
    pub(super) fn ahead_test(&self) -> &super::ahead::TestReader {
        &self.ahead.test
    }

    /// The `ahead_collisions` counter alone (an atomic load: cheap enough to read around every
    /// step, as [`counters`](Self::counters) is not).
    pub fn ahead_collisions(&self) -> u64 {
        self.sh.stats.ahead_collisions.load(Acquire)
    }

    /// Waits up to `timeout` until the read-ahead queue is drained (every row asked is read,
    /// dropped or found cached); returns whether it was.
    pub fn wait_ahead_idle(&self, timeout: Duration) -> bool {
        let st = &self.sh.stats;
        let t0 = Instant::now();
        loop {
            let asked = st.ahead_asked.load(Acquire);
            let done = st.ahead_read.load(Acquire)
                + st.ahead_dropped.load(Acquire)
                + st.ahead_cached.load(Acquire);
            if done >= asked {
                return true;
            }
            if t0.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}
