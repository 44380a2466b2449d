//! Head shards (`docs/FORMAT.md#head-shards`): shard `index` of `count` serves the contiguous
//! heads `[index·16/count, (index+1)·16/count)` — split as evenly as possible, every shard at
//! least one head for `count` in `1..=16`. A handle opened as a shard hashes, reads, caches and
//! counts only those heads' rows, and its dequantised output holds -0.0 in the other heads'
//! columns (`x + -0.0 == x` for every `x`), so the sum of all `count` shards' outputs is the
//! whole table's output bit for bit.
//!
//! The row ids of heads `[h0, h1)` are the contiguous range `[offset[h0], end(h1))` of the whole
//! table (`end(h) = offset[h]`, and the whole table's rows for the last head, so the padding goes
//! with the last shard): a shard table holds exactly that range, row `r` of its file being row
//! `offset[h0] + r` of the whole table.

use crate::error::Result;
use crate::model::HashParams;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Largest `count`: one head per shard.
pub const MAX_SHARDS: u32 = crate::model::NUM_HEADS as u32;

/// One of `count` head shards (`index < count`); [`Shard::WHOLE`] is the whole table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Default for Shard {
    fn default() -> Self {
        Shard::WHOLE
    }
}

impl Shard {
    /// The whole table: shard 0 of 1.
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// Shard `index` of `count`; `Error::InvalidArgument` unless `1 <= count <= 16` and
    /// `index < count`.
    pub fn new(index: u32, count: u32) -> Result<Shard> {
        if count == 0 || count > MAX_SHARDS {
            return crate::invalid!("shard_count {count} not in [1, {MAX_SHARDS}]");
        }
        if index >= count {
            return crate::invalid!("shard_index {index} not in [0, shard_count {count})");
        }
        Ok(Shard { index, count })
    }

    /// Whether this is the whole table (one shard).
    pub fn is_whole(&self) -> bool {
        self.count == 1
    }

    /// The heads this shard serves out of `num_heads` (`index < count <= num_heads`).
    pub fn heads(&self, num_heads: usize) -> Range<usize> {
        let (i, n) = (self.index as usize, self.count as usize);
        i * num_heads / n..(i + 1) * num_heads / n
    }

    /// The whole table's rows that hold this shard's heads: `[offset[h0], end(h1))`, where the
    /// last shard also takes the padding up to `whole_rows`.
    pub fn rows(&self, hash: &HashParams, whole_rows: u64) -> Range<u64> {
        let heads = self.heads(hash.offsets.len());
        let start = hash.offsets[heads.start];
        let end = hash.offsets.get(heads.end).copied().unwrap_or(whole_rows);
        start..end
    }

    /// `"K/N"`, or `"the whole table"`.
    pub fn describe(&self) -> String {
        if self.is_whole() {
            "the whole table".into()
        } else {
            format!("shard {}/{}", self.index, self.count)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HashParams, ModelConfig, NUM_HEADS};

    #[test]
    fn every_count_splits_all_heads_evenly_and_contiguously() {
        for count in 1..=MAX_SHARDS {
            let mut next = 0;
            let sizes: Vec<usize> = (0..count)
                .map(|i| {
                    let h = Shard::new(i, count).unwrap().heads(NUM_HEADS);
                    assert_eq!(
                        h.start,
                        next,
                        "{i}/{count} starts where {} ended",
                        i.max(1) - 1
                    );
                    next = h.end;
                    h.len()
                })
                .collect();
            assert_eq!(next, NUM_HEADS);
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(*lo >= 1 && hi - lo <= 1, "{count}: {sizes:?}");
        }
        assert_eq!(Shard::new(1, 3).unwrap().heads(16), 5..10);
        assert_eq!(Shard::new(2, 3).unwrap().heads(16), 10..16);
    }

    #[test]
    fn out_of_range_shards_are_invalid_arguments() {
        for (i, n) in [(0, 0), (0, 17), (3, 3), (16, 16), (u32::MAX, 2)] {
            let e = Shard::new(i, n).unwrap_err();
            assert!(
                matches!(e, crate::Error::InvalidArgument(_)),
                "{i}/{n}: {e}"
            );
        }
    }

    #[test]
    fn shard_rows_tile_the_whole_table() {
        let hash = HashParams::derive(&ModelConfig::default());
        let whole = 320_001_536;
        for count in 1..=MAX_SHARDS {
            let mut next = 0;
            for i in 0..count {
                let r = Shard::new(i, count).unwrap().rows(&hash, whole);
                assert_eq!(r.start, next);
                next = r.end;
            }
            assert_eq!(next, whole, "{count}");
        }
    }
}
