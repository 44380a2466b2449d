//! The shard's open-addressed index (linear probing at load ≤ 0.75): [`entry`]`(hash, slot)`
//! words, [`NO_ENTRY`] where empty. Probes without the lock see atomic words (a stale value at
//! worst); writers change it only inside a write section.

use super::{NO_ENTRY, SLOT_MASK, Shard, entry, entry_slot, reduce};
use std::sync::atomic::Ordering::Relaxed;

impl Shard {
    #[inline]
    pub(super) fn home(&self, h: u64) -> usize {
        reduce(h as u32, self.index.len())
    }

    /// The index position and slot of `id` (hash `h`), if cached. Exact under the lock; without
    /// it the answer is only good if `seq` did not change meanwhile (at most one pass over the
    /// index either way).
    #[inline]
    pub(super) fn find(&self, id: u64, h: u64) -> Option<(usize, u32)> {
        self.probe(h, |s| self.header(s) >> 8 == id)
    }

    /// The first index entry from `h`'s home, before an empty one, whose hash bits match `h`'s
    /// and whose slot `accept` takes: (its position, its slot). At most one pass over the index.
    #[inline(always)]
    pub(super) fn probe(
        &self,
        h: u64,
        mut accept: impl FnMut(u32) -> bool,
    ) -> Option<(usize, u32)> {
        let key = entry(h, 0);
        let n = self.index.len();
        let mut i = self.home(h);
        for _ in 0..n {
            let e = self.index[i].load(Relaxed);
            if e == NO_ENTRY {
                return None;
            }
            if e & !(SLOT_MASK as u64) == key && accept(entry_slot(e)) {
                return Some((i, entry_slot(e)));
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
        None
    }

    /// Removes index entry `i` (backward-shift deletion: no tombstones, probe chains stay short).
    /// Inside a write section.
    pub(super) fn index_remove(&self, mut i: usize) {
        let n = self.index.len();
        let mut j = i;
        loop {
            j = if j + 1 == n { 0 } else { j + 1 };
            let e = self.index[j].load(Relaxed);
            if e == NO_ENTRY {
                break;
            }
            let home = reduce((e >> 32) as u32, n);
            // entry j may move to the hole at i unless its home lies cyclically in (i, j]
            let stays = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !stays {
                self.index[i].store(e, Relaxed);
                i = j;
            }
        }
        self.index[i].store(NO_ENTRY, Relaxed);
    }

    /// Inside a write section.
    pub(super) fn index_insert(&self, h: u64, slot: u32) {
        let n = self.index.len();
        let mut i = self.home(h);
        while self.index[i].load(Relaxed) != NO_ENTRY {
            i = if i + 1 == n { 0 } else { i + 1 };
        }
        self.index[i].store(entry(h, slot), Relaxed);
    }
}
