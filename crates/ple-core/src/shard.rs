//! Head shards (`docs/FORMAT.md#head-shards`): shard `index` of `count` serves the heads
//! `index, index + count, index + 2·count, …` (round-robin), so every shard holds heads of every
//! n-gram order wherever `count` divides the heads per n-gram (2, 4 and 8 shards of the 16 heads:
//! as many bigram as trigram heads each). Bigrams repeat far more than trigrams in real text, so
//! contiguous blocks of heads put the bigram heads' cache hits on some ranks and the trigram
//! heads' storage reads on others; mixed shards read alike. Every shard has at least one head for
//! `count` in `1..=16`, and the sizes differ by at most one.
//!
//! A handle opened as a shard hashes, reads, caches and counts only its heads' rows, and its
//! dequantised output holds -0.0 in the other heads' columns (`x + -0.0 == x` for every `x`), so
//! the sum of all `count` shards' outputs is the whole table's output bit for bit.
//!
//! Head `h`'s rows are the whole table's `[offset[h], end(h))` (`end(h) = offset[h + 1]`, and the
//! whole table's rows for the last head, so the padding goes with the shard holding it). A shard
//! table holds its heads' ranges one after another, in head order ([`Shard::row_ranges`]).

use crate::error::Result;
use crate::model::HashParams;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Largest `count` (`PLE_SHARD_COUNT_MAX`); a table of fewer heads takes at most one shard per
/// head (checked where the table is known, `shard_rows`).
pub const MAX_SHARDS: u32 = 16;

/// The heads a handle serves: `first + j·step` for `j < len` (ascending; `step >= 1`). Row `j` of
/// a token's step rows is head `get(j)`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    pub first: usize,
    pub step: usize,
    pub len: usize,
}

impl Heads {
    /// All `n` heads.
    pub fn all(n: usize) -> Heads {
        Heads {
            first: 0,
            step: 1,
            len: n,
        }
    }

    /// Whether these are all `n` heads in order.
    pub fn is_all(&self, n: usize) -> bool {
        self.first == 0 && (self.step == 1 || self.len <= 1) && self.len == n
    }

    /// Number of heads.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Head `j` (`j < len`).
    pub fn get(&self, j: usize) -> usize {
        debug_assert!(j < self.len);
        self.first + j * self.step
    }

    /// The position of head `h` among these, if it is one of them.
    pub fn position(&self, h: usize) -> Option<usize> {
        let d = h.checked_sub(self.first)?;
        (d % self.step == 0 && d / self.step < self.len).then_some(d / self.step)
    }

