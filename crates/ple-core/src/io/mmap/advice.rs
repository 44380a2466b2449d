//! Page advice: a batch's row pages (a row can straddle two), deduplicated, sorted and coalesced
//! into a page set, advised WILLNEED ([`willneed`]) before the gather so the SSD sees them at
//! queue depth; residency samples that tell whether a step needs it.
//!
//! A step's rows are known before they are read, so the worker computes every row's first and last
//! 4 KiB page (a row can straddle two), dedupes and sorts them, coalesces neighbours into ranges and
//! asks the kernel to read them (`posix_fadvise(POSIX_FADV_WILLNEED)` on the row file) before the
//! gather: the device then sees the whole step at high queue depth instead of one fault at a time.
//! Prefetch reads exactly the pages named (no readahead beyond them) and leaves them in the page
//! cache, file-backed and reclaimable.

use crate::error::{Error, Result};
use std::os::fd::AsRawFd;

/// The accounting page: 4 KiB (rows are mapped to these; the OS page may be larger).
pub const PAGE_SHIFT: u32 = 12;
pub const PAGE: u64 = 1 << PAGE_SHIFT;

/// A run of consecutive pages `[first, first + count)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRange {
    pub first: u64,
    pub count: u64,
}

/// Sorted, deduplicated pages of a set of rows, and their coalesced ranges.
#[derive(Clone, Debug, Default)]
pub struct PageSet {
    /// Distinct page numbers, ascending.
    pub pages: Vec<u64>,
    /// `pages` coalesced into runs.
    pub ranges: Vec<PageRange>,
}

/// Steps with at least this many rows use a bitmap over the table's pages instead of a sort.
const BITMAP_MIN_ROWS: usize = 4096;

/// Builds page sets, keeping its buffers between steps (the worker owns one).
#[derive(Default, Debug)]
pub struct PageSetBuilder {
    scratch: Vec<u64>,
    bitmap: Vec<u64>,
    /// Open-addressing set for [`PageSetBuilder::count_unique`]: (page + 1, generation).
    table: Vec<(u64, u32)>,
    generation: u32,
}

impl PageSet {
    /// The page set of `rows` for rows of `row_bytes` bytes (row `r` at byte `r * row_bytes`).
    pub fn from_rows(rows: &[u64], row_bytes: usize) -> PageSet {
        let mut s = PageSet::default();
        PageSetBuilder::default().build(rows, row_bytes, &mut s);
        s
    }

    /// Distinct pages.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Rebuilds `ranges` from the sorted `pages`.
    fn coalesce(&mut self) {
        self.ranges.clear();
        let mut cur: Option<PageRange> = None;
        for &p in &self.pages {
            match &mut cur {
                Some(r) if r.first + r.count == p => r.count += 1,
                _ => {
                    if let Some(r) = cur.take() {
                        self.ranges.push(r);
                    }
                    cur = Some(PageRange { first: p, count: 1 });
                }
            }
        }
        self.ranges.extend(cur);
    }
}

fn first_last_page(row: u64, row_bytes: u64) -> (u64, u64) {
    let off = row * row_bytes;
    (off >> PAGE_SHIFT, (off + row_bytes - 1) >> PAGE_SHIFT)
}

impl PageSetBuilder {
    /// Grows the (all-zero) bitmap to cover every page of `rows`; returns the words in use.
    fn size_bitmap(&mut self, rows: &[u64], rb: u64) -> usize {
        let max_page = rows
            .iter()
            .map(|&r| first_last_page(r, rb).1)
            .max()
            .unwrap_or(0);
        let words = (max_page as usize >> 6) + 1;
        if self.bitmap.len() < words {
            self.bitmap.resize(words, 0);
        }
        words
    }

