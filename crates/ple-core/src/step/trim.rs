//! The residency cap off the step's path: a handle with `resident_bytes_max` (MMAP) runs its
//! trims on a `ple-trim` thread of its own. The reading threads (the worker, the read-ahead
//! reader) only mark a step's pages ([`Trim::mark`], microseconds) and wake the thread when
//! the marked pages pass the cap; the thread picks the victims under the lock (a partial
//! selection, `ResidencyCap::pick`), drops them with the lock released, and commits the outcome
//! under it every [`COMMIT_EVERY`] chunks, so the count falls while the pass runs.
//!
//! Invariants:
//! - Residency stays within the cap plus `residency::MARGIN` of it: a reading thread that finds
//!   the marked pages past that waits (at most [`WAIT_MAX`]) until trims bring them back under
//!   it or back off (nothing could be freed, or a drop failed), the thread ends, or the handle
//!   closes. Without the thread (it could not be started, it ended by a panic, or a
//!   [`Reader`](super::Reader) used on its own) the marking thread trims itself, as soon as the
//!   cap is passed.
//! - The thread does no storage reads: `madvise`, `posix_fadvise` and `mincore` on the mapping
//!   only, none of which waits for a read in flight. It checks the stop flag between chunks (a
//!   chunk's drop takes well under a millisecond, docs/RELIABILITY.md), so a close joins it
//!   within its bound (`reaper::CLOSE_WAIT`); were it late, the close hands it to the reaper
//!   with the worker, as any thread still running.
//! - Counts: `Stats::resident_dropped_bytes` gets each committed part's freed bytes, the same
//!   bytes the cap adds to its own total (`ResidencyCap::dropped_bytes`).
//! - Dropping a chunk while a reader copies rows from it is sound: on a shared read-only file
//!   mapping the drop only removes page-table entries and clean page-cache pages, and a reader
//!   touching the range faults the same file bytes back in (`sys::drop_cached`); the count
//!   stays right because a read is marked after it is made (see `io::mmap::residency`).

use crate::format::table::Table;
use crate::io::mmap::residency::{self, ResidencyCap};
use crate::stats::Stats;
use crate::sync::{lock, wait, wait_timeout};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest a reading thread waits for the trim thread past the margin (a bound on the
/// wait, not an expected time: a pass takes milliseconds).
pub(super) const WAIT_MAX: Duration = Duration::from_secs(1);

/// Victims dropped between two commits of a pass (a commit holds the lock for microseconds).
const COMMIT_EVERY: usize = 32;

struct Inner {
    cap: ResidencyCap,
    /// A reading thread found a trim due since the thread last looked.
    wanted: bool,
    /// The thread is in a pass (between its pick and its commit).
    busy: bool,
}

/// A handle's residency cap and the state its trim thread and its reading threads share.
pub(super) struct Trim {
    inner: Mutex<Inner>,
    /// Wakes the trim thread.
    wake: Condvar,
    /// Wakes reading threads waiting past the margin, after each pass (and at stop).
    settled: Condvar,
    /// Set once the thread runs; until then (and if it never does) readers trim themselves.
    started: AtomicBool,
    stop: AtomicBool,
    /// Trims run by a reading thread (no trim thread).
    reader_trims: AtomicU64,
    /// Passes of the trim thread that had victims (also one a failure or a stop ended early).
    thread_passes: AtomicU64,
    /// Times a reading thread waited past the margin.
    waits: AtomicU64,
}

/// What the trim of a handle has done (tests, logs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TrimCounts {
    pub(crate) reader_trims: u64,
    pub(crate) thread_passes: u64,
    pub(crate) waits: u64,
    /// The cap's own total of the bytes its commits freed.
    pub(crate) dropped_bytes: u64,
}

impl Trim {
    pub(super) fn new(cap: ResidencyCap) -> Trim {
        Trim {
            inner: Mutex::new(Inner {
                cap,
                wanted: false,
                busy: false,
            }),
            wake: Condvar::new(),
            settled: Condvar::new(),
            started: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            reader_trims: AtomicU64::new(0),
            thread_passes: AtomicU64::new(0),
            waits: AtomicU64::new(0),
        }
    }

