//! References for `ple bench steady`, replayed on the bench's own row-id sequence: an exact LRU
//! of rows, an exact LRU of 4 KiB pages (what the page cache would keep in the same memory), and
//! the row cache's policies.

use ple_core::io::cache::{Policy, RowCache};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Bytes one page costs the page cache: the page and its `struct page` and mapping entries.
pub const PAGE_COST: u64 = 4096 + 64;
const NIL: u32 = u32::MAX;

/// A multiplicative hasher for u64 keys (the keys are row or page numbers).
#[derive(Default)]
pub struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        self.0 ^= self.0 >> 32;
    }
}
type IdMap = HashMap<u64, u32, BuildHasherDefault<IdHasher>>;

/// An exact LRU of `cap` keys: a hash map into a doubly linked list over a fixed node array.
pub struct ExactLru {
    map: IdMap,
    keys: Vec<u64>,
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Most and least recent node.
    head: u32,
    tail: u32,
    cap: usize,
}

impl ExactLru {
    pub fn new(cap: usize) -> ExactLru {
        let cap = cap.max(1);
        ExactLru {
            map: IdMap::with_capacity_and_hasher(cap.min(1 << 24), Default::default()),
            keys: Vec::new(),
            prev: Vec::new(),
            next: Vec::new(),
            head: NIL,
            tail: NIL,
            cap,
        }
    }

    fn unlink(&mut self, n: u32) {
        let (p, x) = (self.prev[n as usize], self.next[n as usize]);
        if p == NIL {
            self.head = x;
        } else {
            self.next[p as usize] = x;
        }
        if x == NIL {
            self.tail = p;
        } else {
            self.prev[x as usize] = p;
        }
    }

    fn push_front(&mut self, n: u32) {
        self.prev[n as usize] = NIL;
        self.next[n as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = n;
        } else {
            self.tail = n;
        }
        self.head = n;
    }

    /// Accesses `key`: true on a hit; a miss inserts it, evicting the least recent key if full.
    pub fn access(&mut self, key: u64) -> bool {
        if let Some(&n) = self.map.get(&key) {
            if self.head != n {
                self.unlink(n);
                self.push_front(n);
            }
            return true;
        }
        let n = if self.keys.len() < self.cap {
            self.keys.push(key);
            self.prev.push(NIL);
            self.next.push(NIL);
            (self.keys.len() - 1) as u32
        } else {
            let n = self.tail;
            self.unlink(n);
            self.map.remove(&self.keys[n as usize]);
            self.keys[n as usize] = key;
            n
        };
        self.map.insert(key, n);
        self.push_front(n);
        false
    }
}

/// Storage bytes a direct read of one row moves: the `sector`-aligned span covering it.
pub fn direct_read_bytes(id: u64, row_bytes: u64, sector: u64) -> u64 {
    let a = id * row_bytes;
    let first = a / sector;
    let last = (a + row_bytes - 1) / sector;
    (last - first + 1) * sector
}

/// Hits and storage bytes of one reference (or policy) over a stretch of the sequence.
#[derive(Default, Clone, Copy, Debug)]
pub struct Tally {
    pub lookups: u64,
    pub hits: u64,
    pub storage_bytes: u64,
}

impl Tally {
    pub fn add(&mut self, o: Tally) {
        self.lookups += o.lookups;
        self.hits += o.hits;
        self.storage_bytes += o.storage_bytes;
    }
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / self.lookups.max(1) as f64
    }
}

/// What is replayed: a policy of the row cache, or an exact LRU of rows or of pages.
pub enum Model {
    Policy(RowCache, Vec<u8>),
    RowLru(ExactLru),
    PageLru(ExactLru),
}

/// One replayed model at one memory size.
pub struct Replay {
    pub name: String,
    pub memory: u64,
    /// Rows (or pages) it holds.
    pub capacity: usize,
    model: Model,
    pub total: Tally,
    pub interval: Tally,
}

