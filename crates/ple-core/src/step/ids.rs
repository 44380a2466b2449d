//! Rows by the engine's own ids (`ple_submit_ids`, `ple_prefetch_ahead_ids`): an engine that
//! computes the n-gram row ids itself hands `[tokens][num_heads]` whole-table row ids instead of
//! tokens. Each id is checked against its head's rows on the caller's thread (nothing is read, no
//! slot taken, when one is outside); the handle's heads' ids (a head shard: its heads only) are
//! placed in its row file and go through the same pipeline as hashed ones: row cache, DIRECT or
//! MMAP reads, read-ahead, the host and device views. Tracked request history is neither read
//! nor changed. Tested in `step/pipeline/tests/ids.rs`.

use super::pipeline::Pipeline;
use super::worker::StepInput;
use crate::error::Result;
use crate::sync::lock;

impl Pipeline {
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
        let max = self.sh.opts.max_tokens_per_step as usize;
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
            return Err(crate::Error::State("the handle is closing".into()));
        }
        let rows = self.rows_of_ids(ids)?;
        self.sh.queue_ahead(&rows)
    }
}
