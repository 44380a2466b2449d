//! Read-ahead (`ple_prefetch_ahead`): the rows of tokens known before their step (a prompt's
//! later chunks at admission, drafts before verification) read in the background into the row
//! cache (DIRECT, or MMAP with a cache) or the page cache (MMAP without one).
//!
//! Threading: the caller hashes the batch (reading tracked history, changing none, claiming no
//! ring slot) and appends its row ids to a bounded queue; a dedicated reader thread per handle
//! (`ple-ahead`, started on the first call, niced to 10) takes them a batch at a time, the batch
//! sized by [`sizer`] to take at most [`AHEAD_BATCH_TARGET`] at the device's speed it measures
//! (4 to 64 rows), and back to 4 rows after a batch that a step was submitted during. Right
//! before each batch's reads it waits while a submitted step is not yet done (`submitted >
//! done`), so a step waits for at most the one short batch of reads in flight when it was
//! submitted. The reader has its own descriptors (its own io_uring), never the worker's.
//! While it reads it holds no lock; once a step submitted meanwhile is done, it admits rows as
//! a step's misses are inserted (a row cache shard's lock per row, which a lookup takes only
//! after its lock-free tries fail), flagged in their slot's header: the first lookup that finds
//! one clears the flag and counts an ahead hit (`RowCache::take_ahead_hits`), at no cost to the
//! lookups of other rows.
//!
//! Invariants: read-ahead only fills caches (a step's rows are read or copied as without it);
//! the queue holds at most `cap` rows, the oldest dropped beyond it; once the queue is drained,
//! `ahead_asked = ahead_read + ahead_dropped + ahead_cached`.

use super::gate::StepGate;
use super::plan::AheadSource;
use super::trim::Trim;
use crate::error::{Error, Result};
use crate::format::table::Table;
use crate::io::cache::RowCache;
use crate::io::mmap::advice;
use crate::io::source::{ReadReport, RowSource};
use crate::stats::Stats;
use crate::sync::{self, lock};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod sizer;
use sizer::{AHEAD_BATCH_TARGET, AHEAD_MAX_ROWS, AHEAD_MIN_ROWS, BatchSizer};
#[cfg(test)]
pub(super) const AHEAD_MIN_ROWS_FOR_TESTS: usize = AHEAD_MIN_ROWS;
/// Queue bound of an MMAP handle without a row cache when `ahead_max_rows` is 0 (about 2.4 s of
/// reads at 100k IOPS; 2 MiB of ids).
pub(super) const AHEAD_DEFAULT_ROWS_NO_CACHE: usize = 1 << 18;
/// How often the reader looks again while a submitted step is not done.
const STEP_POLL: Duration = Duration::from_micros(20);

/// What the caller and the reader share.
pub(super) struct Ahead {
    q: Mutex<Queue>,
    cv: Condvar,
    /// Most rows queued.
    pub(super) cap: usize,
    pub(super) thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// DIRECT mode without a row cache: read rows would have nowhere to go.
    nowhere: bool,
    #[cfg(test)]
    pub(super) test: TestReader,
}

/// Tests only: a delay per row read (a slow device without timing a real one) and a log of the
/// batches read.
#[cfg(test)]
#[derive(Default)]
pub(super) struct TestReader {
    pub(super) delay_per_row_us: std::sync::atomic::AtomicU64,
    pub(super) batches: Mutex<Vec<BatchLog>>,
}

/// Tests only: a batch the reader read.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub(super) struct BatchLog {
    pub(super) rows: usize,
    /// The highest seq submitted and `done` when its reads began.
    pub(super) submitted_before: u64,
    pub(super) done_before: u64,
    /// The highest seq submitted when its reads ended.
    pub(super) submitted_after: u64,
}

#[derive(Default)]
struct Queue {
    rows: VecDeque<u64>,
    stop: bool,
}

impl Ahead {
    /// A queue of at most `cap` rows; `nowhere`: DIRECT mode without a row cache (every row
    /// asked counts as dropped).
    pub(super) fn new(cap: usize, nowhere: bool) -> Ahead {
        Ahead {
            nowhere,
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            cap: cap.max(1),
            thread: Mutex::new(None),
            #[cfg(test)]
            test: TestReader::default(),
        }
    }

