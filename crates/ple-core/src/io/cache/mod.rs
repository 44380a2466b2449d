//! A bounded cache of table rows (not pages), shared by the gather pool.
//!
//! # Memory
//! Everything is allocated once, in [`RowCache::new`]; inserting or evicting a row allocates
//! nothing. The index and the slots, what lookups read, share one mapping advised for 2 MiB
//! pages (`arena.rs`: a lookup's two random reads then rarely miss the TLB). Each cached row costs [`RowCache::bytes_per_row`] bytes: the row itself padded to
//! whole 8-byte words, an 8-byte header in front of it (row id and policy bits: the id check and
//! the copy touch the same cache lines), a 4-byte queue link, 4/3 × 8 bytes of index (an
//! open-addressed table at load ≤ 0.75 whose entries carry 40 bits of the row's hash beside the
//! slot: a probe reads a header only for its own row, and removing an entry shifts its neighbours
//! without reading theirs — header reads there were half of an eviction's time, each a miss to a
//! random slot), and for S3-FIFO 0.9 × 4 bytes of ghost fingerprints: 26.3 B per row besides the
//! padded row with S3-FIFO, 22.7 B with SIEVE. A 90-byte NVFP4 row costs 122.3 B (256 MiB holds
//! 2.2 million rows); 160- and 320-byte rows need no padding. Words, not bytes, because a
//! lookup reads them without a lock (below); packing rows back to back to save the padding
//! measured 1.6–2.3× slower per hit (`cargo bench --bench row_cache`).
//! The slot count is chosen so that the whole allocation is at most `cache_bytes`.
//!
//! # Concurrency
//! Rows are spread over up to 256 shards by a hash of the row id; each shard (cache-line
//! aligned) has its own lock, taken only by writers (insert, evict), and a sequence counter that
//! is odd while a writer changes the shard's index, headers or rows. A lookup takes no lock and
//! writes nothing shared: it reads the counter, probes the index, copies the row, and reads the
//! counter again; if a writer was inside meanwhile it retries, and after a few tries reads under
//! the lock (a seqlock). Everything a lookup reads without the lock is an atomic word, so a
//! racing read is a stale value, never undefined behaviour. The hit's policy bit is set with one
//! compare-and-swap of the row's header, only when it changes (hot rows: none). Hits and misses
//! are counted by the callers, once per batch ([`RowCache::record`]). A step's rows are looked
//! up by [`RowCache::lookup_batch`] (`batch.rs`): the same validated reads, pipelined over
//! groups of rows with prefetches, so that the dependent memory loads of a lookup (index line,
//! then slot) overlap across rows instead of following one another.
//!
//! # Policies
//! - [`Policy::S3Fifo`] (the default; Yang et al., SOSP 2023): new rows enter a small FIFO (10%
//!   of the slots); a row leaving it that was hit meanwhile moves to the main FIFO, one that was
//!   not is dropped and remembered in a ghost table of fingerprints; a row inserted again while
//!   its ghost is remembered goes straight to main. Main is a CLOCK with 2-bit frequencies. A
//!   long prefill of new text passes through the small FIFO without flushing main.
//! - [`Policy::Sieve`] (Zhang et al., NSDI 2024): one FIFO with a visited bit and a hand that
//!   moves from the oldest row toward the newest, keeping visited rows in place.
//!
//! `ple bench --steady` compares both with an exact LRU of the same number of rows on the same
//! access sequence; S3-FIFO is the default because it measured best (docs/PERFORMANCE-LOG.md,
//! "Row cache").

use crate::error::{Error, Result};
use crate::sync;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64, fence};
use std::sync::{Mutex, MutexGuard};

