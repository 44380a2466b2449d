//! The row cache's entry points for read-ahead (`step/ahead.rs`): whether a row is cached, asked
//! without copying it or touching its recency, and the admission of a row read ahead.

use super::{MAX_ROW_ID, RowCache, mix};

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
    /// [`insert`](RowCache::insert) does a step's miss: a row already cached is left as it is.
    pub fn admit(&self, id: u64, src: &[u8]) {
        self.insert(id, src);
    }
}