    /// The number of distinct pages of `rows`, without sorting (for steps that need no ranges): a
    /// bitmap with test-and-set for big inputs, a hash set for small ones; both reused and left
    /// clean.
    pub fn count_unique(&mut self, rows: &[u64], row_bytes: usize) -> usize {
        let rb = row_bytes as u64;
        if rows.len() >= BITMAP_MIN_ROWS {
            // (a bitmap of the whole table is a few hundred KiB: clearing it all at once is
            // cheaper than a second random pass over the rows)
            // (a bitmap of the whole table is a few hundred KiB: clearing it at once is cheaper
            // than a second random pass over the rows)
            let words = self.size_bitmap(rows, rb);
            let bm = &mut self.bitmap[..words];
            let mut n = 0;
            let mut set = |p: u64| {
                let w = &mut bm[(p >> 6) as usize];
                let bit = 1u64 << (p & 63);
                n += (*w & bit == 0) as usize;
                *w |= bit;
            };
            for &r in rows {
                let (a, b) = first_last_page(r, rb);
                set(a);
                if b != a {
                    set(b);
                }
            }
            bm.fill(0);
            return n;
        }
        let cap = (rows.len() * 4).next_power_of_two().max(64);
        if self.table.len() < cap || self.generation == u32::MAX {
            self.table.clear();
            self.table.resize(cap.max(self.table.len()), (0, 0));
            self.generation = 0;
        }
        self.generation += 1;
        let g = self.generation;
        let mask = self.table.len() - 1;
        let mut n = 0;
        for &r in rows {
            let (a, b) = first_last_page(r, rb);
            for p in [a, b] {
                let key = p + 1;
                let mut i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & mask;
                loop {
                    let e = &mut self.table[i];
                    if e.1 != g {
                        *e = (key, g);
                        n += 1;
                        break;
                    }
                    if e.0 == key {
                        break;
                    }
                    i = (i + 1) & mask;
                }
                if a == b {
                    break;
                }
            }
        }
        n
    }

    /// Fills `out` with the page set of `rows`.
    pub fn build(&mut self, rows: &[u64], row_bytes: usize, out: &mut PageSet) {
        out.pages.clear();
        out.ranges.clear();
        if rows.is_empty() || row_bytes == 0 {
            return;
        }
        let rb = row_bytes as u64;
        if rows.len() >= BITMAP_MIN_ROWS {
            let words = self.size_bitmap(rows, rb);
            for &r in rows {
                let (a, b) = first_last_page(r, rb);
                self.bitmap[(a >> 6) as usize] |= 1 << (a & 63);
                self.bitmap[(b >> 6) as usize] |= 1 << (b & 63);
            }
            for (wi, w) in self.bitmap[..words].iter_mut().enumerate() {
                let mut bits = *w;
                if bits == 0 {
                    continue;
                }
                *w = 0;
                while bits != 0 {
                    let t = bits.trailing_zeros() as u64;
                    out.pages.push(((wi as u64) << 6) | t);
                    bits &= bits - 1;
                }
            }
        } else {
            self.scratch.clear();
            for &r in rows {
                let (a, b) = first_last_page(r, rb);
                self.scratch.push(a);
                if b != a {
                    self.scratch.push(b);
                }
            }
            self.scratch.sort_unstable();
            self.scratch.dedup();
            out.pages.extend_from_slice(&self.scratch);
        }
        out.coalesce();
    }
}

/// Most pages probed by [`sample_resident`] for one step.
pub const RESIDENCY_SAMPLE: usize = 16;
/// Least pages probed for a step of at least this many rows (a decode step of a few requests:
/// one probe would miss a partly cached step too often, and each costs about 1 µs).
pub const RESIDENCY_SAMPLE_MIN: usize = 4;

/// Pages [`sample_resident`] probes for a step of `rows` rows: one per 1,024 rows, between
/// [`RESIDENCY_SAMPLE_MIN`] (or `rows`, if fewer) and [`RESIDENCY_SAMPLE`].
pub fn sample_size(rows: usize) -> usize {
    (rows / 1024).clamp(RESIDENCY_SAMPLE_MIN.min(rows.max(1)), RESIDENCY_SAMPLE)
}

