//! MMAP mode's read of a step ([`Reader`]'s part that reads from the mapping): the page-advice
//! decision, the cold read past the mapping, the gather (through the row cache when there is
//! one), and the advice deferred to an idle moment.

use super::{ReadScratch, Reader, check_cancelled};
use crate::error::Result;
use crate::io::cache;
use crate::io::mmap::advice;
use crate::io::mmap::gather;
use crate::io::source::RowSource;
use crate::stats::{self, Stats, StepRecord};
use crate::step::options::{COLD_READ_MAX_ROWS, PrefetchPolicy};
use crate::step::plan::ColdRead;
use crate::sync::lock;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Most page ranges waiting to be advised (beyond it the advice is dropped: those rows are read
/// directly again the next time).
const MAX_PENDING_ADVICE: usize = 1 << 16;
/// Page ranges waiting to be advised that make the worker advise them before its next step even
/// though it has not been idle (steps submitted back to back): about 1 ms of advice, so the page
/// cache still warms under steady load.
pub(super) const ADVISE_BEFORE_STEP: usize = 512;

/// MMAP: a step's page-advice decision ([`Reader::advice_decision`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Advice {
    No,
    /// Advise, the pages sampled cached (ALWAYS): WILLNEED, then the gather from memory.
    Cached,
    /// Advise, the pages not cached (or not sampled).
    Cold,
}

impl Reader {
    /// MMAP: whether the step takes page advice (`PrefetchPolicy`; AUTO: at least
    /// `prefetch_min_rows` rows, unless a residency sample finds their pages cached; never
    /// through the row cache), and whether its rows are cold (what decides if a [`ColdRead`] may
    /// read them past the page cache).
    fn advice_decision(&self, s: &ReadScratch) -> Advice {
        let rb = self.table.row_bytes();
        let resident = |k: usize| advice::sample_resident(self.table.bytes(), &s.ids, rb, k);
        match self.prefetch_policy {
            _ if self.cache.is_some() => Advice::No,
            PrefetchPolicy::Never => Advice::No,
            // every step; only one a cold reader would read needs the sample
            PrefetchPolicy::Always => {
                if self.cold_read_applies(s.ids.len()) && resident(advice::sample_size(s.ids.len()))
                {
                    Advice::Cached
                } else {
                    Advice::Cold
                }
            }
            // warm streak: one probe (about 1 µs); after a step that read storage, the full
            // sample, so a partly cached step is caught
            PrefetchPolicy::Auto
                if s.ids.len() >= self.prefetch_min_rows as usize
                    && !resident(if s.storage_recently {
                        advice::sample_size(s.ids.len())
                    } else {
                        1
                    }) =>
            {
                Advice::Cold
            }
            PrefetchPolicy::Auto => Advice::No,
        }
    }

