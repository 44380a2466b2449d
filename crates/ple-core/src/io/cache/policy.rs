//! The row cache's eviction [`Policy`] and its [`CacheCounters`].

use super::{HEADER, INDEX_ENTRY, MAX_LOAD, SMALL_FRACTION};

/// Eviction policy of a [`RowCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    #[default]
    S3Fifo,
    Sieve,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::S3Fifo => "S3-FIFO",
            Policy::Sieve => "SIEVE",
        }
    }
    /// Bytes per row of `row_bytes` besides the row itself (its padding to whole words, header,
    /// link, index, ghost).
    pub(super) fn overhead_per_row(self, row_bytes: usize) -> f64 {
        let pad = row_bytes.div_ceil(8) * 8 - row_bytes;
        let base = (pad + HEADER) as f64 + 4.0 + INDEX_ENTRY as f64 / MAX_LOAD;
        match self {
            Policy::S3Fifo => base + 4.0 * (1.0 - SMALL_FRACTION),
            Policy::Sieve => base,
        }
    }
}

/// Counters of a [`RowCache`] (rows, except `bytes_used`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Hits and misses [`RowCache::record`]ed by the callers.
    pub hits: u64,
    pub misses: u64,
    pub inserts: u64,
    pub evictions: u64,
    /// Rows held now.
    pub rows: u64,
    /// `rows × bytes_per_row`, rounded: the share of `cache_bytes` in use.
    pub bytes_used: u64,
}
