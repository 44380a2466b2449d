//! The worker thread: runs steps in submission order (hash → prefetch or direct read → gather →
//! device hand-off), publishes `done = seq`, then does the accounting.

use super::shared::*;
use crate::error::{Error, Result, panic_text};
use crate::format::table::Table;
use crate::io::cache;
use crate::io::direct::DirectReader;
use crate::io::gather;
use crate::io::prefetch::{self, PageSet, PageSetBuilder};
use crate::stats::{self, StepRecord};
use crate::step::options::{COLD_READ_MAX_ROWS, PrefetchPolicy};
use rayon::prelude::*;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

/// A closure run on the worker thread between steps, with the table and the pool.
pub(super) type OnWorker = Box<dyn FnOnce(&Table, &rayon::ThreadPool) + Send>;

/// What the worker thread receives: a step, or a closure to run on the worker thread between
/// steps (benchmarks measure a bare gather there, on the thread and CPU that gathers steps).
pub(super) enum Work {
    Step(Job),
    Run(OnWorker),
}

/// One step handed to the worker (owns copies of the caller's arrays).
pub(super) struct Job {
    pub(super) seq: u64,
    pub(super) slot: usize,
    pub(super) tokens: Vec<i32>,
    /// `tokens.len() × (ngram_size - 1)` context ids, ctx1 first.
    pub(super) ctx: Vec<i32>,
    pub(super) prefill: bool,
    pub(super) submitted: Instant,
}

impl Shared {
    /// Hashes, prefetches and gathers one step into its slot (the worker's part of a step).
    pub(super) fn run_step(&self, job: &Job, w: &mut WorkerScratch) -> Result<StepRecord> {
        #[cfg(test)]
        {
            let d = self.hooks.delay_us.load(Ordering::Relaxed);
            if d > 0 {
                std::thread::sleep(std::time::Duration::from_micros(d));
            }
            if self.hooks.fail_seq.load(Ordering::Relaxed) == job.seq {
                return Err(Error::io(
                    format!("injected failure of step {}", job.seq),
                    std::io::Error::other("test hook"),
                ));
            }
            if self.hooks.panic_seq.load(Ordering::Relaxed) == job.seq {
                panic!("injected panic in step {}", job.seq);
            }
        }
        if let Some(g) = &self.gpu {
            // no kernel may still read the slot's rows when the gather overwrites them
            g.begin_step(job.slot, job.seq)?;
        }
        let n = job.tokens.len();
        let heads = self.heads.len();
        let rb = self.table.row_bytes();
        let mut rec = StepRecord {
            queue_ns: stats::ns(job.submitted.elapsed()),
            prefill: job.prefill,
            tokens: n as u64,
            rows: (n * heads) as u64,
            ..Default::default()
        };

        // hash
        let t0 = Instant::now();
        self.hash_step(job, w)?;
        let t1 = Instant::now();
        rec.hash_ns = stats::ns(t1 - t0);
        self.count_ahead_hits(&w.ids);
        if let Some(d) = &self.direct {
            return self.read_direct(d, job, w, rec, t1);
        }
        let rec = self.gather_mmap(job, w, rec, t1)?;
        self.upload(job, n * heads * rb, rec)
    }

    /// The step's row ids into `w.ids` (on the pool for big steps), each checked to be inside
    /// the row file: per token, the ids of the handle's heads, less the row file's base.
    pub(super) fn hash_step(&self, job: &Job, w: &mut WorkerScratch) -> Result<()> {
        let n = job.tokens.len();
        let heads = self.heads.len();
        let k = self.table.meta().ngram_size as usize - 1;
        w.ids.clear();
        w.ids.resize(n * heads, 0);
        let total_rows = self.table.meta().total_rows;
        let hash_chunk = |(ids, (toks, ctx)): (&mut [u64], (&[i32], &[i32]))| -> Result<()> {
            let base = self.row_base;
            self.hasher
                .ids_for_heads(toks, ctx, self.heads.clone(), base, ids);
            gather::check_ids(ids, total_rows)
        };
        if n >= PARALLEL_HASH_MIN_TOKENS && self.pool().current_num_threads() > 1 {
            const CH: usize = 64;
            self.pool().install(|| {
                w.ids
                    .par_chunks_mut(CH * heads)
                    .zip(job.tokens.par_chunks(CH).zip(job.ctx.par_chunks(CH * k)))
                    .try_for_each(hash_chunk)
            })?;
        } else {
            hash_chunk((&mut w.ids[..], (&job.tokens[..], &job.ctx[..])))?;
        }
        Ok(())
    }