    /// MMAP mode: the page-advice decision and the gather of `s.ids` (hashed at `t1`) into the
    /// step's slot.
    pub(super) fn gather_mmap(
        &self,
        s: &mut ReadScratch,
        staging: &mut [u8],
        mut rec: StepRecord,
        t1: Instant,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<StepRecord> {
        let rb = self.table.row_bytes();

        // page-advice decision (AUTO: steps of at least `prefetch_min_rows` rows, decode steps
        // included, unless a residency sample finds their pages cached) and, when advising, the
        // step's sorted page ranges. Steps without advice count their distinct pages after they
        // are published (off the critical path).
        let decision = self.advice_decision(s);
        let advise = decision != Advice::No;
        if advise {
            s.pages_builder.build(&s.ids, rb, &mut s.pages);
            rec.unique_pages = s.pages.len() as u64;
        } else {
            s.count_pages_later = true;
        }
        check_cancelled(cancelled)?;
        let t2 = Instant::now();
        rec.prefetch_ns = stats::ns(t2 - t1);
        check_cancelled(cancelled)?;
        // (the worker thread's faults are counted once per step, after publishing; here only
        // the storage reads the advice started)
        let issue = |ranges: &[advice::PageRange]| {
            let n = advice::willneed(self.table.file(), self.table.bytes(), ranges)?;
            let io = stats::IoDelta {
                read_bytes: stats::thread_read_bytes_delta(),
                ..Default::default()
            };
            Ok((n, io))
        };
        let pool = self.pool();
        if let Some(c) = &self.cache {
            // Row cache seam: cached rows are copied from the cache, misses read from the
            // mapping (and inserted); no page advice. DIRECT mode replaces the miss path.
            let g = cache::gather_cached(c, self.table.bytes(), &s.ids, staging, Some(pool))?;
            rec.io.add(g.io);
            rec.cache_hits = g.hits;
            rec.cache_misses = g.misses;
            rec.gather_ns = stats::ns(t2.elapsed());
        } else if advise {
            rec.prefetched = true;
            rec.storage_reads = s.pages.ranges.len() as u64;
            if decision == Advice::Cold && self.cold_read(s, staging, &mut rec)? {
                rec.gather_ns = stats::ns(t2.elapsed());
            } else if s.ids.len() >= gather::PARALLEL_MIN_ROWS && pool.current_num_threads() > 1 {
                let r = gather::gather_overlapped(
                    self.table.bytes(),
                    rb,
                    &s.ids,
                    staging,
                    pool,
                    &s.pages,
                    issue,
                )?;
                rec.pages_prefetched = r.pages_issued;
                rec.io.add(r.issue_io);
                rec.io.add(r.gather_io);
                rec.prefetch_ns += stats::ns(r.issue_time);
                rec.gather_ns = stats::ns(t2.elapsed().saturating_sub(r.issue_time));
            } else {
                let (n, io) = issue(&s.pages.ranges)?;
                rec.pages_prefetched = n;
                rec.io.add(io);
                let t3 = Instant::now();
                rec.prefetch_ns += stats::ns(t3 - t2);
                rec.io.add(gather::gather(
                    self.table.bytes(),
                    rb,
                    &s.ids,
                    staging,
                    Some(pool),
                )?);
                rec.gather_ns = stats::ns(t3.elapsed());
            }
        } else {
            // A big step gathers on the pool while this thread counts its distinct pages; a
            // small one counts them after it is published (off the step's latency).
            let big = gather::runs_on_pool(s.ids.len(), pool);
            let ReadScratch {
                ids, pages_builder, ..
            } = &mut *s;
            let (io, pages) =
                gather::gather_with(self.table.bytes(), rb, ids, staging, Some(pool), || {
                    big.then(|| pages_builder.count_unique(ids, rb))
                })?;
            rec.io.add(io);
            if let Some(n) = pages {
                rec.unique_pages = n as u64;
                s.count_pages_later = false;
            }
            rec.gather_ns = stats::ns(t2.elapsed());
        }
        Ok(rec)
    }

    /// MMAP: reads a cold advised step's rows past the mapping into `staging` when the
    /// handle has a [`ColdRead`] and the step is small enough; false when the step is left to
    /// WILLNEED and the gather.
    fn cold_read(
        &self,
        s: &mut ReadScratch,
        staging: &mut [u8],
        rec: &mut StepRecord,
    ) -> Result<bool> {
        if !self.cold_read_applies(s.ids.len()) {
            return Ok(false);
        }
        match &self.cold {
            ColdRead::Direct(d) => {
                // the rows' sectors read into the slot, all in flight; their pages are advised
                // when the worker is next idle (`advise_pending`)
                let r = lock(d).read(&s.ids, staging)?;
                stats::thread_read_bytes_delta(); // (the reads' bytes, counted here)
                rec.storage_reads = r.reads;
                rec.io.read_bytes += r.bytes;
                if s.advice.len() < MAX_PENDING_ADVICE {
                    s.advice.extend_from_slice(&s.pages.ranges);
                }
                Ok(true)
            }
            ColdRead::Buffered(u) => {
                // the rows read through the page cache straight into the slot, all in flight
                // at once: no fault, and cached rows cost no storage read
                lock(u).read(&s.ids, staging)?;
                rec.pages_prefetched = s.pages.len() as u64;
                rec.io.read_bytes += stats::thread_read_bytes_delta();
                Ok(true)
            }
            ColdRead::None => Ok(false),
        }
    }

    /// Whether a cold step of `rows` rows is read by the handle's [`ColdRead`] (it has one,
    /// and the step is at most [`COLD_READ_MAX_ROWS`]) rather than left to WILLNEED and the
    /// gather.
    fn cold_read_applies(&self, rows: usize) -> bool {
        !matches!(self.cold, ColdRead::None) && rows <= COLD_READ_MAX_ROWS
    }

    /// Called when the caller is idle after steps whose rows were read directly (MMAP,
    /// `ColdRead::Direct`): WILLNEED for their pages, so the page cache warms as a gather
    /// would have left it — off every step's latency, and after the waiter of the last step had
    /// the worker's spin to wake up in (on a small machine the advice would take its CPU). The
    /// storage it reads is counted in the handle's counters directly. A failure only loses the
    /// warming.
    pub fn idle(&self, s: &mut ReadScratch, stats: &Stats) {
        if s.advice.is_empty() {
            return;
        }
        stats::thread_read_bytes_delta();
        match advice::willneed(self.table.file(), self.table.bytes(), &s.advice) {
            Ok(n) => {
                let st = stats;
                st.pages_prefetched.fetch_add(n, Ordering::Relaxed);
                st.storage_reads
                    .fetch_add(s.advice.len() as u64, Ordering::Relaxed);
                st.storage_read_bytes
                    .fetch_add(stats::thread_read_bytes_delta(), Ordering::Relaxed);
            }
            Err(e) => log::debug!("WILLNEED after direct-read steps: {e}"),
        }
        s.advice.clear();
    }
}
