//! Batched lookups: a step's rows looked up a group at a time, in three passes over the group,
//! so that the memory each lookup waits for (its shard's counter and index line, then its slot's
//! header and row lines, each a dependent load of a structure far larger than the CPU's caches)
//! is in flight for every row of the group at once instead of one row after another:
//! 1. hash every id; prefetch its shard's line and its home index line;
//! 2. read the shard's counter (the seqlock read section opens), probe the index for the first
//!    entry whose 40 hash bits match (no header read yet), prefetch that slot's lines;
//! 3. check the slot's header holds the id, copy the row, close the read section (counter
//!    unchanged); a row whose section a writer entered, or whose header is not its own, is looked
//!    up again by [`RowCache::lookup`] (which retries, then reads under the lock).
//!
//! A hit is exactly what [`RowCache::lookup`] would have copied: the same validated read, only
//! split over the passes (every read between the two counter loads is an atomic word).

use super::hints::hint_line;
use super::{MAX_ROW_ID, RowCache, Shard, mix};
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::atomic::{AtomicU64, fence};

/// Rows per group. Pass 1 of a group runs while the group before it is in pass 2 and the one
/// before that in pass 3, so a row's lines are asked for a group's work ahead of their use.
const GROUP: usize = 8;

/// What pass 2 found for one row.
#[derive(Clone, Copy)]
enum Probe {
    /// The shard's counter read, and the slot whose entry matched (NONE: no entry matched).
    Read { seq: u64, slot: u32 },
    /// A writer was inside (odd counter) or the id cannot be cached: decided in pass 3 by
    /// [`RowCache::lookup`] (or a miss at once for ids the cache never holds).
    Slow,
}

const NONE: u32 = u32::MAX;

impl RowCache {
    /// Looks `ids` up, copying each cached row into its row of `out` (`ids.len() × row_bytes`
    /// bytes at least), and calls `miss(i, row_i_of_out)` for each row `i` not cached, in order
    /// of `i` (a miss's row of `out` may have been written). Returns the hits. Counts nothing
    /// (the caller [`record`](RowCache::record)s). Hits and misses are those of [`lookup`](RowCache::lookup)
    /// (RowCache::lookup) on each id in turn, except that a row `miss` inserts is not yet seen
    /// by the rest of its group (at most [`GROUP`] − 1 rows later).
    pub fn lookup_batch(
        &self,
        ids: &[u64],
        out: &mut [u8],
        mut miss: impl FnMut(usize, &mut [u8]),
    ) -> u64 {
        let rb = self.row_bytes;
        assert!(
            out.len() >= ids.len() * rb,
            "row cache lookup_batch: out holds the rows"
        );
        let out = &mut out[..ids.len() * rb];
        let n = ids.len();
        let groups = n.div_ceil(GROUP);
        let (mut hits, mut ahead) = (0u64, 0u64);
        // hashes and probes of the groups in flight, group g at (g % 3) * GROUP
        let mut hs = [0u64; 3 * GROUP];
        let mut probes = [Probe::Slow; 3 * GROUP];
        let span = |g: usize| g * GROUP..((g + 1) * GROUP).min(n);
        let at = |g: usize| (g % 3) * GROUP;
        for t in 0..groups + 2 {
            // pass 1 of group t: hashes, and the lines pass 2 reads
            if t < groups {
                let b = at(t);
                for (h, &id) in hs[b..].iter_mut().zip(&ids[span(t)]) {
                    *h = mix(id);
                    let s = self.shard(*h);
                    hint_line(&s.seq as *const AtomicU64 as usize);
                    s.hint_probe(*h, false);
                }
            }
            // pass 2 of group t - 1: open each read section, probe, prefetch the slot
            if let Some(g) = t.checked_sub(1).filter(|&g| g < groups) {
                let b = at(g);
                for ((p, &h), &id) in (probes[b..].iter_mut().zip(&hs[b..])).zip(&ids[span(g)]) {
                    let s = self.shard(h);
                    let seq = s.seq.load(Acquire);
                    *p = if seq & 1 == 1 || id >= MAX_ROW_ID {
                        Probe::Slow
                    } else {
                        let slot = s.probe_tag(h);
                        if slot != NONE {
                            s.hint_slot(slot);
                        }
                        Probe::Read { seq, slot }
                    };
                }
            }
            // pass 3 of group t - 2: check, copy, close the read section
            if let Some(g) = t.checked_sub(2).filter(|&g| g < groups) {
                let b = at(g);
                let r = span(g);
                let first = r.start;
                let rows = out[r.start * rb..r.end * rb].chunks_exact_mut(rb);
                for (k, ((o, &id), (&p, &h))) in (rows.zip(&ids[r]))
                    .zip(probes[b..].iter().zip(&hs[b..]))
                    .enumerate()
                {
                    if self.finish(id, h, p, o, &mut ahead) {
                        hits += 1;
                    } else {
                        miss(first + k, o);
                    }
                }
            }
        }
        if ahead > 0 {
            self.counts.ahead_hits.fetch_add(ahead, Relaxed);
        }
        hits
    }

    /// Pass 3 of one row: whether it is a hit (its row copied into `o`); a row read ahead found
    /// for the first time adds 1 to `ahead`.
    #[inline(always)]
    fn finish(&self, id: u64, h: u64, p: Probe, o: &mut [u8], ahead: &mut u64) -> bool {
        let Probe::Read { seq, slot } = p else {
            return id < MAX_ROW_ID && self.lookup_counted(id, o, ahead);
        };
        let s = self.shard(h);
        let mine = slot != NONE && s.header(slot) >> 8 == id;
        if mine {
            s.copy_out(slot, o);
        }
        // the reads above happen before the second load of `seq` (seqlock reader)
        fence(Acquire);
        let valid = s.seq.load(Relaxed) == seq;
        match (valid, mine) {
            (true, true) => {
                *ahead += s.touch(slot, id) as u64;
                true
            }
            (true, false) if slot == NONE => false,
            // a writer was inside meanwhile, or another row's hash bits
            _ => self.lookup_counted(id, o, ahead),
        }
    }
}

impl Shard {
    /// The slot of the first index entry from `h`'s home on whose hash bits match `h`'s before
    /// an empty entry ([`NONE`] if none): `find` without reading headers. Without the lock the
    /// answer is only good if `seq` did not change meanwhile.
    #[inline(always)]
    fn probe_tag(&self, h: u64) -> u32 {
        self.probe(h, |_| true).map_or(NONE, |(_, s)| s)
    }

    /// Prefetches `slot`'s header and row lines (an address past the slab is harmless: a hint
    /// never faults).
    #[inline(always)]
    fn hint_slot(&self, slot: u32) {
        let a = self.slab.as_ptr() as usize + slot as usize * self.stride * 8;
        let end = a + self.stride * 8;
        // the first two lines without a loop (an NVFP4 slot, 104 bytes, spans two or three)
        hint_line(a);
        hint_line(a + 64);
        let mut line = (a & !63) + 128;
        while line < end {
            hint_line(line);
            line += 64;
        }
    }
}