    /// MMAP: whether the step prefetches (AUTO: at least `prefetch_min_rows` rows, unless a
    /// residency sample finds their pages cached; never through the row cache), and whether its
    /// rows are cold (what decides if a [`ColdReader`] may read them past the page cache).
    pub(super) fn prefetch_decision(&self, w: &WorkerScratch) -> Prefetch {
        let rb = self.table.row_bytes();
        let resident = |k: usize| prefetch::sample_resident(self.table.bytes(), &w.ids, rb, k);
        match self.opts.prefetch_policy {
            _ if self.cache.is_some() => Prefetch::No,
            PrefetchPolicy::Never => Prefetch::No,
            // every step; only one a cold reader would read needs the sample
            PrefetchPolicy::Always => {
                if self.reads_cold(w.ids.len()) && resident(prefetch::sample_size(w.ids.len())) {
                    Prefetch::Cached
                } else {
                    Prefetch::Cold
                }
            }
            // warm streak: one probe (about 1 µs); after a step that read storage, the full
            // sample, so a partly cached step is caught
            PrefetchPolicy::Auto
                if w.ids.len() >= self.opts.prefetch_min_rows as usize
                    && !resident(if w.storage_recently {
                        prefetch::sample_size(w.ids.len())
                    } else {
                        1
                    }) =>
            {
                Prefetch::Cold
            }
            PrefetchPolicy::Auto => Prefetch::No,
        }
    }

