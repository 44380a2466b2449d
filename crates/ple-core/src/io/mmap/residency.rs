//! MMAP mode's cap on the table's page-cache residency (`OpenOptions::resident_bytes_max`).
//!
//! The row file is split into chunks of [`CHUNK_BYTES`]. Each chunk carries the step number of
//! its last use (0: not resident as far as the cap knows) and a bitmap of its OS pages that rows
//! were read from. At open a `mincore` scan marks every resident page, its chunk used at step 1
//! (the oldest), so a table already in the page cache (freshly written, or read by an earlier
//! process) is trimmed too. After each step the worker marks the pages its rows lie in
//! ([`ResidencyCap::touch`]); when more pages are marked than the cap holds, a trim drops the
//! least recently used chunks whole ([`drop_chunk`]: `MADV_DONTNEED` then
//! `POSIX_FADV_DONTNEED`, the pair that frees a mapped file's clean pages; docs/RELIABILITY.md)
//! down to [`TRIM_TO`] of the cap, so trimming runs once per many steps, not every step. A trim
//! is three parts so that its system calls can run without the cap's lock, on a thread of
//! their own (`step::trim`): [`ResidencyCap::pick`] the victims, drop them, and
//! [`ResidencyCap::commit`] the outcome; [`ResidencyCap::trim`] runs the three in a row.
//!
//! Invariants: `live` is the number of marked pages, each chunk with a marked page has a nonzero
//! stamp, and stamps only grow while a chunk stays marked; the marked pages include every page
//! this handle's reads brought in that is still cached (the kernel reads no more around a
//! fault: the mapping is advised random): a page read after its chunk was picked is marked
//! after the read, which either changes the chunk's stamp before the commit (the commit then
//! keeps the chunk marked) or sets its bit after it. So the table's residency stays within the
//! marked count, which stays within the cap plus what a trim lags. Trimming never changes a
//! byte a reader sees.

use crate::error::{Error, Result};

/// Residency is tracked and dropped in chunks of 2 MiB (a large folio's usual size).
pub const CHUNK_BYTES: usize = 2 << 20;
/// A trim drops chunks until this fraction of the cap is marked.
pub const TRIM_TO: f64 = 0.9;
/// Steps without a trim after one that could free nothing.
pub const RETRY_STEPS: u64 = 64;
/// How far past the cap (a fraction of it) the marked pages may run while a trim on another
/// thread catches up; past it the marking thread waits for the trim (`step::trim`).
pub const MARGIN: f64 = 0.05;

/// What committing victims did: the bytes of marked pages freed, whether a victim stayed
/// cached though not read again, and (set by the caller) whether a drop failed, which ended the
/// pass early.
#[derive(Debug, Clone, Copy, Default)]
pub struct Committed {
    pub freed: u64,
    pub stuck: bool,
    pub failed: bool,
}

impl Committed {
    pub fn add(&mut self, o: Committed) {
        self.freed += o.freed;
        self.stuck |= o.stuck;
        self.failed |= o.failed;
    }
}

/// A chunk chosen by [`ResidencyCap::pick`], with its last-use stamp at the choice.
#[derive(Debug, Clone, Copy)]
pub struct Victim {
    pub chunk: u32,
    pub stamp: u64,
}

/// Drops chunk `c` of `map` (file `fd`) from the page cache (`sys::drop_cached`: the
/// `MADV_DONTNEED` + `POSIX_FADV_DONTNEED` pair; one `MADV_PAGEOUT` was measured slower on
/// full chunks and left pages cached, docs/RELIABILITY.md); returns whether a page of it is
/// still cached (`mincore`). Needs no lock: the syscalls change no byte a reader sees (a page
/// dropped while a reader copies from it is read from the file again).
pub fn drop_chunk(map: &[u8], fd: std::os::fd::RawFd, c: u32) -> Result<bool> {
    let (off, len) = ResidencyCap::chunk_range(c, map.len());
    crate::sys::drop_cached(map, fd, off, len)
        .map_err(|e| Error::io("dropping resident pages of the row file", e))?;
    Ok(crate::sys::any_resident(&map[off..off + len]))
}

