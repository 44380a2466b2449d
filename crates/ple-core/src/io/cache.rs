//! A bounded cache of table rows (not pages), shared by the gather pool.
//!
//! # Memory
//! Everything is allocated once, in [`RowCache::new`]; inserting or evicting a row allocates
//! nothing. Each cached row costs [`RowCache::bytes_per_row`] bytes: the row itself, an 8-byte
//! header (row id and policy bits, stored in front of the row so the id check and the copy touch
//! the same cache lines), a 4-byte queue link, 4/3 × 4 bytes of index (an open-addressed table
//! at load ≤ 0.75 whose entries carry an 8-bit hash tag, so a probe rarely reads a slot), and
//! for S3-FIFO 0.9 × 4 bytes of ghost fingerprints: 20.9 B of overhead per row with S3-FIFO,
//! 17.3 B with SIEVE (a 90-byte NVFP4 row costs 110.9 B: 256 MiB holds 2.4 million rows).
//! The slot count is chosen so that the whole allocation is at most `cache_bytes`.
//!
//! # Concurrency
//! Rows are spread over up to 256 shards by a hash of the row id; each shard has its own lock
//! (cache-line aligned) and nothing is shared between shards, so threads gathering different
//! rows rarely meet: there is no global lock on any path. A hit holds its shard's lock for the
//! index probe, one row copy and a policy bit update.
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
//! access sequence; S3-FIFO is the default because it measured best (see the README, "Row cache").

use crate::error::{Error, Result};
use std::sync::Mutex;

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
    /// Bytes per row besides the row itself (header, link, index, ghost).
    fn overhead_per_row(self) -> f64 {
        let base = HEADER as f64 + 4.0 + 4.0 / MAX_LOAD;
        match self {
            Policy::S3Fifo => base + 4.0 * (1.0 - SMALL_FRACTION),
            Policy::Sieve => base,
        }
    }
}

/// Counters of a [`RowCache`] (rows, except `bytes_used`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    pub hits: u64,
    pub misses: u64,
    pub inserts: u64,
    pub evictions: u64,
    /// Rows held now.
    pub rows: u64,
    /// `rows × bytes_per_row`, rounded: the share of `cache_bytes` in use.
    pub bytes_used: u64,
}

/// Bytes of a slot's header: `id << 8 | policy bits`.
const HEADER: usize = 8;
/// Largest index load factor.
const MAX_LOAD: f64 = 0.75;
/// Share of an S3-FIFO shard's slots for its small FIFO.
const SMALL_FRACTION: f64 = 0.1;
/// Most shards; a shard holds at least [`MIN_SHARD_ROWS`] rows unless the cache is smaller.
const MAX_SHARDS: usize = 256;
const MIN_SHARD_ROWS: usize = 64;
/// No slot / no index entry.
const NIL: u32 = u32::MAX;
/// Header of an empty slot.
const EMPTY: u64 = u64::MAX;
/// Row ids the cache can hold are below this (the header keeps 8 bits for the policy).
pub const MAX_ROW_ID: u64 = 1 << 56;
/// Bits of an index entry holding the slot (the top 8 are the tag).
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u32 = (1 << SLOT_BITS) - 1;
/// Most slots of one shard.
const MAX_SHARD_ROWS: usize = SLOT_MASK as usize;
/// S3-FIFO: largest frequency kept (2 bits).
const MAX_FREQ: u8 = 3;

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
}

#[repr(align(128))]
struct Padded(Mutex<Shard>);

/// Policy state of one shard: queues are singly linked through `Shard::next`, oldest to newest.
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

impl Queues {
    /// Stands in while the queues are borrowed out of the shard.
    const TAKEN: Queues = Queues::Sieve {
        fifo: Fifo::EMPTY,
        hand: NIL,
        hand_prev: NIL,
    };
}

impl Fifo {
    const EMPTY: Fifo = Fifo {
        oldest: NIL,
        newest: NIL,
        len: 0,
    };
}

struct Shard {
    /// `cap` slots of `HEADER + row_bytes` bytes.
    slab: Box<[u8]>,
    /// Next-newer slot in the slot's queue.
    next: Box<[u32]>,
    /// Open-addressed index: `tag << 24 | slot`, NIL if empty.
    index: Box<[u32]>,
    cap: usize,
    /// `HEADER + row_bytes`.
    stride: usize,
    /// Slots `0..fresh` have been used (the rest were never filled).
    fresh: usize,
    q: Queues,
    hits: u64,
    misses: u64,
    inserts: u64,
    evictions: u64,
}