    /// MMAP mode: the prefetch decision and the gather of `w.ids` (hashed at `t1`) into the
    /// step's slot.
    pub(super) fn gather_mmap(
        &self,
        job: &Job,
        w: &mut WorkerScratch,
        mut rec: StepRecord,
        t1: Instant,
    ) -> Result<StepRecord> {
        let rb = self.table.row_bytes();

        // prefetch decision (AUTO: steps of at least `prefetch_min_rows` rows, decode steps
        // included, unless a residency sample finds their pages cached) and, when prefetching,
        // the step's sorted page ranges. Steps that do not prefetch count their distinct pages
        // after they are published (off the critical path).
        let decision = self.prefetch_decision(w);
        let prefetch = decision != Prefetch::No;
        if prefetch {
            w.pages_builder.build(&w.ids, rb, &mut w.pages);
            rec.unique_pages = w.pages.len() as u64;
        } else {
            w.count_pages_later = true;
        }
        self.check_closing()?;
        let t2 = Instant::now();
        rec.prefetch_ns = stats::ns(t2 - t1);
        self.check_closing()?;
        // SAFETY: the slot is Pending with this job: only the worker touches its buffer.
        let staging = unsafe { self.staging_mut(job.slot) };
        // (the worker thread's faults are counted once per step, after publishing; here only
        // the storage reads the advice started)
        let issue = |ranges: &[prefetch::PageRange]| {
            let n = prefetch::prefetch(self.table.file(), self.table.bytes(), ranges)?;
            let io = stats::IoDelta {
                read_bytes: stats::thread_read_bytes_delta(),
                ..Default::default()
            };
            Ok((n, io))
        };
        let pool = self.pool();
        if let Some(c) = &self.cache {
            // Row cache seam: cached rows are copied from the cache, misses read from the
            // mapping (and inserted); no prefetch. A direct-read mode replaces the miss path.
            let g = cache::gather_cached(c, self.table.bytes(), &w.ids, staging, Some(pool))?;
            rec.io.add(g.io);
            rec.cache_hits = g.hits;
            rec.cache_misses = g.misses;
            rec.gather_ns = stats::ns(t2.elapsed());
        } else if prefetch {
            rec.prefetched = true;
            rec.storage_reads = w.pages.ranges.len() as u64;
            if decision == Prefetch::Cold && self.read_cold_rows(w, staging, &mut rec)? {
                rec.gather_ns = stats::ns(t2.elapsed());
            } else if w.ids.len() >= gather::PARALLEL_MIN_ROWS && pool.current_num_threads() > 1 {
                let r = gather::gather_overlapped(
                    self.table.bytes(),
                    rb,
                    &w.ids,
                    staging,
                    pool,
                    &w.pages,
                    issue,
                )?;
                rec.pages_prefetched = r.pages_issued;
                rec.io.add(r.issue_io);
                rec.io.add(r.gather_io);
                rec.prefetch_ns += stats::ns(r.issue_time);
                rec.gather_ns = stats::ns(t2.elapsed().saturating_sub(r.issue_time));
            } else {
                let (n, io) = issue(&w.pages.ranges)?;
                rec.pages_prefetched = n;
                rec.io.add(io);
                let t3 = Instant::now();
                rec.prefetch_ns += stats::ns(t3 - t2);
                rec.io.add(gather::gather(
                    self.table.bytes(),
                    rb,
                    &w.ids,
                    staging,
                    Some(pool),
                )?);
                rec.gather_ns = stats::ns(t3.elapsed());
            }
        } else {
            // A big step gathers on the pool while this thread counts its distinct pages; a
            // small one counts them after it is published (off the step's latency).
            let big = gather::runs_on_pool(w.ids.len(), pool);
            let WorkerScratch {
                ids, pages_builder, ..
            } = &mut *w;
            let (io, pages) =
                gather::gather_with(self.table.bytes(), rb, ids, staging, Some(pool), || {
                    big.then(|| pages_builder.count_unique(ids, rb))
                })?;
            rec.io.add(io);
            if let Some(n) = pages {
                rec.unique_pages = n as u64;
                w.count_pages_later = false;
            }
            rec.gather_ns = stats::ns(t2.elapsed());
        }
        Ok(rec)
    }

    /// MMAP: reads a cold prefetching step's rows past the mapping into `staging` when the
    /// handle has a [`ColdReader`] and the step is small enough; false when the step is left to
    /// WILLNEED and the gather.
    fn read_cold_rows(
        &self,
        w: &mut WorkerScratch,
        staging: &mut [u8],
        rec: &mut StepRecord,
    ) -> Result<bool> {
        let rb = self.table.row_bytes();
        if !self.reads_cold(w.ids.len()) {
            return Ok(false);
        }
        match &self.cold {
            ColdReader::Direct(d) => {
                // the rows' sectors read into the slot, all in flight; their pages are advised
                // when the worker is next idle (`advise_pending`)
                let r = lock(d).read_rows(&w.ids, staging)?;
                stats::thread_read_bytes_delta(); // (the reads' bytes, counted here)
                rec.storage_reads = r.reads;
                rec.io.read_bytes += r.bytes;
                if w.advice.len() < MAX_PENDING_ADVICE {
                    w.advice.extend_from_slice(&w.pages.ranges);
                }
                Ok(true)
            }
            ColdReader::Buffered(u) => {
                // the rows read through the page cache straight into the slot, all in flight
                // at once: no fault, and cached rows cost no storage read
                lock(u).read_rows(&w.ids, rb, staging)?;
                rec.pages_prefetched = w.pages.len() as u64;
                rec.io.read_bytes += stats::thread_read_bytes_delta();
                Ok(true)
            }
            ColdReader::None => Ok(false),
        }
    }