/// The cap and its chunks' last-use stamps (behind the lock of the handle's `step::trim::Trim`).
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

    /// Whether a trim is due: more pages marked than the cap holds, and not backing off after
    /// a pass that could free nothing (dirty pages not yet written back).
    pub fn due(&self) -> bool {
        self.over() && self.tick >= self.retry_at
    }

    /// Whether the marked pages pass the cap by more than [`MARGIN`] of it (the most a trim on
    /// another thread may lag behind the reads).
    pub fn over_margin(&self) -> bool {
        self.live > self.cap_pages + (self.cap_pages as f64 * MARGIN) as usize
    }

    /// The marked pages to keep after a trim: [`TRIM_TO`] of the cap.
    fn keep(&self) -> usize {
        ((self.cap_pages as f64 * TRIM_TO) as usize).max(1)
    }

    fn marked_in(&self, c: usize) -> usize {
        self.pages[c * self.words..(c + 1) * self.words]
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum()
    }

    /// The victims of a trim: the least recently used marked chunks whose marked pages bring
    /// the count down to [`TRIM_TO`] of the cap, oldest first, each with its stamp now (empty
    /// when no trim is due). A partial selection (`select_nth_unstable` on the stamps, then a
    /// sort of the few selected), not a sort of every chunk: the number of victims needed is
    /// estimated from the mean marked pages per chunk with a quarter's slack, and only when
    /// that many fall short is the whole order sorted.
    pub fn pick(&mut self) -> Vec<Victim> {
        let keep = self.keep();
        if !self.due() || self.live <= keep {
            return Vec::new();
        }
        let excess = self.live - keep;
        self.order.clear();
        self.order.extend(
            self.stamps
                .iter()
                .enumerate()
                .filter(|(_, s)| **s != 0)
                .map(|(c, &s)| (s, c as u32)),
        );
        let n = self.order.len();
        let mean = (self.live / n.max(1)).max(1);
        let mut k = (excess.div_ceil(mean) + excess.div_ceil(mean) / 4 + 1).min(n);
        loop {
            if k < n {
                self.order.select_nth_unstable(k);
            }
            self.order[..k].sort_unstable();
            let mut sum = 0;
            let mut victims = Vec::new();
            for &(stamp, c) in &self.order[..k] {
                if sum >= excess {
                    break;
                }
                sum += self.marked_in(c as usize);
                victims.push(Victim { chunk: c, stamp });
            }
            if sum >= excess || k == n {
                return victims;
            }
            k = n;
        }
    }

    /// Byte range `(off, len)` in the mapping of `map_len` bytes of chunk `c`.
    pub fn chunk_range(c: u32, map_len: usize) -> (usize, usize) {
        let off = c as usize * CHUNK_BYTES;
        (off, CHUNK_BYTES.min(map_len - off))
    }

    /// Records the outcome of dropping `victims[i]` (`still_resident[i]`: `mincore` found a
    /// page of it cached after the drop) and ends the pass ([`ResidencyCap::end_pass`]);
    /// returns the bytes of the marked pages freed.
    pub fn commit(&mut self, victims: &[Victim], still_resident: &[bool]) -> u64 {
        let part = self.commit_part(victims, still_resident);
        self.end_pass(part);
        part.freed
    }

    /// [`ResidencyCap::commit`] of some of a pass's victims (a pass may commit in parts, so the
    /// count falls while it runs), without ending the pass.
    ///
    /// A victim whose stamp changed since [`ResidencyCap::pick`] was read again meanwhile (its
    /// pages may have been faulted back after the drop): it stays marked, the count errs high.
    /// One still resident with its stamp unchanged (dirty pages, or a read not yet marked)
    /// stays marked as the oldest.
    pub fn commit_part(&mut self, victims: &[Victim], still_resident: &[bool]) -> Committed {
        let mut part = Committed::default();
        for (v, &res) in victims.iter().zip(still_resident) {
            let c = v.chunk as usize;
            if self.stamps[c] != v.stamp {
                continue;
            }
            if res {
                self.stamps[c] = 1;
                part.stuck = true;
                continue;
            }
            let marked = self.marked_in(c);
            self.pages[c * self.words..(c + 1) * self.words].fill(0);
            self.stamps[c] = 0;
            self.live -= marked;
            part.freed += (marked * self.page) as u64;
        }
        self.dropped_bytes += part.freed;
        part
    }

    /// Ends a pass whose parts committed `pass` in all: one that freed nothing though a victim
    /// stayed cached, or whose drop failed, makes the next [`RETRY_STEPS`] steps not trim (so
    /// a drop that keeps failing costs one pass per that many steps, and a reading thread
    /// waiting past the margin is released: no trim is due).
    pub fn end_pass(&mut self, pass: Committed) {
        if pass.freed == 0 && (pass.stuck || pass.failed) {
            self.retry_at = self.tick + RETRY_STEPS;
        }
    }

    /// Drops the least recently used chunks until [`TRIM_TO`] of the cap is marked
    /// ([`ResidencyCap::pick`], `sys::drop_cached` and a `mincore` check of each victim,
    /// [`ResidencyCap::commit`]), all on the calling thread; returns the bytes of the marked
    /// pages freed. `map` is the mapping the cap was made for, `fd` its file. A chunk whose
    /// pages stay cached after the drop (dirty pages not yet written back: a table written
    /// moments ago) stays marked as the oldest, and a pass that frees nothing makes the next
    /// [`RETRY_STEPS`] steps not trim, so a table that cannot be freed yet costs one pass per
    /// that many steps, not one per step. A failed drop ends the pass: the victims dropped
    /// before it are committed (their bytes are in the count returned) and the error is
    /// returned beside it.
    pub fn trim(&mut self, map: &[u8], fd: std::os::fd::RawFd) -> (u64, Result<()>) {
        let victims = self.pick();
        let mut resident = Vec::with_capacity(victims.len());
        let mut res = Ok(());
        for v in &victims {
            match drop_chunk(map, fd, v.chunk) {
                Ok(r) => resident.push(r),
                Err(e) => {
                    res = Err(e);
                    break;
                }
            }
        }
        let mut pass = self.commit_part(&victims, &resident);
        pass.failed = res.is_err();
        self.end_pass(pass);
        (pass.freed, res)
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
        let (dropped, res) = cap.trim(&m, fd);
        res.unwrap();
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
        cap.trim(&m, fd).1.unwrap();
        // 90% of 2 chunks keeps 1: the one just used
        assert_eq!(resident_chunks(&m), vec![5]);
    }

    #[test]
    fn a_victim_read_again_during_its_drop_stays_marked() {
        let (f, m) = file(8);
        let fd = f.as_file().as_raw_fd();
        let page = crate::sys::os_page_size();
        crate::sys::drop_cached(&m, fd, 0, m.len()).unwrap();
        let mut cap = ResidencyCap::new(&m, 4 * page as u64);
        let rb = 1000usize;
        let row_in = |c: usize| (c * CHUNK_BYTES / rb + 1) as u64;
        for c in 0..6 {
            let r = row_in(c) as usize;
            assert!(m[r * rb..(r + 1) * rb].iter().all(|&b| b == c as u8));
            cap.touch(&[r as u64], rb);
        }
        // 6 marked, keep 3: the 3 oldest are picked, oldest first
        let victims = cap.pick();
        let picked: Vec<u32> = victims.iter().map(|v| v.chunk).collect();
        assert_eq!(picked, vec![0, 1, 2]);
        let resident: Vec<bool> = victims
            .iter()
            .map(|v| drop_chunk(&m, fd, v.chunk).unwrap())
            .collect();
        assert_eq!(resident, vec![false; 3]);
        // chunk 0 is read again (its page faults back in) and marked before the commit
        let r = row_in(0) as usize;
        assert!(m[r * rb..(r + 1) * rb].iter().all(|&b| b == 0));
        cap.touch(&[r as u64], rb);
        let freed = cap.commit(&victims, &resident);
        assert_eq!(freed, 2 * page as u64);
        // chunk 0 stays marked (it is resident again): 0, 3, 4, 5
        assert_eq!(cap.marked_bytes(), 4 * page as u64);
        assert_eq!(resident_chunks(&m), vec![0, 3, 4, 5]);
    }

    /// A drop that fails (a descriptor `POSIX_FADV_DONTNEED` refuses) ends the pass with the
    /// error, frees nothing it did not drop, and puts the next trim off [`RETRY_STEPS`] steps.
    #[test]
    fn a_failed_drop_is_returned_and_puts_the_next_trim_off() {
        let (f, m) = file(8);
        let page = crate::sys::os_page_size();
        crate::sys::drop_cached(&m, f.as_file().as_raw_fd(), 0, m.len()).unwrap();
        let mut cap = ResidencyCap::new(&m, 4 * page as u64);
        let rb = 1000usize;
        let rows: Vec<u64> = (0..6).map(|c| (c * CHUNK_BYTES / rb + 1) as u64).collect();
        cap.touch(&rows, rb);
        assert!(cap.due());
        let (freed, res) = cap.trim(&m, -1);
        assert!(res.is_err());
        assert_eq!(freed, 0);
        assert_eq!(cap.marked_bytes(), 6 * page as u64);
        for _ in 0..RETRY_STEPS {
            assert!(!cap.due());
            cap.touch(&[], rb);
        }
        assert!(cap.due());
    }

    #[test]
    fn the_partial_selection_picks_the_oldest_as_a_full_sort_would() {
        let (_f, m) = file(32);
        let page = crate::sys::os_page_size();
        let per_chunk = CHUNK_BYTES / page;
        let mut cap = ResidencyCap::new(&m, (8 * page) as u64);
        // nothing marked (the file is cached after writing it)
        cap.pages.fill(0);
        cap.stamps.fill(0);
        cap.live = 0;
        // chunk c gets (c % 5) + 1 marked pages, touched in a shuffled order
        let mut order: Vec<usize> = (0..32).collect();
        let mut x = 12345u64;
        for i in (1..order.len()).rev() {
            x = crate::model::splitmix64(x);
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        for &c in &order {
            let ids: Vec<u64> = (0..(c % 5) + 1)
                .map(|k| ((c * per_chunk + k) * page) as u64)
                .collect();
            cap.touch(&ids, 1);
        }
        let keep = cap.keep();
        let live = cap.live;
        let victims = cap.pick();
        // the expectation: touch order is stamp order; take chunks in it until enough pages
        let mut want = Vec::new();
        let mut sum = 0;
        for &c in &order {
            if sum >= live - keep {
                break;
            }
            sum += (c % 5) + 1;
            want.push(c as u32);
        }
        let got: Vec<u32> = victims.iter().map(|v| v.chunk).collect();
        assert_eq!(got, want);
    }
}