    pub(super) fn counts(&self) -> TrimCounts {
        TrimCounts {
            reader_trims: self.reader_trims.load(Ordering::Relaxed),
            thread_passes: self.thread_passes.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            dropped_bytes: lock(&self.inner).cap.dropped_bytes(),
        }
    }

    /// Reading threads: marks the pages of rows `ids` (of `row_bytes`) used; over the cap, wakes
    /// the trim thread, and past the margin waits for it (see the module doc). Without a
    /// running trim thread, trims here. `map`/`fd`: the table's mapping and file.
    pub(super) fn mark(&self, ids: &[u64], row_bytes: usize, map: &[u8], fd: RawFd, stats: &Stats) {
        let mut g = lock(&self.inner);
        g.cap.touch(ids, row_bytes);
        // a closing handle trims no more (its mapping goes soon)
        if !g.cap.due() || self.stop.load(Ordering::Acquire) {
            return;
        }
        if !self.started.load(Ordering::Acquire) {
            self.reader_trims.fetch_add(1, Ordering::Relaxed);
            let t0 = Instant::now();
            let (n, res) = g.cap.trim(map, fd);
            stats.add_resident_dropped(n);
            if let Err(e) = res {
                log::warn!("{e}");
            }
            log::debug!(
                "residency cap: {n} bytes freed in {:?} on the reading thread, {} marked",
                t0.elapsed(),
                g.cap.marked_bytes()
            );
            return;
        }
        if !g.wanted {
            g.wanted = true;
            self.wake.notify_one();
        }
        if !g.cap.over_margin() {
            return;
        }
        self.waits.fetch_add(1, Ordering::Relaxed);
        let t0 = Instant::now();
        while g.cap.over_margin()
            && g.cap.due()
            && !self.stop.load(Ordering::Acquire)
            && self.started.load(Ordering::Acquire)
        {
            // a pass that ended without bringing the count under the margin (its victims were
            // read again meanwhile) is followed by another
            if !g.wanted && !g.busy {
                g.wanted = true;
                self.wake.notify_one();
            }
            let Some(left) = WAIT_MAX.checked_sub(t0.elapsed()) else {
                log::warn!("residency cap: the trim thread lags past {WAIT_MAX:?}");
                break;
            };
            g = wait_timeout(&self.settled, g, left).0;
        }
    }

    /// Whether a trim thread runs (set before it is spawned, cleared if the spawn failed):
    /// while it does, reading threads leave trims to it.
    pub(super) fn set_started(&self, yes: bool) {
        self.started.store(yes, Ordering::Release);
    }