    /// Whether a cold step of `rows` rows is read by the handle's [`ColdReader`] (it has one,
    /// and the step is at most [`COLD_READ_MAX_ROWS`]) rather than left to WILLNEED and the
    /// gather.
    fn reads_cold(&self, rows: usize) -> bool {
        !matches!(self.cold, ColdReader::None) && rows <= COLD_READ_MAX_ROWS
    }

    /// DIRECT mode's read of the step's rows (`w.ids`, hashed at `t1`) into its slot.
    pub(super) fn read_direct(
        &self,
        d: &Mutex<DirectReader>,
        job: &Job,
        w: &mut WorkerScratch,
        mut rec: StepRecord,
        t1: Instant,
    ) -> Result<StepRecord> {
        // SAFETY: the slot is Pending with this job: only the worker touches its buffer.
        let staging = unsafe { self.staging_mut(job.slot) };
        let r = if let Some(c) = &self.cache {
            // the row cache in front of the direct reads: only the rows it misses are read
            let (r, hits) = cache::read_through(
                c,
                &w.ids,
                staging,
                &mut w.read_through,
                Some(self.pool()),
                |m, o| lock(d).read_rows(m, o),
            )?;
            rec.cache_hits = hits;
            rec.cache_misses = w.ids.len() as u64 - hits;
            r.unwrap_or_default()
        } else {
            lock(d).read_rows(&w.ids, staging)?
        };
        rec.storage_reads = r.reads;
        rec.io.read_bytes += r.bytes;
        w.count_pages_later = true;
        rec.gather_ns = stats::ns(t1.elapsed());
        self.upload(job, w.ids.len() * self.table.row_bytes(), rec)
    }

    /// CUDA handles: the GPU side publishes the step's `bytes` of rows to the device (host-wait
    /// mode: after its host → device copy) before the pipeline publishes it. On error the step
    /// fails and `publish` publishes it to the device as failed.
    pub(super) fn upload(
        &self,
        job: &Job,
        bytes: usize,
        mut rec: StepRecord,
    ) -> Result<StepRecord> {
        if let Some(g) = &self.gpu {
            self.check_closing()?;
            let t = Instant::now();
            g.upload(job.slot, bytes, job.seq, job.tokens.len() as u32)?;
            rec.copy_ns = stats::ns(t.elapsed());
        }
        Ok(rec)
    }

    /// When the worker is idle after steps whose rows were read directly (MMAP,
    /// [`ColdReader::Direct`]): WILLNEED for their pages, so the page cache warms as a gather
    /// would have left it — off every step's latency, and after the waiter of the last step had
    /// the worker's spin to wake up in (on a small machine the advice would take its CPU). The
    /// storage it reads is counted in the handle's counters directly. A failure only loses the
    /// warming.
    fn advise_pending(&self, w: &mut WorkerScratch) {
        if w.advice.is_empty() {
            return;
        }
        stats::thread_read_bytes_delta();
        match prefetch::prefetch(self.table.file(), self.table.bytes(), &w.advice) {
            Ok(n) => {
                let st = &self.stats;
                st.pages_prefetched.fetch_add(n, Ordering::Relaxed);
                st.storage_reads
                    .fetch_add(w.advice.len() as u64, Ordering::Relaxed);
                st.storage_read_bytes
                    .fetch_add(stats::thread_read_bytes_delta(), Ordering::Relaxed);
            }
            Err(e) => log::debug!("WILLNEED after direct-read steps: {e}"),
        }
        w.advice.clear();
    }

    pub(super) fn check_closing(&self) -> Result<()> {
        if self.closing.load(Ordering::Relaxed) {
            Err(Error::State(
                "the handle was closed while the step ran".into(),
            ))
        } else {
            Ok(())
        }
    }
}

/// MMAP: a step's prefetch decision ([`Shared::prefetch_decision`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Prefetch {
    No,
    /// Prefetch, the pages sampled cached (ALWAYS): WILLNEED, then the gather from memory.
    Cached,
    /// Prefetch, the pages not cached (or not sampled).
    Cold,
}