fn alloc<T: Copy>(n: usize, v: T, what: &str) -> Result<Box<[T]>> {
    let mut b = Vec::new();
    b.try_reserve_exact(n)
        .map_err(|_| Error::OutOfMemory(format!("row cache {what}: {n} entries")))?;
    b.resize(n, v);
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
        row_bytes as f64 + policy.overhead_per_row()
    }

    /// [`RowCache::new`] with a chosen policy.
    pub fn with_policy(cache_bytes: u64, row_bytes: usize, policy: Policy) -> Result<RowCache> {
        if row_bytes == 0 {
            return crate::invalid!("row cache: row_bytes is 0");
        }
        let per_row = RowCache::row_cost(row_bytes, policy);
        let est = (cache_bytes as f64 / per_row) as usize;
        let mut nshards = 1usize;
        while nshards * 2 <= MAX_SHARDS && est / (nshards * 2) >= MIN_SHARD_ROWS {
            nshards *= 2;
        }
        // each shard's fixed part, and the rounding up of its index and ghost lengths
        let fixed = (nshards * (std::mem::size_of::<Padded>() + 8)) as u64
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
        let mut shards = Vec::with_capacity(nshards);
        for _ in 0..nshards {
            shards.push(Padded(Mutex::new(Shard::new(
                per_shard, row_bytes, policy,
            )?)));
        }
        Ok(RowCache {
            shards: shards.into_boxed_slice(),
            shard_bits: nshards.trailing_zeros(),
            row_bytes,
            policy,
            capacity_rows: per_shard * nshards,
            bytes_per_row: per_row,
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
    /// Bytes the cache allocated (all of it, at construction): at most the `cache_bytes` given.
    pub fn allocated_bytes(&self) -> u64 {
        let mut n = std::mem::size_of::<RowCache>() + std::mem::size_of_val(&*self.shards);
        for p in self.shards.iter() {
            let s = p.0.lock().unwrap_or_else(|p| p.into_inner());
            n += s.slab.len() + 4 * (s.next.len() + s.index.len());
            if let Queues::S3Fifo { ghost, .. } = &s.q {
                n += 4 * ghost.len();
            }
        }
        n as u64
    }

    #[inline]
    fn shard(&self, h: u64) -> std::sync::MutexGuard<'_, Shard> {
        let i = if self.shard_bits == 0 {
            0
        } else {
            (h >> (64 - self.shard_bits)) as usize
        };
        self.shards[i].0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Copies row `id` into `dst` (`row_bytes` long) if it is cached (a hit), else returns false
    /// (a miss) and leaves `dst` alone.
    pub fn lookup(&self, id: u64, dst: &mut [u8]) -> bool {
        let rb = self.row_bytes;
        assert_eq!(dst.len(), rb, "row cache lookup: dst must be one row");
        let h = mix(id);
        let mut s = self.shard(h);
        if id >= MAX_ROW_ID {
            s.misses += 1;
            return false;
        }
        match s.find(id, h) {
            Some((_, slot)) => {
                let at = slot as usize * s.stride;
                dst.copy_from_slice(&s.slab[at + HEADER..at + HEADER + rb]);
                s.touch(slot);
                s.hits += 1;
                true
            }
            None => {
                s.misses += 1;
                false
            }
        }
    }

    /// Caches row `id` (`src` is its `row_bytes` bytes), evicting a row if the shard is full. A
    /// row already cached is left as it is; ids ≥ [`MAX_ROW_ID`] are not cached.
    pub fn insert(&self, id: u64, src: &[u8]) {
        assert_eq!(
            src.len(),
            self.row_bytes,
            "row cache insert: src must be one row"
        );
        if id >= MAX_ROW_ID {
            return;
        }
        let h = mix(id);
        self.shard(h).insert(id, h, src);
    }

    /// The counters now (each shard's are read under its lock).
    pub fn counters(&self) -> CacheCounters {
        let mut c = CacheCounters::default();
        for p in self.shards.iter() {
            let s = p.0.lock().unwrap_or_else(|p| p.into_inner());
            c.hits += s.hits;
            c.misses += s.misses;
            c.inserts += s.inserts;
            c.evictions += s.evictions;
            c.rows += s.fresh as u64;
        }
        c.bytes_used = (c.rows as f64 * self.bytes_per_row).round() as u64;
        c
    }
}

impl Shard {
    fn new(cap: usize, row_bytes: usize, policy: Policy) -> Result<Shard> {
        let stride = HEADER + row_bytes;
        let mut slab = alloc(cap * stride, 0u8, "slab")?;
        for s in slab.chunks_exact_mut(stride) {
            s[..HEADER].copy_from_slice(&EMPTY.to_le_bytes());
        }
        let index_len = ((cap as f64 / MAX_LOAD).ceil() as usize).max(cap + 1);
        let q = match policy {
            Policy::S3Fifo => Queues::S3Fifo {
                small: Fifo::EMPTY,
                main: Fifo::EMPTY,
                small_cap: ((cap as f64 * SMALL_FRACTION).round() as usize).max(1),
                ghost: alloc(
                    ((cap as f64 * (1.0 - SMALL_FRACTION)) as usize).max(1),
                    0u32,
                    "ghost",
                )?,
            },
            Policy::Sieve => Queues::Sieve {
                fifo: Fifo::EMPTY,
                hand: NIL,
                hand_prev: NIL,
            },
        };
        Ok(Shard {
            slab,
            next: alloc(cap, NIL, "links")?,
            index: alloc(index_len, NIL, "index")?,
            cap,
            stride,
            fresh: 0,
            q,
            hits: 0,
            misses: 0,
            inserts: 0,
            evictions: 0,
        })
    }

    #[inline]
    fn header(&self, slot: u32) -> u64 {
        let at = slot as usize * self.stride;
        u64::from_le_bytes(self.slab[at..at + HEADER].try_into().expect("8 bytes"))
    }

    #[inline]
    fn set_header(&mut self, slot: u32, v: u64) {
        let at = slot as usize * self.stride;
        self.slab[at..at + HEADER].copy_from_slice(&v.to_le_bytes());
    }

    #[inline]
    fn bits(&self, slot: u32) -> u8 {
        self.header(slot) as u8
    }

    #[inline]
    fn set_bits(&mut self, slot: u32, b: u8) {
        let h = self.header(slot);
        self.set_header(slot, (h & !0xFF) | b as u64);
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        reduce(h as u32, self.index.len())
    }

    /// The index position and slot of `id` (hash `h`), if cached.
    #[inline]
    fn find(&self, id: u64, h: u64) -> Option<(usize, u32)> {
        let tag = (h >> 32) as u8 as u32;
        let n = self.index.len();
        let mut i = self.home(h);
        loop {
            let e = self.index[i];
            if e == NIL {
                return None;
            }
            if e >> SLOT_BITS == tag && self.header(e & SLOT_MASK) >> 8 == id {
                return Some((i, e & SLOT_MASK));
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
    }

    /// Removes index entry `i` (backward-shift deletion: no tombstones, probe chains stay short).
    fn index_remove(&mut self, mut i: usize) {
        let n = self.index.len();
        let mut j = i;
        loop {
            j = if j + 1 == n { 0 } else { j + 1 };
            let e = self.index[j];
            if e == NIL {
                break;
            }
            let home = self.home(mix(self.header(e & SLOT_MASK) >> 8));
            // entry j may move to the hole at i unless its home lies cyclically in (i, j]
            let stays = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !stays {
                self.index[i] = e;
                i = j;
            }
        }
        self.index[i] = NIL;
    }

    fn index_insert(&mut self, h: u64, slot: u32) {
        let n = self.index.len();
        let mut i = self.home(h);
        while self.index[i] != NIL {
            i = if i + 1 == n { 0 } else { i + 1 };
        }
        self.index[i] = ((h >> 32) as u8 as u32) << SLOT_BITS | slot;
    }

    /// A hit on `slot` (holding `id`).
    #[inline]
    fn touch(&mut self, slot: u32) {
        let b = self.bits(slot);
        let nb = match self.q {
            Queues::S3Fifo { .. } => (b + 1).min(MAX_FREQ),
            Queues::Sieve { .. } => 1,
        };
        if nb != b {
            self.set_bits(slot, nb);
        }
    }

    fn push(&mut self, f: &mut Fifo, slot: u32) {
        self.next[slot as usize] = NIL;
        if f.newest == NIL {
            f.oldest = slot;
        } else {
            self.next[f.newest as usize] = slot;
        }
        f.newest = slot;
        f.len += 1;
    }

    fn pop(&mut self, f: &mut Fifo) -> u32 {
        let s = f.oldest;
        debug_assert_ne!(s, NIL);
        f.oldest = self.next[s as usize];
        if f.oldest == NIL {
            f.newest = NIL;
        }
        f.len -= 1;
        s
    }

    fn insert(&mut self, id: u64, h: u64, src: &[u8]) {
        if self.find(id, h).is_some() {
            return;
        }
        let slot = if self.fresh < self.cap {
            self.fresh += 1;
            (self.fresh - 1) as u32
        } else {
            let s = self.evict();
            let old = self.header(s) >> 8;
            let (i, _) = self.find(old, mix(old)).expect("an evicted row is indexed");
            self.index_remove(i);
            self.evictions += 1;
            s
        };
        let at = slot as usize * self.stride;
        self.slab[at + HEADER..at + HEADER + src.len()].copy_from_slice(src);
        self.set_header(slot, id << 8);
        let mut q = std::mem::replace(&mut self.q, Queues::TAKEN);
        match &mut q {
            Queues::S3Fifo {
                small, main, ghost, ..
            } => {
                let h2 = mix(h);
                let g = reduce(h2 as u32, ghost.len());
                let fp = (h2 >> 32) as u32 | 1;
                if ghost[g] == fp {
                    ghost[g] = 0;
                    self.push(main, slot);
                } else {
                    self.push(small, slot);
                }
            }
            Queues::Sieve { fifo, .. } => self.push(fifo, slot),
        }
        self.q = q;
        self.index_insert(h, slot);
        self.inserts += 1;
    }

    /// Picks the slot to reuse (the shard is full); the slot stays indexed (the caller removes it).
    fn evict(&mut self) -> u32 {
        let mut q = std::mem::replace(&mut self.q, Queues::TAKEN);
        let s = match &mut q {
            Queues::S3Fifo {
                small,
                main,
                small_cap,
                ghost,
            } => self.evict_s3(small, main, *small_cap, ghost),
            Queues::Sieve {
                fifo,
                hand,
                hand_prev,
            } => self.evict_sieve(fifo, hand, hand_prev),
        };
        self.q = q;
        s
    }

    fn evict_s3(
        &mut self,
        small: &mut Fifo,
        main: &mut Fifo,
        small_cap: usize,
        ghost: &mut [u32],
    ) -> u32 {
        loop {
            if small.len > 0 && (small.len >= small_cap || main.len == 0) {
                let t = self.pop(small);
                if self.bits(t) > 0 && self.cap > 1 {
                    // hit while in the small FIFO: promote
                    self.set_bits(t, 0);
                    self.push(main, t);
                    continue;
                }
                let h2 = mix(mix(self.header(t) >> 8));
                let g = reduce(h2 as u32, ghost.len());
                ghost[g] = (h2 >> 32) as u32 | 1;
                return t;
            }
            let t = self.pop(main);
            let f = self.bits(t);
            if f > 0 {
                self.set_bits(t, f - 1);
                self.push(main, t);
                continue;
            }
            return t;
        }
    }

    fn evict_sieve(&mut self, fifo: &mut Fifo, hand: &mut u32, hand_prev: &mut u32) -> u32 {
        let (mut prev, mut cur) = if *hand == NIL {
            (NIL, fifo.oldest)
        } else {
            (*hand_prev, *hand)
        };
        while self.bits(cur) != 0 {
            self.set_bits(cur, 0);
            prev = cur;
            cur = self.next[cur as usize];
            if cur == NIL {
                prev = NIL;
                cur = fifo.oldest;
            }
        }
        let nx = self.next[cur as usize];
        if prev == NIL {
            fifo.oldest = nx;
        } else {
            self.next[prev as usize] = nx;
        }
        if fifo.newest == cur {
            fifo.newest = prev;
        }
        fifo.len -= 1;
        *hand = nx;
        *hand_prev = if nx == NIL { NIL } else { prev };
        cur
    }
}

#[path = "cache_gather.rs"]
mod gather;
pub use gather::{CachedGather, ReadThroughScratch, gather_cached, read_through};

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