impl Replay {
    /// The row cache with `policy` in `memory` bytes (None if it holds no row).
    pub fn policy(memory: u64, row_bytes: usize, policy: Policy) -> Option<Replay> {
        let c = RowCache::with_policy(memory, row_bytes, policy).ok()?;
        Some(Replay {
            name: policy.name().into(),
            memory,
            capacity: c.capacity_rows(),
            model: Model::Policy(c, vec![0u8; row_bytes]),
            total: Tally::default(),
            interval: Tally::default(),
        })
    }
    /// An exact LRU of `rows` rows.
    pub fn row_lru(memory: u64, rows: usize) -> Replay {
        Replay {
            name: "LRU rows".into(),
            memory,
            capacity: rows,
            model: Model::RowLru(ExactLru::new(rows)),
            total: Tally::default(),
            interval: Tally::default(),
        }
    }
    /// An exact LRU of the 4 KiB pages `memory` holds at [`PAGE_COST`] each.
    pub fn page_lru(memory: u64) -> Replay {
        let pages = (memory / PAGE_COST).max(1) as usize;
        Replay {
            name: "LRU pages".into(),
            memory,
            capacity: pages,
            model: Model::PageLru(ExactLru::new(pages)),
            total: Tally::default(),
            interval: Tally::default(),
        }
    }

    /// Replays one step's row ids. Row models charge a miss its direct read of `sector`-aligned
    /// bytes; the page model charges each missing page 4 KiB and counts a row as a hit when all
    /// its pages were resident.
    pub fn feed(&mut self, ids: &[u64], row_bytes: u64, sector: u64) {
        let mut t = Tally {
            lookups: ids.len() as u64,
            ..Default::default()
        };
        match &mut self.model {
            Model::Policy(c, buf) => {
                for &id in ids {
                    if c.lookup(id, buf) {
                        t.hits += 1;
                    } else {
                        c.insert(id, buf);
                        t.storage_bytes += direct_read_bytes(id, row_bytes, sector);
                    }
                }
            }
            Model::RowLru(l) => {
                for &id in ids {
                    if l.access(id) {
                        t.hits += 1;
                    } else {
                        t.storage_bytes += direct_read_bytes(id, row_bytes, sector);
                    }
                }
            }
            Model::PageLru(l) => {
                for &id in ids {
                    let a = id * row_bytes;
                    let mut all = true;
                    for pg in a >> 12..=(a + row_bytes - 1) >> 12 {
                        if !l.access(pg) {
                            all = false;
                            t.storage_bytes += 4096;
                        }
                    }
                    t.hits += all as u64;
                }
            }
        }
        self.total.add(t);
        self.interval.add(t);
    }
}

/// The replay of `name` at `memory` bytes.
pub fn find<'a>(r: &'a [Replay], memory: u64, name: &str) -> Option<&'a Replay> {
    r.iter().find(|x| x.memory == memory && x.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_lru_matches_a_naive_lru() {
        let mut l = ExactLru::new(50);
        let mut naive: Vec<u64> = Vec::new();
        let mut r = 1u64;
        for _ in 0..20_000 {
            r = ple_core::model::splitmix64(r);
            let k = r % 120;
            let want = if let Some(i) = naive.iter().position(|&x| x == k) {
                naive.remove(i);
                true
            } else {
                if naive.len() == 50 {
                    naive.pop();
                }
                false
            };
            naive.insert(0, k);
            assert_eq!(l.access(k), want);
        }
    }

    #[test]
    fn direct_reads_cover_the_row() {
        assert_eq!(direct_read_bytes(0, 90, 512), 512);
        assert_eq!(direct_read_bytes(5, 90, 512), 1024); // bytes 450..540
        assert_eq!(direct_read_bytes(45, 90, 4096), 8192); // bytes 4050..4140: two pages
        assert_eq!(direct_read_bytes(46, 90, 4096), 4096);
        assert_eq!(direct_read_bytes(45, 90, 8192), 8192);
    }

    #[test]
    fn page_lru_counts_a_row_hit_only_when_all_its_pages_are_resident() {
        let mut p = Replay::page_lru(PAGE_COST * 2);
        // row 45 of 90 B spans pages 0 and 1
        p.feed(&[45], 90, 512);
        p.feed(&[45, 0, 46], 90, 512);
        assert_eq!(p.total.lookups, 4);
        assert_eq!(p.total.hits, 3);
        assert_eq!(p.total.storage_bytes, 2 * 4096);
    }
}