    /// Asks the trim thread to stop (it returns after the chunk it is dropping) and releases
    /// reading threads waiting for it; no trim runs after it (the handle is closing).
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        // under the lock, so a thread between its check and its wait cannot miss it
        let _g = lock(&self.inner);
        self.wake.notify_all();
        self.settled.notify_all();
    }

    /// The trim thread's loop, until [`Trim::stop`]: one pass per wake-up while a trim is due.
    pub(super) fn run(&self, map: &[u8], fd: RawFd, stats: &Stats) {
        // declared before the guard below: dropped after it, also when a panic unwinds
        let _exit = Exited(self);
        let mut g = lock(&self.inner);
        loop {
            while !g.wanted && !self.stop.load(Ordering::Acquire) {
                g = wait(&self.wake, g);
            }
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            g.wanted = false;
            let t0 = Instant::now();
            let victims = g.cap.pick();
            if victims.is_empty() {
                self.settled.notify_all();
                continue;
            }
            let picked = t0.elapsed();
            g.busy = true;
            drop(g);
            // the lock released: readers keep marking (and reading) while the chunks go; each
            // part is committed at once, so the count (and a reader's wait) falls as they go
            let mut pass = residency::Committed::default();
            let mut done = 0;
            let mut resident = Vec::with_capacity(COMMIT_EVERY);
            let mut failed = false;
            let mut stopped = false;
            while done < victims.len() && !failed && !stopped {
                let part = &victims[done..(done + COMMIT_EVERY).min(victims.len())];
                resident.clear();
                for v in part {
                    // between chunks, not parts: a close joins this thread within its bound
                    if self.stop.load(Ordering::Acquire) {
                        stopped = true;
                        break;
                    }
                    match residency::drop_chunk(map, fd, v.chunk) {
                        Ok(r) => resident.push(r),
                        Err(e) => {
                            log::warn!("{e}");
                            failed = true;
                            break;
                        }
                    }
                }
                // only the victims dropped are committed (zip stops at the shorter)
                let mut g = lock(&self.inner);
                let c = g.cap.commit_part(part, &resident);
                stats.add_resident_dropped(c.freed);
                pass.add(c);
                done += resident.len();
                self.settled.notify_all();
            }
            pass.failed = failed;
            g = lock(&self.inner);
            g.cap.end_pass(pass);
            let n = pass.freed;
            g.busy = false;
            self.thread_passes.fetch_add(1, Ordering::Relaxed);
            log::debug!(
                "residency cap: {n} bytes freed in {:?} ({done} of {} chunks; picked in \
                 {picked:?}) on the trim thread, {} marked",
                t0.elapsed(),
                victims.len(),
                g.cap.marked_bytes()
            );
            // marks made during the pass may call for another (not after a pass that freed
            // nothing: the next mark wakes the thread)
            if n > 0 {
                g.wanted |= g.cap.due();
            }
            self.settled.notify_all();
        }
        drop(g);
        log::debug!("residency cap: the trim thread stops ({:?})", self.counts());
    }
}

/// Ends the trim thread's loop, by a stop or a panic: reading threads trim for themselves from
/// then on (none do after a stop) and one waiting past the margin is released, so a thread
/// that is gone never holds a step for [`WAIT_MAX`].
struct Exited<'a>(&'a Trim);

impl Drop for Exited<'_> {
    fn drop(&mut self) {
        self.0.started.store(false, Ordering::Release);
        // under the lock, so a reader between its check and its wait cannot miss it
        let _g = lock(&self.0.inner);
        self.0.settled.notify_all();
    }
}