/// Whether the first pages of `k` rows spread evenly over `rows` are all in the page cache
/// (`mincore`, one call per sampled page: ~1–3 µs each). A step whose sample is all resident is
/// very likely (almost) entirely cached, and issuing WILLNEED for all its ranges would cost more
/// than it saves (about 1 µs per range even when cached).
pub fn sample_resident(map: &[u8], rows: &[u64], row_bytes: usize, k: usize) -> bool {
    let n = rows.len();
    if n == 0 {
        return true;
    }
    let k = k.clamp(1, n);
    (0..k).all(|j| {
        let at = rows[j * n / k] * row_bytes as u64;
        // a row past the mapping's end (file shorter than the table) cannot be cached
        at < map.len() as u64 && crate::sys::page_resident(map, at as usize)
    })
}

/// Issues `posix_fadvise(WILLNEED)` for `ranges` of the file behind `file` (mapped at `map`),
/// clamped to the file. Returns the pages covered.
pub fn willneed(file: &std::fs::File, map: &[u8], ranges: &[PageRange]) -> Result<u64> {
    let len = map.len() as u64;
    let mut pages = 0;
    for r in ranges {
        let off = r.first << PAGE_SHIFT;
        if off >= len {
            continue;
        }
        let n = (r.count << PAGE_SHIFT).min(len - off);
        pages += n.div_ceil(PAGE);
        crate::sys::fadvise(file.as_raw_fd(), off, n, libc::POSIX_FADV_WILLNEED)
            .map_err(|e| Error::io("posix_fadvise(WILLNEED)", e))?;
    }
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(rows: &[u64], rb: u64) -> Vec<u64> {
        let mut v: Vec<u64> = rows
            .iter()
            .flat_map(|&r| {
                let a = r * rb / 4096;
                let b = (r * rb + rb - 1) / 4096;
                a..=b
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }

    #[test]
    fn straddling_rows_touch_two_pages() {
        // row 45 of 90 B: bytes 4050..4140 → pages 0 and 1
        let s = PageSet::from_rows(&[45], 90);
        assert_eq!(s.pages, vec![0, 1]);
        assert_eq!(s.ranges, vec![PageRange { first: 0, count: 2 }]);
        // row 0 and row 100 (page 2): two ranges
        let s = PageSet::from_rows(&[100, 0, 0], 90);
        assert_eq!(s.pages, vec![0, 2]);
        assert_eq!(s.ranges.len(), 2);
    }

    #[test]
    fn sort_and_bitmap_paths_agree_with_naive() {
        let mut b = PageSetBuilder::default();
        let mut out = PageSet::default();
        for (n, rb) in [
            (50usize, 90u64),
            (5000, 90),
            (9000, 160),
            (4096, 320),
            (100, 320),
        ] {
            let rows: Vec<u64> = (0..n as u64)
                .map(|i| crate::model::splitmix64(i * 7 + rb) % 2_000_000)
                .collect();
            b.build(&rows, rb as usize, &mut out);
            assert_eq!(out.pages, naive(&rows, rb), "n={n} rb={rb}");
            let total: u64 = out.ranges.iter().map(|r| r.count).sum();
            assert_eq!(total as usize, out.pages.len());
            for w in out.ranges.windows(2) {
                assert!(w[0].first + w[0].count < w[1].first, "ranges not coalesced");
            }
        }
        // the bitmap is left clean for the next step
        assert!(b.bitmap.iter().all(|&w| w == 0));
        // the unsorted count agrees, across reuses of the builder
        for (n, rb) in [
            (50usize, 90u64),
            (3000, 90),
            (10, 320),
            (700, 160),
            (9000, 90),
        ] {
            let rows: Vec<u64> = (0..n as u64)
                .map(|i| crate::model::splitmix64(i + rb) % 100_000)
                .collect();
            assert_eq!(b.count_unique(&rows, rb as usize), naive(&rows, rb).len());
        }
        assert!(b.bitmap.iter().all(|&w| w == 0));
    }
}
