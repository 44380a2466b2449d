//! Cache-line hints of the row cache: a batch asks for the memory its next rows' lookups and
//! inserts touch a few rows ahead, so that their CPU cache misses overlap instead of following
//! one another (each is a random line of a structure far larger than the CPU's caches). Hints
//! only: a hint (PREFETCHT0) reads nothing architecturally, and a stale one costs a wasted line,
//! never a wrong answer.

use super::{MAX_ROW_ID, Mutex, NIL, RowCache, Shard, State, mix, reduce};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// Asks the CPU to start loading the cache line at `addr` (any address: a prefetch never faults
/// and changes nothing but the caches).
#[inline(always)]
pub(super) fn hint_line(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 performs no architectural memory access: it cannot fault whatever the
    // address, and SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

impl RowCache {
    /// Starts loading what a [`lookup`](RowCache::lookup) of `id` reads first (its index entry)
    /// and, with `insert`, what an [`insert`](RowCache::insert) of it writes (the shard's lock
    /// and, for S3-FIFO, the row's ghost entry). Only a hint: a batch prefetching a few rows
    /// ahead overlaps its rows' memory misses instead of taking them one after another.
    /// For an insert into a full shard, also the header and link of the slot its eviction
    /// examines first; [`RowCache::hint_victim`] a few rows later fetches what evicting that
    /// row touches.
    #[inline]
    pub fn hint(&self, id: u64, insert: bool) {
        if id >= MAX_ROW_ID {
            return;
        }
        let h = mix(id);
        let s = self.shard(h);
        s.hint_probe(h, insert);
        if insert {
            hint_line(&s.w as *const Mutex<State> as usize);
            s.hint_ghost(h);
            let v = s.victim_hint.load(Relaxed);
            if v != NIL && (v as usize) < s.cap {
                // the whole slot: its header is read, its row written
                let slot = s.hdr(v) as *const AtomicU64 as usize;
                for line in (slot..slot + s.stride * 8).step_by(64) {
                    hint_line(line);
                }
                hint_line(s.links_hint + 4 * v as usize);
            }
            let t = s.newest_hint.load(Relaxed);
            if t != NIL && (t as usize) < s.cap {
                hint_line(s.links_hint + 4 * t as usize);
            }
        }
    }

    /// Starts loading what evicting the row in the slot that `id`'s insert would evict touches:
    /// that row's index entry and ghost entry (its header, prefetched by [`RowCache::hint`]
    /// a few rows earlier, is read here). Only a hint.
    #[inline]
    pub fn hint_victim(&self, id: u64) {
        if id >= MAX_ROW_ID {
            return;
        }
        let s = self.shard(mix(id));
        let v = s.victim_hint.load(Relaxed);
        if v == NIL || v as usize >= s.cap {
            return;
        }
        let old = s.header(v) >> 8;
        if old < MAX_ROW_ID {
            let h = mix(old);
            s.hint_probe(h, true);
            s.hint_ghost(h);
        }
    }
}

impl Shard {
    /// Prefetches the ghost entry of a row of hash `h` (S3-FIFO).
    #[inline]
    pub(super) fn hint_ghost(&self, h: u64) {
        let (g, n) = self.ghost_hint;
        if n > 0 {
            hint_line(g + 4 * reduce(mix(h) as u32, n));
        }
    }

    /// Starts loading the index entries a probe for hash `h` reads: its home entry's line and,
    /// with `and_next`, the next (a probe that misses, or a removal's shift, runs ~8 entries on
    /// at the index's load; one that hits, ~2).
    #[inline]
    pub(super) fn hint_probe(&self, h: u64, and_next: bool) {
        let i = self.home(h);
        hint_line(&self.index[i] as *const AtomicU64 as usize);
        if and_next {
            let next = (i + 8).min(self.index.len() - 1);
            hint_line(&self.index[next] as *const AtomicU64 as usize);
        }
    }
}