/// MMAP with a residency cap (`cap`): marks the pages of rows `ids` of `table` used and, over
/// the cap, has the least recently used chunks dropped — by the trim thread once it runs (past
/// the cap's margin this waits for it), else here. A failed drop is logged: the rows are
/// unaffected.
pub(super) fn keep_within(cap: Option<&Trim>, table: &Table, ids: &[u64], stats: &Stats) {
    if let Some(t) = cap {
        use std::os::fd::AsRawFd;
        let fd = table.file().as_raw_fd();
        t.mark(ids, table.row_bytes(), table.bytes(), fd, stats);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::mmap::residency::CHUNK_BYTES;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::sync::Arc;

    const RB: usize = 1000;

    /// A mapped file of `chunks` chunks, written back, advised random (as the table's mapping).
    fn mapped(chunks: usize) -> (tempfile::NamedTempFile, memmap2::Mmap) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; chunks * CHUNK_BYTES]).unwrap();
        f.as_file().sync_all().unwrap();
        // SAFETY: the test owns the file and does not change it while mapped.
        let m = unsafe { memmap2::Mmap::map(f.as_file()) }.unwrap();
        m.advise(memmap2::Advice::Random).unwrap();
        crate::sys::drop_cached(&m, f.as_file().as_raw_fd(), 0, m.len()).unwrap();
        (f, m)
    }

    /// Rows on the first page of each of chunks `0..n` (one marked page per chunk).
    fn rows_in_chunks(n: usize) -> Vec<u64> {
        (0..n).map(|c| (c * CHUNK_BYTES / RB + 1) as u64).collect()
    }

    /// A cap of 4 pages over `m`, with nothing marked.
    fn trim_over(m: &memmap2::Mmap) -> Trim {
        let cap = ResidencyCap::new(m, 4 * crate::sys::os_page_size() as u64);
        assert_eq!(cap.marked_bytes(), 0, "the file stayed cached");
        Trim::new(cap)
    }

    /// A trim thread whose drops fail (a descriptor `POSIX_FADV_DONTNEED` refuses) releases
    /// the reader waiting past the margin after its first pass, and backs off: the reader is
    /// not held until `WAIT_MAX`, nor the next steps. Then a stop ends the thread at once.
    #[test]
    fn a_failing_drop_releases_the_waiting_reader_and_backs_off() {
        let (_f, m) = mapped(8);
        let m = Arc::new(m);
        let t = Arc::new(trim_over(&m));
        let stats = Arc::new(Stats::default());
        t.set_started(true);
        let thread = {
            let (t, m, stats) = (t.clone(), m.clone(), stats.clone());
            std::thread::spawn(move || t.run(&m, -1, &stats))
        };
        // 6 pages marked, the cap holds 4 (and no margin): this waits for a pass
        let t0 = Instant::now();
        t.mark(&rows_in_chunks(6), RB, &m, -1, &stats);
        let first = t0.elapsed();
        for _ in 0..10 {
            t.mark(&rows_in_chunks(6), RB, &m, -1, &stats);
        }
        let all = t0.elapsed();
        let c = t.counts();
        assert!(first < WAIT_MAX / 4, "the reader waited {first:?}");
        assert!(all < WAIT_MAX / 2, "11 marks took {all:?}");
        // one wait, for the one pass: the pass that failed put the next trims off
        assert_eq!(
            (c.waits, c.thread_passes, c.reader_trims),
            (1, 1, 0),
            "{c:?}"
        );
        assert_eq!(stats.snapshot().resident_dropped_bytes, 0);
        let t1 = Instant::now();
        t.stop();
        thread.join().unwrap();
        assert!(t1.elapsed() < crate::step::reaper::CLOSE_WAIT);
    }

    /// A reader waiting past the margin for a trim thread that does not come (it lags) is
    /// released by the stop, well before `WAIT_MAX`, and a closing handle trims no more.
    #[test]
    fn a_stop_releases_a_reader_waiting_past_the_margin() {
        let (_f, m) = mapped(8);
        let m = Arc::new(m);
        let t = Arc::new(trim_over(&m));
        t.set_started(true);
        let reader = {
            let (t, m) = (t.clone(), m.clone());
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let stats = Stats::default();
                t.mark(&rows_in_chunks(6), RB, &m, -1, &stats);
                t0.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        t.stop();
        let waited = reader.join().unwrap();
        assert!(
            waited >= Duration::from_millis(40) && waited < WAIT_MAX / 2,
            "{waited:?}"
        );
        assert_eq!(t.counts().waits, 1);
        // after the stop a mark past the margin neither waits nor trims
        let t0 = Instant::now();
        t.mark(&rows_in_chunks(8), RB, &m, -1, &Stats::default());
        assert!(t0.elapsed() < Duration::from_millis(50));
        assert_eq!(t.counts().reader_trims, 0);
    }

    /// A trim thread that ends without a stop (a panic unwinds `run`) releases a waiting reader,
    /// and from then on the reading threads trim for themselves.
    #[test]
    fn a_trim_thread_that_dies_leaves_the_trims_to_the_readers() {
        let (f, m) = mapped(8);
        let fd = f.as_file().as_raw_fd();
        let m = Arc::new(m);
        let t = Arc::new(trim_over(&m));
        let stats = Stats::default();
        t.set_started(true);
        let dies = {
            let t = t.clone();
            std::thread::spawn(move || {
                let _exit = Exited(&t);
                std::thread::sleep(Duration::from_millis(50));
                panic!("the trim thread dies");
            })
        };
        let t0 = Instant::now();
        t.mark(&rows_in_chunks(6), RB, &m, fd, &stats);
        let waited = t0.elapsed();
        assert!(dies.join().is_err());
        assert!(waited < WAIT_MAX / 2, "{waited:?}");
        // the next mark over the cap trims here: 6 marked, 90% of 4 kept (3)
        t.mark(&rows_in_chunks(1), RB, &m, fd, &stats);
        assert_eq!(t.counts().reader_trims, 1);
        let page = crate::sys::os_page_size() as u64;
        assert_eq!(stats.snapshot().resident_dropped_bytes, 3 * page);
    }
}
