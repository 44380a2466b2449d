//! A [`Shard`] of the row cache: its index, slots and queues, behind the shard's lock for
//! writers and a seqlock for readers (see the module doc of `cache`).

use super::*;

/// Bytes per shard besides its slots' share: the rounding up of the index and ghost lengths
/// and of the packed rows to whole words.
pub(super) const SHARD_ROUNDING: usize = 16;

impl Shard {
    /// Words of a shard of `cap` slots of `row_bytes` rows: (index, slots).
    pub(super) fn words(cap: usize, row_bytes: usize) -> (usize, usize) {
        let index_len = ((cap as f64 / MAX_LOAD).ceil() as usize).max(cap + 1);
        (index_len, cap * (1 + row_bytes.div_ceil(8)))
    }

    /// A shard of `cap` slots over `index` and `slab` (the lengths [`Shard::words`] gives),
    /// whose initial values it writes.
    pub(super) fn new(
        cap: usize,
        row_bytes: usize,
        policy: Policy,
        index: Words,
        slab: Words,
    ) -> Result<Shard> {
        let stride = 1 + row_bytes.div_ceil(8);
        debug_assert_eq!((index.len(), slab.len()), Shard::words(cap, row_bytes));
        index.iter().for_each(|e| e.store(NO_ENTRY, Relaxed));
        slab.iter()
            .step_by(stride)
            .for_each(|h| h.store(EMPTY, Relaxed));
        let q = match policy {
            Policy::S3Fifo => Queues::S3Fifo {
                small: Fifo::EMPTY,
                main: Fifo::EMPTY,
                small_cap: ((cap as f64 * SMALL_FRACTION).round() as usize).max(1),
                ghost: alloc(
                    ((cap as f64 * (1.0 - SMALL_FRACTION)) as usize).max(1),
                    |_| 0u32,
                    "ghost",
                )?,
            },
            Policy::Sieve => Queues::Sieve {
                fifo: Fifo::EMPTY,
                hand: NIL,
                hand_prev: NIL,
            },
        };
        let ghost_hint = match &q {
            Queues::S3Fifo { ghost, .. } => (ghost.as_ptr() as usize, ghost.len()),
            Queues::Sieve { .. } => (0, 0),
        };
        let next = alloc(cap, |_| NIL, "links")?;
        Ok(Shard {
            ghost_hint,
            links_hint: next.as_ptr() as usize,
            victim_hint: AtomicU32::new(NIL),
            newest_hint: AtomicU32::new(NIL),
            seq: AtomicU64::new(0),
            index,
            slab,
            stride,
            cap,
            sieve: policy == Policy::Sieve,
            w: Mutex::new(State {
                next,
                fresh: 0,
                q,
                inserts: 0,
                evictions: 0,
            }),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        sync::lock(&self.w)
    }

    /// Makes `seq` odd (the caller holds the lock): lookups started before retry.
    #[inline]
    pub(super) fn write_begin(&self) -> u64 {
        let v = self.seq.load(Relaxed);
        self.seq.store(v + 1, Relaxed);
        // the odd value is visible before any of the writes that follow (seqlock writer)
        fence(Release);
        v
    }

    /// Ends the write begun at `v`: `seq` even again, after every write of the section.
    #[inline]
    pub(super) fn write_end(&self, v: u64) {
        self.seq.store(v + 2, Release);
    }

    #[inline]
    pub(super) fn hdr(&self, slot: u32) -> &AtomicU64 {
        &self.slab[slot as usize * self.stride]
    }

    #[inline]
    pub(super) fn header(&self, slot: u32) -> u64 {
        self.hdr(slot).load(Relaxed)
    }

    #[inline]
    pub(super) fn bits(&self, slot: u32) -> u8 {
        self.header(slot) as u8 & POLICY_BITS
    }

    /// Sets `slot`'s policy bits, keeping its flag (under the lock; a racing lookup's bit may
    /// be lost, which only costs the policy one hit, and so may its clearing of the flag,
    /// which then counts one more ahead hit later).
    #[inline]
    pub(super) fn set_bits(&self, slot: u32, b: u8) {
        let h = self.header(slot);
        self.hdr(slot)
            .store((h & !(POLICY_BITS as u64)) | b as u64, Relaxed);
    }

    /// Copies `slot`'s row into `dst` (`row_bytes` long), a word at a time (unrolled for the
    /// row sizes of the formats: NVFP4's 90 bytes, 160 and 320).
    #[inline(always)]
    pub(super) fn copy_out(&self, slot: u32, dst: &mut [u8]) {
        let base = slot as usize * self.stride + 1;
        let words = &self.slab[base..base + self.stride - 1];
        match dst.len() {
            90 => return copy_words::<90>(words, dst),
            160 => return copy_words::<160>(words, dst),
            320 => return copy_words::<320>(words, dst),
            _ => {}
        }
        let mut chunks = dst.chunks_exact_mut(8);
        for (d, w) in (&mut chunks).zip(words) {
            d.copy_from_slice(&w.load(Relaxed).to_le_bytes());
        }
        let tail = chunks.into_remainder();
        if let (false, Some(w)) = (tail.is_empty(), words.last()) {
            let b = w.load(Relaxed).to_le_bytes();
            for (d, s) in tail.iter_mut().zip(b) {
                *d = s;
            }
        }
    }

    /// Writes `src` as `slot`'s row (under the lock, inside a write section).
    pub(super) fn copy_in(&self, slot: u32, src: &[u8]) {
        let base = slot as usize * self.stride + 1;
        let words = &self.slab[base..base + self.stride - 1];
        let mut chunks = src.chunks_exact(8);
        for (w, c) in words.iter().zip(&mut chunks) {
            w.store(u64::from_le_bytes(c.try_into().expect("8 bytes")), Relaxed);
        }
        let tail = chunks.remainder();
        if let (false, Some(w)) = (tail.is_empty(), words.last()) {
            let mut b = [0u8; 8];
            b[..tail.len()].copy_from_slice(tail);
            w.store(u64::from_le_bytes(b), Relaxed);
        }
    }

    /// A hit on `slot` (holding `id`): its policy bit or frequency, and the [`AHEAD`] flag
    /// cleared, by one compare-and-swap of the header, only when either changes (which fails,
    /// harmlessly, if a writer changed it meanwhile). Returns whether this hit cleared the flag
    /// (the row's first hit since read-ahead admitted it).
    #[inline(always)]
    pub(super) fn touch(&self, slot: u32, id: u64) -> bool {
        let a = self.hdr(slot);
        let h = a.load(Relaxed);
        let b = h as u8 & POLICY_BITS;
        let ahead = h as u8 & AHEAD != 0;
        let nb = if self.sieve { 1 } else { (b + 1).min(MAX_FREQ) };
        if (nb != b || ahead) && h >> 8 == id {
            let swapped = a.compare_exchange(h, (h & !0xFF) | nb as u64, Relaxed, Relaxed);
            return ahead && swapped.is_ok();
        }
        false
    }

    /// Under the lock (`st` is its state).
    pub(super) fn insert(&self, st: &mut State, id: u64, h: u64, src: &[u8], flags: u8) {
        if self.find(id, h).is_some() {
            return;
        }
        // choosing the victim changes only queues and policy bits: no write section needed
        let victim = if st.fresh < self.cap {
            st.fresh += 1;
            None
        } else {
            Some(self.evict(st))
        };
        let v = self.write_begin();
        let slot = match victim {
            None => (st.fresh - 1) as u32,
            Some(s) => {
                let old = self.header(s) >> 8;
                let (i, _) = self.find(old, mix(old)).expect("an evicted row is indexed");
                self.index_remove(i);
                st.evictions += 1;
                s
            }
        };
        self.copy_in(slot, src);
        self.hdr(slot).store(id << 8 | flags as u64, Relaxed);
        self.index_insert(h, slot);
        self.write_end(v);
        let State { next, q, .. } = st;
        match q {
            Queues::S3Fifo {
                small, main, ghost, ..
            } => {
                let h2 = mix(h);
                let g = reduce(h2 as u32, ghost.len());
                let fp = (h2 >> 32) as u32 | 1;
                if ghost[g] == fp {
                    ghost[g] = 0;
                    push(next, main, slot);
                } else {
                    push(next, small, slot);
                }
            }
            Queues::Sieve { fifo, .. } => push(next, fifo, slot),
        }
        st.inserts += 1;
        self.newest_hint.store(slot, Relaxed);
        if st.fresh == self.cap {
            self.victim_hint
                .store(evict::first_examined(&st.q), Relaxed);
        }
    }
}