    /// The heads in order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + Clone + use<> {
        let (first, step) = (self.first, self.step);
        (0..self.len).map(move |j| first + j * step)
    }

    /// The heads as runs of adjacent ones, in order: one run for contiguous heads (`step` 1), one
    /// per head otherwise.
    pub fn runs(&self) -> impl Iterator<Item = Range<usize>> + use<> {
        let (first, step) = (self.first, self.step);
        let (n, width) = if step == 1 {
            (self.len.min(1), self.len)
        } else {
            (self.len, 1)
        };
        (0..n).map(move |r| first + r * step..first + r * step + width)
    }

    /// The last head plus one (0 for none).
    pub fn end(&self) -> usize {
        if self.len == 0 {
            0
        } else {
            self.get(self.len - 1) + 1
        }
    }

    /// `"0, 4, 8, 12"`.
    pub fn describe(&self) -> String {
        let v: Vec<String> = self.iter().map(|h| h.to_string()).collect();
        v.join(", ")
    }
}

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

    /// The heads this shard serves out of `num_heads` (`index < count <= num_heads`):
    /// `index, index + count, …`.
    pub fn heads(&self, num_heads: usize) -> Heads {
        let (i, n) = (self.index as usize, self.count as usize);
        Heads {
            first: i,
            step: n,
            len: num_heads.saturating_sub(i).div_ceil(n),
        }
    }

    /// The whole table's rows of each of this shard's heads, in head order: head `h`'s
    /// `[offset[h], end(h))`, the last head's range also taking the padding up to `whole_rows`.
    /// A shard table's file holds them one after another.
    pub fn row_ranges(&self, hash: &HashParams, whole_rows: u64) -> Vec<Range<u64>> {
        let n = hash.offsets.len();
        self.heads(n)
            .iter()
            .map(|h| hash.offsets[h]..hash.offsets.get(h + 1).copied().unwrap_or(whole_rows))
            .collect()
    }

    /// Rows of a shard table: the sum of [`Shard::row_ranges`]' lengths.
    pub fn file_rows(&self, hash: &HashParams, whole_rows: u64) -> u64 {
        self.row_ranges(hash, whole_rows)
            .iter()
            .map(|r| r.end - r.start)
            .sum()
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
    fn every_count_deals_all_heads_out_once_and_evenly() {
        for count in 1..=MAX_SHARDS {
            let mut owner = [None; NUM_HEADS];
            let mut sizes = vec![];
            for i in 0..count {
                let heads = Shard::new(i, count).unwrap().heads(NUM_HEADS);
                for (j, h) in heads.iter().enumerate() {
                    assert_eq!(owner[h], None, "{count}: head {h} twice");
                    owner[h] = Some(i);
                    assert_eq!(heads.position(h), Some(j));
                    assert_eq!(heads.get(j), h);
                }
                sizes.push(heads.len());
            }
            assert!(owner.iter().all(Option::is_some), "{count}: {owner:?}");
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(*lo >= 1 && hi - lo <= 1, "{count}: {sizes:?}");
        }
        let h = Shard::new(1, 4).unwrap().heads(16);
        assert_eq!(h.iter().collect::<Vec<_>>(), [1, 5, 9, 13]);
        assert_eq!(
            (h.position(0), h.position(2), h.position(17)),
            (None, None, None)
        );
        assert_eq!(Shard::new(2, 3).unwrap().heads(16).len(), 5);
        assert!(Shard::WHOLE.heads(16).is_all(16));
        let whole: Vec<Range<usize>> = Shard::WHOLE.heads(16).runs().collect();
        assert_eq!((whole.len(), whole[0].clone()), (1, 0..16));
        assert_eq!(h.runs().collect::<Vec<_>>(), [1..2, 5..6, 9..10, 13..14]);
        assert!(!Shard::new(0, 2).unwrap().heads(16).is_all(16));
    }

    #[test]
    fn shards_that_divide_the_heads_per_order_mix_the_orders_evenly() {
        // the real shape: 8 heads per n-gram order (bigram heads 0..8, trigram heads 8..16)
        let hpn = 8;
        for count in [2u32, 4, 8] {
            for i in 0..count {
                let heads = Shard::new(i, count).unwrap().heads(16);
                let bigram = heads.iter().filter(|&h| h < hpn).count();
                assert_eq!(bigram * 2, heads.len(), "{i}/{count}: {}", heads.describe());
            }
        }
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
    fn shard_row_ranges_tile_the_whole_table() {
        let hash = HashParams::derive(&ModelConfig::default());
        let whole = 320_001_536;
        for count in 1..=MAX_SHARDS {
            let mut ranges: Vec<Range<u64>> = (0..count)
                .flat_map(|i| Shard::new(i, count).unwrap().row_ranges(&hash, whole))
                .collect();
            let files: u64 = (0..count)
                .map(|i| Shard::new(i, count).unwrap().file_rows(&hash, whole))
                .sum();
            assert_eq!(files, whole, "{count}");
            ranges.sort_by_key(|r| r.start);
            let mut next = 0;
            for r in ranges {
                assert_eq!(r.start, next, "{count}");
                next = r.end;
            }
            assert_eq!(next, whole, "{count}");
        }
    }
}