    /// Stops the reader after its batch in flight (the rows still queued count as dropped).
    pub(super) fn stop(&self) {
        lock(&self.q).stop = true;
        self.cv.notify_all();
    }
}

/// The queue bound of a handle: `ahead_max_rows`, or with 0 the row cache's capacity (MMAP
/// without a cache: [`AHEAD_DEFAULT_ROWS_NO_CACHE`]).
pub(super) fn queue_cap(max_rows: u64, cache: Option<&RowCache>) -> usize {
    match (max_rows, cache) {
        (0, Some(c)) => c.capacity_rows(),
        (0, None) => AHEAD_DEFAULT_ROWS_NO_CACHE,
        (n, _) => n.min(usize::MAX as u64) as usize,
    }
}

/// What the read-ahead runner reads with and writes to: the handles it uses, never the
/// pipeline's shared state.
pub(super) struct Runner {
    pub(super) table: Arc<Table>,
    /// The backend it opens for itself (the plan's).
    pub(super) source: AheadSource,
    /// Where read rows go (else the page cache, which the reads themselves fill).
    pub(super) cache: Option<Arc<RowCache>>,
    /// MMAP with a residency cap: rows read into the page cache are marked there.
    pub(super) residency: Option<Arc<Trim>>,
    pub(super) gate: Arc<StepGate>,
    pub(super) stats: Arc<Stats>,
}

impl Ahead {
    /// Queues `ids` (hashed, checked) for the reader, dropping the oldest queued rows beyond the
    /// bound; DIRECT mode without a row cache has nowhere to put rows: all count as dropped.
    /// The reader thread starts on the first call, with the handles `runner` gives.
    pub(super) fn queue(
        self: &Arc<Self>,
        ids: &[u64],
        st: &Stats,
        runner: impl FnOnce() -> Runner,
    ) -> Result<()> {
        let n = ids.len() as u64;
        if self.nowhere {
            st.ahead_asked.fetch_add(n, Relaxed);
            st.ahead_dropped.fetch_add(n, Relaxed);
            return Ok(());
        }
        self.start(runner)?;
        let mut q = lock(&self.q);
        if q.stop {
            return Err(Error::State("the handle is closing".into()));
        }
        // counted under the queue's lock, so a drained queue always balances
        st.ahead_asked.fetch_add(n, Relaxed);
        let keep = &ids[ids.len().saturating_sub(self.cap)..];
        let over = (q.rows.len() + keep.len()).saturating_sub(self.cap);
        q.rows.drain(..over);
        st.ahead_dropped
            .fetch_add(over as u64 + (ids.len() - keep.len()) as u64, Relaxed);
        q.rows.extend(keep);
        drop(q);
        self.cv.notify_one();
        Ok(())
    }

    fn start(self: &Arc<Self>, runner: impl FnOnce() -> Runner) -> Result<()> {
        let mut t = lock(&self.thread);
        if t.is_none() {
            let (a, r) = (self.clone(), runner());
            *t = Some(
                std::thread::Builder::new()
                    .name("ple-ahead".into())
                    .spawn(move || ahead_main(&a, r))
                    .map_err(|e| Error::io("starting the read-ahead thread", e))?,
            );
        }
        Ok(())
    }

    /// Takes the reader thread (to join it).
    pub(super) fn take_thread(&self) -> Option<std::thread::JoinHandle<()>> {
        lock(&self.thread).take()
    }
}

impl Runner {
    /// Whether row `id` is in the tier read-ahead fills (the row cache; else the page cache,
    /// the page of the row's first byte).
    fn cached(&self, id: u64) -> bool {
        let t = &self.table;
        match &self.cache {
            Some(c) => c.contains(id),
            None => advice::sample_resident(t.bytes(), &[id], t.row_bytes(), 1),
        }
    }
}

/// Stands in for a backend that could not be opened: every batch fails (and is dropped).
struct Unreadable;

impl RowSource for Unreadable {
    fn read(&mut self, _: &[u64], _: &mut [u8]) -> Result<ReadReport> {
        Err(Error::State("read-ahead has no reader".into()))
    }
    fn name(&self) -> &'static str {
        "none"
    }
}