/// Buffers the worker keeps between steps.
#[derive(Default)]
pub(super) struct WorkerScratch {
    pub(super) ids: Vec<u64>,
    pub(super) pages_builder: PageSetBuilder,
    pub(super) pages: PageSet,
    /// The last step's distinct pages are still to be counted (from `ids`).
    pub(super) count_pages_later: bool,
    /// The last step prefetched or took major faults (its rows were not all cached).
    pub(super) storage_recently: bool,
    /// DIRECT mode with a row cache: the misses' buffers.
    pub(super) read_through: cache::ReadThroughScratch,
    /// MMAP: page ranges of rows read directly, to advise WILLNEED when the worker is idle.
    pub(super) advice: Vec<prefetch::PageRange>,
}

/// Most page ranges waiting to be advised (beyond it the advice is dropped: those rows are read
/// directly again the next time).
const MAX_PENDING_ADVICE: usize = 1 << 16;
/// Page ranges waiting to be advised that make the worker advise them before its next step even
/// though it has not been idle (steps submitted back to back): about 1 ms of advice, so the page
/// cache still warms under steady load.
const ADVISE_BEFORE_STEP: usize = 512;

/// Receives the next job, spinning briefly first (back-to-back steps skip the futex wake-up);
/// when the spin ends with no job, runs `idle` once before blocking.
pub(super) fn recv_spin(rx: &mpsc::Receiver<Work>, idle: impl FnOnce()) -> Option<Work> {
    let start = Instant::now();
    let mut i = 0u32;
    loop {
        match rx.try_recv() {
            Ok(j) => return Some(j),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) => {}
        }
        i += 1;
        if i % 32 == 0 && start.elapsed() > WORKER_SPIN {
            idle();
            return rx.recv().ok();
        }
        spin_round(start, i, WORKER_BUSY_SPIN);
    }
}

pub(super) fn worker_main(sh: Arc<Shared>, rx: mpsc::Receiver<Work>) {
    stats::thread_read_bytes_delta();
    stats::thread_io_since_last();
    let mut w = WorkerScratch::default();
    loop {
        let Some(work) = recv_spin(&rx, || sh.advise_pending(&mut w)) else {
            break;
        };
        let job = match work {
            Work::Step(job) => job,
            Work::Run(f) => {
                // the advice still waiting for an idle worker is issued first, so a closure
                // (a benchmark's baseline) never runs beside it
                sh.advise_pending(&mut w);
                // (a panic here drops the reply sender: the caller sees the error)
                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| f(&sh.table, sh.pool())));
                stats::thread_io_since_last(); // not a step's
                continue;
            }
        };
        w.count_pages_later = false;
        if w.advice.len() >= ADVISE_BEFORE_STEP {
            sh.advise_pending(&mut w);
        }
        let r = if sh.closing.load(Ordering::Relaxed) {
            Err(Error::State(
                "the handle was closed before the step ran".into(),
            ))
        } else {
            std::panic::catch_unwind(AssertUnwindSafe(|| sh.run_step(&job, &mut w))).unwrap_or_else(
                |p| {
                    Err(Error::Panic(format!(
                        "step {}: {}",
                        job.seq,
                        panic_text(&*p)
                    )))
                },
            )
        };
        match r {
            Ok(mut rec) => {
                rec.step_ns = sh.publish(&job, Ok(()));
                // accounting after the step is visible to its waiter: this thread's faults
                // (and storage reads) since the previous step's, and the distinct pages
                rec.io.add(stats::thread_io_since_last());
                w.storage_recently = rec.prefetched || rec.io.major_faults > 0;
                if w.count_pages_later {
                    rec.unique_pages =
                        w.pages_builder.count_unique(&w.ids, sh.table.row_bytes()) as u64;
                }
                sh.keep_resident_within_cap(&w.ids);
                sh.stats.record_step(&rec);
            }
            Err(e) => {
                sh.publish(&job, Err(e));
                stats::thread_io_since_last();
            }
        }
        sh.accounted.store(job.seq, Ordering::Release);
    }
    stats::close_thread_io();
}
