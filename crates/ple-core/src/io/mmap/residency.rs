//! MMAP mode's cap on the table's page-cache residency (`OpenOptions::resident_bytes_max`).
//!
//! The row file is split into chunks of [`CHUNK_BYTES`]. Each chunk carries the step number of
//! its last use (0: not resident as far as the cap knows) and a bitmap of its OS pages that rows
//! were read from. At open a `mincore` scan marks every resident page, its chunk used at step 1
//! (the oldest), so a table already in the page cache (freshly written, or read by an earlier
//! process) is trimmed too. After each step the worker marks the pages its rows lie in, and
//! when more pages are marked than the cap holds, drops the least recently used chunks whole (`sys::drop_cached`: `MADV_DONTNEED` then
//! `POSIX_FADV_DONTNEED`, the pair that frees a mapped file's clean pages; docs/RELIABILITY.md)
//! down to [`TRIM_TO`] of the cap, so trimming runs once per many steps, not every step.
//!
//! Invariants: `live` is the number of marked pages, each chunk with a marked page has a nonzero
//! stamp; the marked pages are what this handle's reads brought in (the kernel reads no more
//! around a fault: the mapping is advised random), so the table's residency stays within the
//! cap plus one step's pages. Trimming never changes a byte a reader sees.

use crate::error::{Error, Result};

/// Residency is tracked and dropped in chunks of 2 MiB (a large folio's usual size).
pub const CHUNK_BYTES: usize = 2 << 20;
/// A trim drops chunks until this fraction of the cap is marked.
pub const TRIM_TO: f64 = 0.9;
/// Steps without a trim after one that could not free enough.
pub const RETRY_STEPS: u64 = 64;

/// The cap and its chunks' last-use stamps (owned by the worker, behind the handle's mutex).
#[derive(Debug)]
pub struct ResidencyCap {
    page: usize,
    cap_pages: usize,
    stamps: Vec<u64>,
    /// One bit per OS page of each chunk (`PAGE_WORDS` words per chunk).
    pages: Vec<u64>,
    words: usize,
    live: usize,
    tick: u64,
    dropped_bytes: u64,
    /// The step number before which no trim runs (after one that could not free enough).
    retry_at: u64,
    /// Reusable: (stamp, chunk) of the marked chunks during a trim.
    order: Vec<(u64, u32)>,
}

impl ResidencyCap {
    /// A cap of `cap_bytes` (at least one chunk) over the mapping `map`; its resident chunks
    /// are marked oldest.
    pub fn new(map: &[u8], cap_bytes: u64) -> ResidencyCap {
        let n = map.len().div_ceil(CHUNK_BYTES);
        let page = crate::sys::os_page_size();
        let per_chunk = CHUNK_BYTES / page;
        let words = per_chunk.div_ceil(64);
        let mut stamps = vec![0u64; n];
        let mut pages = vec![0u64; n * words];
        let mut live = 0;
        crate::sys::scan_resident(map, |p| {
            stamps[p / per_chunk] = 1;
            pages[p / per_chunk * words + (p % per_chunk) / 64] |= 1 << (p % 64);
            live += 1;
        });
        ResidencyCap {
            page,
            cap_pages: ((cap_bytes as usize) / page).max(1),
            stamps,
            pages,
            words,
            live,
            tick: 1,
            dropped_bytes: 0,
            retry_at: 0,
            order: Vec::new(),
        }
    }

    /// Marks the pages of rows `ids` (of `row_bytes`; a row may straddle two) and their chunks
    /// used now.
    pub fn touch(&mut self, ids: &[u64], row_bytes: usize) {
        self.tick += 1;
        let per_chunk = CHUNK_BYTES / self.page;
        let n_pages = self.stamps.len() * per_chunk;
        for &r in ids {
            let first = r as usize * row_bytes / self.page;
            let last = (r as usize * row_bytes + row_bytes - 1) / self.page;
            for p in first..=last.min(n_pages - 1) {
                let (c, i) = (p / per_chunk, p % per_chunk);
                let w = &mut self.pages[c * self.words + i / 64];
                if *w & (1 << (i % 64)) == 0 {
                    *w |= 1 << (i % 64);
                    self.live += 1;
                }
                self.stamps[c] = self.tick;
            }
        }
    }

    /// Whether more pages are marked than the cap holds.
    pub fn over(&self) -> bool {
        self.live > self.cap_pages
    }

