//! The row cache's entry points for read-ahead (`step/ahead.rs`): whether a row is cached, asked
//! without copying it or touching its recency, and the admission of a row read ahead.

use super::{AHEAD, MAX_ROW_ID, RowCache, mix};
use std::sync::atomic::Ordering::Relaxed;

impl RowCache {
    /// Whether row `id` is cached now. Exact (read under the row's shard lock); it copies
    /// nothing and leaves the row's recency as it is, so asking does not make a row look used.
    pub fn contains(&self, id: u64) -> bool {
        if id >= MAX_ROW_ID {
            return false;
        }
        let h = mix(id);
        let s = self.shard(h);
        let _g = s.lock();
        s.find(id, h).is_some()
    }

    /// Admits row `id` read ahead of its step (`src`: its `row_bytes` bytes), as
    /// [`insert`](RowCache::insert) does a step's miss, flagged so that the first lookup that
    /// finds it counts an ahead hit: a row already cached is left as it is (and not flagged).
    pub fn admit(&self, id: u64, src: &[u8]) {
        self.insert_flagged(id, src, AHEAD);
    }

    /// The lookups since the last call that found a row [`admit`](RowCache::admit)ted ahead
    /// for the first time (each such row counts once, at its first hit; one evicted first
    /// counts never); resets the count.
    pub fn take_ahead_hits(&self) -> u64 {
        self.counts.ahead_hits.swap(0, Relaxed)
    }
}