/// Lowers the calling thread's scheduling priority (nice 10); a refusal only keeps it as is.
fn lower_priority() {
    // SAFETY: gettid and setpriority take no pointers; on Linux PRIO_PROCESS with a thread id
    // changes that thread only.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

/// Waits while a submitted step is not done (or until the handle closes).
fn wait_for_steps(g: &StepGate) {
    while g.step_pending() && !g.closing() {
        std::thread::sleep(STEP_POLL);
    }
}

fn ahead_main(a: &Ahead, r: Runner) {
    lower_priority();
    let rb = r.table.row_bytes();
    let g = &*r.gate;
    let mut source = match r.source.open(&r.table) {
        Ok(s) => s,
        Err(e) => {
            log::warn!("read-ahead: no reader ({e}); the rows asked are dropped");
            Box::new(Unreadable)
        }
    };
    let mut sizer = BatchSizer::new(AHEAD_BATCH_TARGET, AHEAD_MIN_ROWS, AHEAD_MAX_ROWS);
    let mut batch: Vec<u64> = Vec::with_capacity(AHEAD_MAX_ROWS);
    let mut misses: Vec<u64> = Vec::with_capacity(AHEAD_MAX_ROWS);
    let mut buf = vec![0u8; AHEAD_MAX_ROWS * rb];
    let st = &*r.stats;
    loop {
        // submitted steps first (the queue keeps its rows meanwhile: the bound drops the oldest)
        wait_for_steps(g);
        {
            let mut q = lock(&a.q);
            loop {
                if q.stop || g.closing() {
                    st.ahead_dropped.fetch_add(q.rows.len() as u64, Relaxed);
                    q.rows.clear();
                    return;
                }
                if !q.rows.is_empty() {
                    break;
                }
                q = sync::wait_timeout(&a.cv, q, Duration::from_millis(100)).0;
            }
            if g.step_pending() {
                continue; // (woken while a step waits: the step first)
            }
            let n = q.rows.len().min(sizer.rows());
            batch.clear();
            batch.extend(q.rows.drain(..n));
        }
        misses.clear();
        for &id in &batch {
            // (a row twice in one batch is read once: its second ask counts as cached)
            if misses.contains(&id) || r.cached(id) {
                st.ahead_cached.fetch_add(1, Relaxed);
            } else {
                misses.push(id);
            }
        }
        if misses.is_empty() {
            continue;
        }
        // and again right before the reads: a step is behind at most the batch read from here on
        wait_for_steps(g);
        let out = &mut buf[..misses.len() * rb];
        let t0 = Instant::now();
        let submitted = g.submitted();
        #[cfg(test)]
        a.test.read_begins(g, submitted, misses.len());
        let read = source.read(&misses, out);
        let submitted_after = g.submitted();
        let collided = submitted_after != submitted;
        if collided {
            st.ahead_collisions.fetch_add(1, Relaxed);
        }
        let now = Instant::now();
        sizer.record(misses.len(), now - t0, collided, now);
        #[cfg(test)]
        a.test.read_ends(submitted_after);
        match read {
            Ok(_) => {
                // a step submitted meanwhile first: the admissions take shard locks
                wait_for_steps(g);
                if let Some(c) = &r.cache {
                    for (&id, row) in misses.iter().zip(out.chunks_exact(rb)) {
                        c.admit(id, row);
                    }
                }
                st.ahead_read.fetch_add(misses.len() as u64, Relaxed);
                if r.cache.is_none() {
                    // read into the page cache
                    super::trim::keep_within(r.residency.as_deref(), &r.table, &misses, st);
                }
            }
            Err(e) => {
                log::debug!("read-ahead of {} rows: {e}", misses.len());
                st.ahead_dropped.fetch_add(misses.len() as u64, Relaxed);
            }
        }
    }
}

#[cfg(test)]
impl TestReader {
    /// Logs a batch of `rows` reads beginning, then stands in for a slow device.
    fn read_begins(&self, g: &StepGate, submitted: u64, rows: usize) {
        lock(&self.batches).push(BatchLog {
            rows,
            submitted_before: submitted,
            done_before: g.done(),
            submitted_after: submitted,
        });
        let d = self.delay_per_row_us.load(Relaxed);
        if d > 0 {
            std::thread::sleep(Duration::from_micros(d * rows as u64));
        }
    }

    fn read_ends(&self, submitted_after: u64) {
        if let Some(b) = lock(&self.batches).last_mut() {
            b.submitted_after = submitted_after;
        }
    }
}