    /// Drops the least recently used chunks until [`TRIM_TO`] of the cap is marked; returns the
    /// bytes of the marked pages freed. `map` is the mapping the cap was made for, `fd` its file. A chunk whose pages
    /// stay cached after the drop (dirty pages not yet written back: a table written moments
    /// ago) stays marked as the oldest, and the next [`RETRY_STEPS`] steps do not trim, so a
    /// table that cannot be freed yet costs one pass per that many steps, not one per step.
    pub fn trim(&mut self, map: &[u8], fd: std::os::fd::RawFd) -> Result<u64> {
        if !self.over() || self.tick < self.retry_at {
            return Ok(0);
        }
        let keep = ((self.cap_pages as f64 * TRIM_TO) as usize).max(1);
        self.order.clear();
        self.order.extend(
            self.stamps
                .iter()
                .enumerate()
                .filter(|(_, s)| **s != 0)
                .map(|(c, &s)| (s, c as u32)),
        );
        self.order.sort_unstable();
        let mut freed = 0u64;
        for &(_, c) in &self.order {
            if self.live <= keep {
                break;
            }
            let off = c as usize * CHUNK_BYTES;
            let len = CHUNK_BYTES.min(map.len() - off);
            crate::sys::drop_cached(map, fd, off, len)
                .map_err(|e| Error::io("dropping resident pages of the row file", e))?;
            if crate::sys::any_resident(&map[off..off + len]) {
                self.stamps[c as usize] = 1;
            } else {
                let c = c as usize;
                let bits = &mut self.pages[c * self.words..(c + 1) * self.words];
                let marked: usize = bits.iter().map(|w| w.count_ones() as usize).sum();
                bits.fill(0);
                self.stamps[c] = 0;
                self.live -= marked;
                freed += (marked * self.page) as u64;
            }
        }
        if self.live > keep {
            self.retry_at = self.tick + RETRY_STEPS;
        }
        self.dropped_bytes += freed;
        Ok(freed)
    }

    /// Bytes of the marked pages (the cap's bound on the table's residency).
    pub fn marked_bytes(&self) -> u64 {
        (self.live * self.page) as u64
    }

    /// Bytes dropped since open.
    pub fn dropped_bytes(&self) -> u64 {
        self.dropped_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// A file of `chunks` chunks, each filled with its index byte, written and synced.
    fn file(chunks: usize) -> (tempfile::NamedTempFile, memmap2::Mmap) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for c in 0..chunks {
            f.write_all(&vec![c as u8; CHUNK_BYTES]).unwrap();
        }
        f.as_file().sync_all().unwrap();
        // SAFETY: the test owns the file and does not change it while mapped.
        let m = unsafe { memmap2::Mmap::map(f.as_file()) }.unwrap();
        // as the table's mapping: no readahead around a fault
        m.advise(memmap2::Advice::Random).unwrap();
        (f, m)
    }

    fn resident_chunks(m: &[u8]) -> Vec<usize> {
        let per = CHUNK_BYTES / crate::sys::os_page_size();
        let mut v = Vec::new();
        crate::sys::scan_resident(m, |p| v.push(p / per));
        v.dedup();
        v
    }

    #[test]
    fn trims_the_least_recently_used_chunks_and_frees_their_pages() {
        let (f, m) = file(8);
        let fd = f.as_file().as_raw_fd();
        let page = crate::sys::os_page_size();
        // start from nothing cached
        crate::sys::drop_cached(&m, fd, 0, m.len()).unwrap();
        let mut cap = ResidencyCap::new(&m, 4 * page as u64);
        assert_eq!(cap.marked_bytes(), 0, "{:?}", resident_chunks(&m));
        let rb = 1000usize;
        // a row inside the first page of chunk c
        let row_in = |c: usize| (c * CHUNK_BYTES / rb + 1) as u64;
        // read one page of each of chunks 0..6 in order, through the mapping
        for c in 0..6 {
            let r = row_in(c) as usize;
            assert!(m[r * rb..(r + 1) * rb].iter().all(|&b| b == c as u8));
            cap.touch(&[r as u64], rb);
        }
        assert_eq!(cap.marked_bytes(), 6 * page as u64);
        assert!(cap.over());
        let dropped = cap.trim(&m, fd).unwrap();
        // 6 pages marked, a cap of 4, trimmed to 90% of it: 3 kept, the 3 oldest chunks dropped
        assert_eq!(dropped, 3 * page as u64);
        assert_eq!(cap.marked_bytes(), 3 * page as u64);
        let res = resident_chunks(&m);
        assert!(
            !res.is_empty() && res.iter().all(|&c| (3..6).contains(&c)),
            "resident chunks {res:?}"
        );
        // the dropped rows read back unchanged
        let r = row_in(0) as usize;
        assert!(m[r * rb..(r + 1) * rb].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_table_resident_at_open_is_marked_and_trimmed_first() {
        let (f, m) = file(6);
        let fd = f.as_file().as_raw_fd();
        // every page resident (read through the mapping)
        let sum: u64 = m.iter().step_by(4096).map(|&b| b as u64).sum();
        assert!(sum > 0);
        let mut cap = ResidencyCap::new(&m, 2 * CHUNK_BYTES as u64);
        assert_eq!(cap.marked_bytes(), 6 * CHUNK_BYTES as u64);
        cap.touch(&[(5 * CHUNK_BYTES / 100) as u64], 100);
        cap.trim(&m, fd).unwrap();
        // 90% of 2 chunks keeps 1: the one just used
        assert_eq!(resident_chunks(&m), vec![5]);
    }
}