/// Bytes of a slot's header: `id << 8 | flags`, the flags [`AHEAD`] and the policy bits
/// ([`POLICY_BITS`]).
const HEADER: usize = 8;
/// Header flag: the row was admitted by read-ahead ([`RowCache::admit`]) and no lookup has
/// found it since; the first that does clears it and counts an ahead hit.
const AHEAD: u8 = 0x80;
/// The header's policy bits (S3-FIFO's frequency, SIEVE's visited bit).
const POLICY_BITS: u8 = 0x7F;
/// Largest index load factor.
const MAX_LOAD: f64 = 0.75;
/// Share of an S3-FIFO shard's slots for its small FIFO.
const SMALL_FRACTION: f64 = 0.1;
/// Most shards; a shard holds at least [`MIN_SHARD_ROWS`] rows unless the cache is smaller.
const MAX_SHARDS: usize = 256;
const MIN_SHARD_ROWS: usize = 64;
/// No slot.
const NIL: u32 = u32::MAX;
/// No index entry (no real entry is all ones: slots are below [`SLOT_MASK`]).
const NO_ENTRY: u64 = u64::MAX;
/// Bytes of an index entry: the row hash's low 32 bits (its home) and next 8 (a tag) beside
/// the slot.
const INDEX_ENTRY: usize = 8;
/// Header of an empty slot.
const EMPTY: u64 = u64::MAX;
/// Row ids the cache can hold are below this (the header keeps 8 bits for the policy).
pub const MAX_ROW_ID: u64 = 1 << 56;
/// Bits of an index entry holding the slot (the 40 above them are hash bits).
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u32 = (1 << SLOT_BITS) - 1;
/// Most slots of one shard.
const MAX_SHARD_ROWS: usize = SLOT_MASK as usize;
/// S3-FIFO: largest frequency kept (2 bits).
const MAX_FREQ: u8 = 3;
/// Lock-free tries of a lookup before it reads under the shard's lock.
const OPTIMISTIC_TRIES: usize = 4;

/// The id hash: all 64 bits depend on every bit of the id (splitmix64's finaliser).
#[inline]
fn mix(id: u64) -> u64 {
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `x` (32 bits) scaled into `[0, n)`.
#[inline]
fn reduce(x: u32, n: usize) -> usize {
    ((x as u64 * n as u64) >> 32) as usize
}

/// A bounded cache of fixed-size rows, keyed by row id (see the module doc).
pub struct RowCache {
    shards: Box<[Padded]>,
    /// log2 of the shard count.
    shard_bits: u32,
    row_bytes: usize,
    policy: Policy,
    capacity_rows: usize,
    bytes_per_row: f64,
    counts: Counts,
    /// The shards' index and slot words (their `Words` views point into it): declared after
    /// `shards`, so it is dropped after them.
    arena: Arena,
}

/// Hits and misses, added once per batch by the callers (so sharing their cache line costs
/// nothing measurable).
#[derive(Default)]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
    /// Lookups that found a row read ahead for the first time (`RowCache::take_ahead_hits`).
    ahead_hits: AtomicU64,
}

#[repr(align(128))]
struct Padded(Shard);

/// Policy state of one shard: queues are singly linked through `State::next`, oldest to newest.
#[derive(Debug)]
enum Queues {
    S3Fifo {
        small: Fifo,
        main: Fifo,
        small_cap: usize,
        /// Fingerprints of rows recently dropped from the small FIFO (0: none).
        ghost: Box<[u32]>,
    },
    Sieve {
        fifo: Fifo,
        /// Next slot the hand examines (NIL: start again from the oldest) and the slot before it.
        hand: u32,
        hand_prev: u32,
    },
}

/// A FIFO of slots, linked oldest → newest.
#[derive(Debug, Clone, Copy)]
struct Fifo {
    oldest: u32,
    newest: u32,
    len: usize,
}

impl Fifo {
    const EMPTY: Fifo = Fifo {
        oldest: NIL,
        newest: NIL,
        len: 0,
    };
}

/// One shard. `index`, `hdr` and `rows` are read by lookups without the lock and written only
/// under it, between [`Shard::write_begin`] and [`Shard::write_end`] (header policy bits
/// excepted: they are not part of what a lookup validates).
struct Shard {
    /// Even while no writer is inside; a writer makes it odd, then even again (+2 in all).
    seq: AtomicU64,
    /// Open-addressed index: [`entry`]`(hash, slot)`, [`NO_ENTRY`] if empty (in the arena).
    index: Words,
    /// `cap` slots of `stride` words: the header (`id << 8 | policy bits`, EMPTY if never
    /// filled), then the row (little-endian within each word, the last word padded) (in the
    /// arena).
    slab: Words,
    stride: usize,
    cap: usize,
    sieve: bool,
    /// Address and length of the S3-FIFO ghost array and address of the links (held in `w`;
    /// their heap blocks never move), for prefetch hints only: never dereferenced through these.
    ghost_hint: (usize, usize),
    links_hint: usize,
    /// The slot the next eviction examines first (NIL while the shard is not full), stored by
    /// writers after each insert: a hint for prefetches, which may be stale.
    victim_hint: AtomicU32,
    /// The slot inserted last (NIL before the first): the next insert links its slot after it
    /// (S3-FIFO's small queue, SIEVE's FIFO), so its link is a prefetch hint too.
    newest_hint: AtomicU32,
    w: Mutex<State>,
}

/// What only writers touch (under the shard's lock).
struct State {
    /// Next-newer slot in the slot's queue.
    next: Box<[u32]>,
    /// Slots `0..fresh` have been used (the rest were never filled).
    fresh: usize,
    q: Queues,
    inserts: u64,
    evictions: u64,
}

/// The index entry of a row of hash `h` in `slot`: `h`'s low 32 bits (its home, [`Shard::home`]),
/// its next 8, the slot.
#[inline]
fn entry(h: u64, slot: u32) -> u64 {
    (h as u32 as u64) << 32 | ((h >> 32) as u8 as u64) << SLOT_BITS | slot as u64
}

#[inline]
fn entry_slot(e: u64) -> u32 {
    e as u32 & SLOT_MASK
}

/// `n` entries, entry `i` made by `new(i)`, allocated at once (an allocation failure is an error,
/// not an abort).
fn alloc<T>(n: usize, new: impl Fn(usize) -> T, what: &str) -> Result<Box<[T]>> {
    let mut b = Vec::new();
    b.try_reserve_exact(n)
        .map_err(|_| Error::OutOfMemory(format!("row cache {what}: {n} entries")))?;
    b.extend((0..n).map(new));
    Ok(b.into_boxed_slice())
}

impl RowCache {
    /// A cache of rows of `row_bytes` whose allocation is at most `cache_bytes`, with the
    /// default policy. Fails when `cache_bytes` holds no row.
    pub fn new(cache_bytes: u64, row_bytes: usize) -> Result<RowCache> {
        RowCache::with_policy(cache_bytes, row_bytes, Policy::default())
    }

    /// Bytes one cached row of `row_bytes` costs with `policy` (row + overhead).
    pub fn row_cost(row_bytes: usize, policy: Policy) -> f64 {
        row_bytes as f64 + policy.overhead_per_row(row_bytes)
    }

    /// [`RowCache::new`] with a chosen policy.
    pub fn with_policy(cache_bytes: u64, row_bytes: usize, policy: Policy) -> Result<RowCache> {
        RowCache::with_pages(cache_bytes, row_bytes, policy, Pages::default())
    }

    /// [`RowCache::with_policy`] with the index and slots on the pages `pages` asks for
    /// (benchmarks compare both).
    pub fn with_pages(
        cache_bytes: u64,
        row_bytes: usize,
        policy: Policy,
        pages: Pages,
    ) -> Result<RowCache> {
        if row_bytes == 0 {
            return crate::invalid!("row cache: row_bytes is 0");
        }
        let per_row = RowCache::row_cost(row_bytes, policy);
        let est = (cache_bytes as f64 / per_row) as usize;
        let mut nshards = 1usize;
        while nshards * 2 <= MAX_SHARDS && est / (nshards * 2) >= MIN_SHARD_ROWS {
            nshards *= 2;
        }
        // each shard's fixed part, and the rounding up of its index, ghost and row words
        let fixed = (nshards * (std::mem::size_of::<Padded>() + SHARD_ROUNDING)) as u64
            + std::mem::size_of::<RowCache>() as u64;
        let rows = (cache_bytes.saturating_sub(fixed) as f64 / per_row).floor() as usize;
        let per_shard = rows / nshards;
        if per_shard == 0 {
            return crate::invalid!(
                "cache_bytes {cache_bytes} holds no row (each row of {row_bytes} bytes takes {per_row:.1} bytes)"
            );
        }
        if per_shard > MAX_SHARD_ROWS {
            return crate::invalid!(
                "cache_bytes {cache_bytes}: more than {} rows",
                MAX_SHARD_ROWS * MAX_SHARDS
            );
        }
        let (index_len, slab_len) = Shard::words(per_shard, row_bytes);
        let per_words = index_len + slab_len;
        let arena = Arena::new(nshards * per_words, pages)?;
        let mut shards = Vec::with_capacity(nshards);
        for i in 0..nshards {
            let (index, slab) = (
                arena.words(i * per_words, index_len),
                arena.words(i * per_words + index_len, slab_len),
            );
            shards.push(Padded(Shard::new(
                per_shard, row_bytes, policy, index, slab,
            )?));
        }
        Ok(RowCache {
            shards: shards.into_boxed_slice(),
            shard_bits: nshards.trailing_zeros(),
            row_bytes,
            policy,
            capacity_rows: per_shard * nshards,
            bytes_per_row: per_row,
            counts: Counts::default(),
            arena,
        })
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }
    pub fn policy(&self) -> Policy {
        self.policy
    }
    /// Rows the cache holds when full.
    pub fn capacity_rows(&self) -> usize {
        self.capacity_rows
    }
    /// Bytes one row costs (the row and its share of header, links, index and ghost).
    pub fn bytes_per_row(&self) -> f64 {
        self.bytes_per_row
    }
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }
    /// Bytes of the cache's index and slots the kernel backs with huge pages now
    /// (`AnonHugePages` of its mapping; None where `/proc/self/smaps` cannot tell).
    pub fn huge_page_bytes(&self) -> Option<u64> {
        if !self.arena.advised() {
            return Some(0);
        }
        crate::sys::smaps_of(self.arena.span().0).map(|(_, b)| b)
    }
    /// Bytes the cache allocated (all of it, at construction): at most the `cache_bytes` given.
    pub fn allocated_bytes(&self) -> u64 {
        let mut n = std::mem::size_of::<RowCache>() + std::mem::size_of_val(&*self.shards);
        for p in self.shards.iter() {
            let s = &p.0;
            n += 8 * s.slab.len() + INDEX_ENTRY * s.index.len();
            let st = s.lock();
            n += 4 * st.next.len();
            if let Queues::S3Fifo { ghost, .. } = &st.q {
                n += 4 * ghost.len();
            }
        }
        n as u64
    }

    #[inline]
    fn shard(&self, h: u64) -> &Shard {
        let i = if self.shard_bits == 0 {
            0
        } else {
            (h >> (64 - self.shard_bits)) as usize
        };
        &self.shards[i].0
    }

    /// Copies row `id` into `dst` (`row_bytes` long) if it is cached (a hit) and returns true;
    /// else returns false (a miss; `dst` may have been written). Takes no lock unless writers
    /// keep the row's shard busy; counts nothing (the caller [`record`](RowCache::record)s).
    #[inline]
    pub fn lookup(&self, id: u64, dst: &mut [u8]) -> bool {
        let mut ahead = 0;
        let hit = self.lookup_counted(id, dst, &mut ahead);
        if ahead > 0 {
            self.counts.ahead_hits.fetch_add(ahead, Relaxed);
        }
        hit
    }

    /// [`lookup`](RowCache::lookup), adding 1 to `ahead` when the hit is the first of a row
    /// read ahead (the callers add their batch's count to the counter once).
    fn lookup_counted(&self, id: u64, dst: &mut [u8], ahead: &mut u64) -> bool {
        assert_eq!(
            dst.len(),
            self.row_bytes,
            "row cache lookup: dst must be one row"
        );
        if id >= MAX_ROW_ID {
            return false;
        }
        let h = mix(id);
        let s = self.shard(h);
        for _ in 0..OPTIMISTIC_TRIES {
            let v = s.seq.load(Acquire);
            if v & 1 == 0 {
                let found = s.find(id, h);
                if let Some((_, slot)) = found {
                    s.copy_out(slot, dst);
                }
                // the reads above happen before the second load of `seq` (seqlock reader)
                fence(Acquire);
                if s.seq.load(Relaxed) == v {
                    return found.is_some_and(|(_, slot)| {
                        *ahead += s.touch(slot, id) as u64;
                        true
                    });
                }
            }
            std::hint::spin_loop();
        }
        // writers keep the shard busy: read under its lock, where none is inside
        let _g = s.lock();
        s.find(id, h).is_some_and(|(_, slot)| {
            s.copy_out(slot, dst);
            *ahead += s.touch(slot, id) as u64;
            true
        })
    }

    /// Adds a batch's hits and misses to the counters.
    pub fn record(&self, hits: u64, misses: u64) {
        if hits > 0 {
            self.counts.hits.fetch_add(hits, Relaxed);
        }
        if misses > 0 {
            self.counts.misses.fetch_add(misses, Relaxed);
        }
    }

    /// Caches row `id` (`src` is its `row_bytes` bytes), evicting a row if the shard is full. A
    /// row already cached is left as it is; ids ≥ [`MAX_ROW_ID`] are not cached.
    pub fn insert(&self, id: u64, src: &[u8]) {
        self.insert_flagged(id, src, 0);
    }

    /// [`insert`](RowCache::insert), the new row's header carrying `flags` ([`AHEAD`] or 0).
    fn insert_flagged(&self, id: u64, src: &[u8], flags: u8) {
        assert_eq!(
            src.len(),
            self.row_bytes,
            "row cache insert: src must be one row"
        );
        if id >= MAX_ROW_ID {
            return;
        }
        let h = mix(id);
        let s = self.shard(h);
        let mut st = s.lock();
        s.insert(&mut st, id, h, src, flags);
    }

    /// The counters now (each shard's are read under its lock).
    pub fn counters(&self) -> CacheCounters {
        let mut c = CacheCounters {
            hits: self.counts.hits.load(Relaxed),
            misses: self.counts.misses.load(Relaxed),
            ..Default::default()
        };
        for p in self.shards.iter() {
            let st = p.0.lock();
            c.inserts += st.inserts;
            c.evictions += st.evictions;
            c.rows += st.fresh as u64;
        }
        c.bytes_used = (c.rows as f64 * self.bytes_per_row).round() as u64;
        c
    }
}

/// Copies a row of `RB` bytes from its words (the last one padded) into `dst` (`RB` long); the
/// sizes known at compile time, the loop unrolls into one load and one store per word.
#[inline(always)]
fn copy_words<const RB: usize>(words: &[AtomicU64], dst: &mut [u8]) {
    let dst: &mut [u8; RB] = dst.try_into().expect("one row");
    let words = &words[..RB.div_ceil(8)];
    for i in 0..RB / 8 {
        dst[i * 8..i * 8 + 8].copy_from_slice(&words[i].load(Relaxed).to_le_bytes());
    }
    if RB % 8 != 0 {
        let b = words[RB / 8].load(Relaxed).to_le_bytes();
        dst[RB / 8 * 8..].copy_from_slice(&b[..RB % 8]);
    }
}

mod evict;
use evict::push;

mod policy;
pub use policy::{CacheCounters, Policy};

mod shard;
use shard::SHARD_ROUNDING;

mod index;

mod hints;

mod batch;

mod arena;
pub use arena::Pages;
use arena::{Arena, Words};

mod gather;

mod ahead;
pub use gather::{CachedGather, Lookups, ReadThroughScratch, gather_cached, read_through};
mod placement;
pub use placement::Placement;

#[cfg(test)]
mod tests;
