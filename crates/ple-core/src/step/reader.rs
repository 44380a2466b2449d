//! The read engine of a handle: [`Reader`] turns a step's tokens into its rows in a buffer —
//! hashing (on the pool for big steps), then in MMAP mode the page-advice decision, the cold
//! read or the gather from the mapping (through the row cache when there is one), in DIRECT mode
//! the direct reads (behind the row cache). One call, [`Reader::read_step`]; no ring, no
//! threads of its own beyond the pool: the worker drives it, and so can a benchmark or a test.

use crate::error::{Error, Result};
use crate::format::table::Table;
use crate::io::cache::{self, RowCache};
use crate::io::direct::{Backend, DirectReader};
use crate::io::mmap::advice::{self, PageSet, PageSetBuilder};
use crate::io::mmap::buffered::BufferedReader;
use crate::io::mmap::gather;
use crate::lookup::hash::Hasher;
use crate::shard::{Heads, Shard};
use crate::stats::{self, Stats, StepRecord};
use crate::step::options::{
    CACHE_AUTO, COLD_READ_MAX_ROWS, ColdReads, IoMode, OpenOptions, PrefetchPolicy,
};
use crate::sync::lock;
use rayon::prelude::*;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// Steps with at least this many tokens are hashed in parallel on the pool.
const PARALLEL_HASH_MIN_TOKENS: usize = 1024;

/// A handle's read engine: the table, its hasher, the gather pool, the row cache and the
/// direct and cold readers (see the module doc).
pub struct Reader {
    pub(super) table: Table,
    pub(super) hasher: Hasher,
    /// The heads the handle serves (`opts.shard`'s; all 16 for the whole table): a step's rows
    /// are `[tokens][heads.len()][row_bytes]`.
    pub(super) heads: Heads,
    /// Per head of `heads`: the row of the row file its rows start at (the whole table: the
    /// head's hash offset; a shard table: after the rows of its earlier heads, `crate::shard`).
    pub(super) head_starts: Vec<u64>,
    prefetch_policy: PrefetchPolicy,
    prefetch_min_rows: u32,
    num_threads: u32,
    /// Started by [`Reader::start_pool`]; taken out only by [`Reader::stop_pool`].
    pool: Option<rayon::ThreadPool>,
    pool_threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// The row cache (`cache_bytes > 0`): steps read through it.
    pub(super) cache: Option<RowCache>,
    /// DIRECT with a cache: where a big step's lookups run (measured).
    placement: cache::Placement,
    /// Its `cache_bytes` (AUTO resolved; 0: no cache).
    cache_budget: u64,
    /// DIRECT mode's reader (None: MMAP mode). The lock is uncontended (one reading thread).
    pub(super) direct: Option<Mutex<DirectReader>>,
    /// MMAP mode: how steps of at most `COLD_READ_MAX_ROWS` rows whose pages are not cached
    /// read their rows.
    cold: ColdRead,
    /// MMAP with `resident_bytes_max`: the table's residency cap and its trim thread's state.
    residency: Option<super::trim::Trim>,
}

impl Reader {
    /// The reader of `table` for `opts` (`io_mode`, `cold_reads`, `cache_bytes`,
    /// `resident_bytes_max`, `shard`, `prefetch_*`, `num_threads`). Starts no thread: call
    /// [`Reader::start_pool`] before reading.
    pub fn open(table: Table, opts: &OpenOptions) -> Result<Reader> {
        let hasher = Hasher::new(table.hash_params())?;
        let direct = open_direct(&table, opts)?.map(Mutex::new);
        let cold = ColdRead::open(&table, opts, direct.is_some());
        if table.meta().num_heads as usize != crate::model::NUM_HEADS {
            return Err(Error::Unsupported(format!(
                "tables with {} heads",
                table.meta().num_heads
            )));
        }
        let (heads, head_starts) = shard_rows(&table, opts.shard)?;
        // MMAP only: DIRECT reads bypass the page cache
        let residency = (opts.resident_bytes_max > 0 && direct.is_none()).then(|| {
            super::trim::Trim::new(crate::io::mmap::residency::ResidencyCap::new(
                table.bytes(),
                opts.resident_bytes_max,
            ))
        });
        Ok(Reader {
            table,
            hasher,
            heads,
            head_starts,
            prefetch_policy: opts.prefetch_policy,
            prefetch_min_rows: opts.prefetch_min_rows,
            num_threads: opts.num_threads,
            pool: None,
            pool_threads: Arc::default(),
            cache: None,
            cache_budget: 0,
            placement: cache::Placement::default(),
            direct,
            cold,
            residency,
        })
    }

    /// Creates the row cache `opts.cache_bytes` asks for (AUTO resolved for the I/O mode; AUTO
    /// with almost no memory free: none).
    pub fn open_cache(&mut self, opts: &OpenOptions) -> Result<()> {
        let cache_bytes = opts.cache_bytes_for(self.direct.is_some());
        self.cache = match cache_bytes {
            0 => None,
            b => match RowCache::new(b, self.table.row_bytes()) {
                Ok(c) => Some(c),
                // AUTO on a machine with almost no memory free: no cache
                Err(Error::InvalidArgument(_)) if opts.cache_bytes == CACHE_AUTO => None,
                Err(Error::InvalidArgument(m)) => {
                    return Err(Error::InvalidArgument(format!("options.{m}")));
                }
                Err(e) => return Err(e),
            },
        };
        self.cache_budget = if self.cache.is_some() { cache_bytes } else { 0 };
        Ok(())
    }

    /// Starts the gather pool of `num_threads` threads (0: one per CPU).
    pub fn start_pool(&mut self) -> Result<()> {
        self.pool = Some(start_pool(self.num_threads, self.pool_threads.clone())?);
        Ok(())
    }

    /// Drops the gather pool and joins its threads.
    pub fn stop_pool(&mut self) {
        drop(self.pool.take());
        let handles = std::mem::take(&mut *lock(&self.pool_threads));
        for h in handles {
            let _ = h.join();
        }
    }

    /// The gather pool.
    ///
    /// # Panics
    /// Before [`Reader::start_pool`] or after [`Reader::stop_pool`].
    pub fn pool(&self) -> &rayon::ThreadPool {
        self.pool
            .as_ref()
            .expect("the pool lives from start_pool to stop_pool")
    }

    /// The open table.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The I/O mode the reader runs with and its backend.
    pub fn io_info(&self) -> IoInfo {
        let (mode, backend) = match &self.direct {
            Some(d) => (IoMode::Direct, Some(lock(d).backend())),
            None => (IoMode::Mmap, None),
        };
        IoInfo {
            mode,
            backend,
            cache_bytes: self.cache_budget,
        }
    }

    /// Reads the rows of one step into `out` (`[tokens][heads][row_bytes]`, at least that many
    /// bytes): hashes `tokens` with their contexts `ctx` (`tokens.len() × (ngram_size - 1)`
    /// ids, ctx1 first), then reads their rows by the handle's I/O mode. `cancelled` is checked
    /// between the phases (true: the step fails with `Error::State`). Returns the step's record
    /// (`queue_ns`, `prefill` and `copy_ns` are the caller's to fill); the accounting that can
    /// wait until the step is handed on is [`Reader::finish_step`].
    pub fn read_step(
        &self,
        tokens: &[i32],
        ctx: &[i32],
        out: &mut [u8],
        s: &mut ReadScratch,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<StepRecord> {
        let t0 = Instant::now();
        self.hash(tokens, ctx, s)?;
        self.read_ids(tokens.len(), out, s, t0, cancelled)
    }

    /// [`Reader::read_step`] of rows given by the caller (`ple_submit_ids`): `rows` holds
    /// `[tokens][heads]` rows of the row file, checked to be inside it.
    pub fn read_rows(
        &self,
        rows: &[u64],
        out: &mut [u8],
        s: &mut ReadScratch,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<StepRecord> {
        let t0 = Instant::now();
        s.ids.clear();
        s.ids.extend_from_slice(rows);
        self.read_ids(rows.len() / self.heads.len(), out, s, t0, cancelled)
    }

    /// Reads the rows `s.ids` of `n` tokens (found since `t0`: the step's hash time) into `out`
    /// by the handle's I/O mode.
    fn read_ids(
        &self,
        n: usize,
        out: &mut [u8],
        s: &mut ReadScratch,
        t0: Instant,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<StepRecord> {
        let heads = self.heads.len();
        let want = n * heads * self.table.row_bytes();
        if out.len() < want || s.ids.len() != n * heads {
            return crate::invalid!(
                "out holds {} bytes and {} row ids; the step's {n} tokens need {want} bytes",
                out.len(),
                s.ids.len()
            );
        }
        s.count_pages_later = false;
        let mut rec = StepRecord {
            tokens: n as u64,
            rows: (n * heads) as u64,
            ..Default::default()
        };
        let t1 = Instant::now();
        rec.hash_ns = stats::ns(t1 - t0);
        let out = &mut out[..want];
        match &self.direct {
            Some(d) => self.read_direct(d, s, out, rec, t1),
            None => self.gather_mmap(s, out, rec, t1, cancelled),
        }
    }

    /// The accounting of a step read into `rec` that can wait until it is handed on (off its
    /// latency): whether storage was read recently, the step's distinct pages where the read did
    /// not count them, and the residency cap.
    pub fn finish_step(&self, s: &mut ReadScratch, rec: &mut StepRecord, stats: &Stats) {
        s.storage_recently = rec.prefetched || rec.io.major_faults > 0;
        if s.count_pages_later {
            rec.unique_pages = s.pages_builder.count_unique(&s.ids, self.table.row_bytes()) as u64;
        }
        self.keep_resident_within_cap(&s.ids, stats);
    }

    /// Whether the gather pool likely takes no part in reading a step of `rows` rows (its
    /// hashing aside): too small to split; DIRECT without a row cache (the direct reader has
    /// its own ring); DIRECT with one where its lookups measured cheaper on the worker.
    pub fn reads_alone(&self, rows: usize) -> bool {
        if !crate::io::mmap::gather::runs_on_pool(rows, self.pool()) {
            return true;
        }
        self.direct.is_some() && (self.cache.is_none() || !self.placement.prefers_pool(rows))
    }

    /// Whether the page advice waiting for an idle moment ([`Reader::idle`]) is so much that
    /// it should be issued before the next step anyway.
    pub fn idle_overdue(&self, s: &ReadScratch) -> bool {
        s.advice.len() >= ADVISE_BEFORE_STEP
    }

    /// The step's row ids into `s.ids` (on the pool for big steps), each checked to be inside
    /// the row file: per token, the ids of the handle's heads, less the row file's base.
    fn hash(&self, tokens: &[i32], ctx: &[i32], s: &mut ReadScratch) -> Result<()> {
        let n = tokens.len();
        let heads = self.heads.len();
        let k = self.table.meta().ngram_size as usize - 1;
        s.ids.clear();
        s.ids.resize(n * heads, 0);
        let total_rows = self.table.meta().total_rows;
        let hash_chunk = |(ids, (toks, ctx)): (&mut [u64], (&[i32], &[i32]))| -> Result<()> {
            self.hasher
                .ids_for_heads(toks, ctx, self.heads, &self.head_starts, ids);
            gather::check_ids(ids, total_rows)
        };
        if n >= PARALLEL_HASH_MIN_TOKENS && self.pool().current_num_threads() > 1 {
            const CH: usize = 64;
            self.pool().install(|| {
                s.ids
                    .par_chunks_mut(CH * heads)
                    .zip(tokens.par_chunks(CH).zip(ctx.par_chunks(CH * k)))
                    .try_for_each(hash_chunk)
            })?;
        } else {
            hash_chunk((&mut s.ids[..], (tokens, ctx)))?;
        }
        Ok(())
    }

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
    fn gather_mmap(
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
        let rb = self.table.row_bytes();
        if !self.cold_read_applies(s.ids.len()) {
            return Ok(false);
        }
        match &self.cold {
            ColdRead::Direct(d) => {
                // the rows' sectors read into the slot, all in flight; their pages are advised
                // when the worker is next idle (`advise_pending`)
                let r = lock(d).read_rows(&s.ids, staging)?;
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
                lock(u).read_rows(&s.ids, rb, staging)?;
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

    /// DIRECT mode's read of the step's rows (`s.ids`, hashed at `t1`) into its slot.
    fn read_direct(
        &self,
        d: &Mutex<DirectReader>,
        s: &mut ReadScratch,
        staging: &mut [u8],
        mut rec: StepRecord,
        t1: Instant,
    ) -> Result<StepRecord> {
        let r = if let Some(c) = &self.cache {
            // the row cache in front of the direct reads: only the rows it misses are read
            let (r, hits) = cache::read_through(
                c,
                &s.ids,
                staging,
                &mut s.read_through,
                cache::Lookups::Measured(self.pool(), &self.placement),
                |m, o| lock(d).read_rows(m, o),
            )?;
            rec.cache_hits = hits;
            rec.cache_misses = s.ids.len() as u64 - hits;
            r.unwrap_or_default()
        } else {
            lock(d).read_rows(&s.ids, staging)?
        };
        rec.storage_reads = r.reads;
        rec.io.read_bytes += r.bytes;
        s.count_pages_later = true;
        rec.gather_ns = stats::ns(t1.elapsed());
        Ok(rec)
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

    /// MMAP with a residency cap: marks the pages of `ids` used and, over the cap, has the
    /// least recently used chunks dropped — by the trim thread once [`Reader::run_trim`] runs
    /// (past the cap's margin this waits for it), else here. Every row of a step is marked,
    /// also those a row cache or a direct cold read served without touching the page cache:
    /// the count errs high, never low. A failed drop is logged: the rows are unaffected.
    pub(super) fn keep_resident_within_cap(&self, ids: &[u64], stats: &Stats) {
        if let Some(t) = &self.residency {
            use std::os::fd::AsRawFd;
            let fd = self.table.file().as_raw_fd();
            t.mark(ids, self.table.row_bytes(), self.table.bytes(), fd, stats);
        }
    }

    /// Whether the reader has a residency cap (and so wants a trim thread).
    pub(super) fn has_residency_cap(&self) -> bool {
        self.residency.is_some()
    }

    /// Whether a `ple-trim` thread runs [`Reader::run_trim`]: set before it is spawned, cleared
    /// if that failed. While set, reading threads leave trims to it.
    pub(super) fn set_trim_thread(&self, running: bool) {
        if let Some(t) = &self.residency {
            t.set_started(running);
        }
    }

    /// The body of the `ple-trim` thread (`step::trim`): returns after [`Reader::stop_trim`].
    pub(super) fn run_trim(&self, stats: &Stats) {
        if let Some(t) = &self.residency {
            use std::os::fd::AsRawFd;
            t.run(self.table.bytes(), self.table.file().as_raw_fd(), stats);
        }
    }

    /// Stops the trim thread (it returns after the chunk it is dropping); no trim runs after
    /// it (the handle is closing).
    pub(super) fn stop_trim(&self) {
        if let Some(t) = &self.residency {
            t.stop();
        }
    }

    /// What the residency cap's trims have done (None: no cap).
    #[cfg(test)]
    pub(crate) fn trim_counts(&self) -> Option<super::trim::TrimCounts> {
        self.residency.as_ref().map(|t| t.counts())
    }
}

/// Fails with `Error::State` once `cancelled()` (the handle is closing).
fn check_cancelled(cancelled: &dyn Fn() -> bool) -> Result<()> {
    if cancelled() {
        Err(Error::State(
            "the handle was closed while the step ran".into(),
        ))
    } else {
        Ok(())
    }
}

/// MMAP: a step's page-advice decision ([`Reader::advice_decision`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Advice {
    No,
    /// Advise, the pages sampled cached (ALWAYS): WILLNEED, then the gather from memory.
    Cached,
    /// Advise, the pages not cached (or not sampled).
    Cold,
}

/// Buffers a [`Reader`] keeps between steps (one per thread that reads steps).
#[derive(Default)]
pub struct ReadScratch {
    ids: Vec<u64>,
    pages_builder: PageSetBuilder,
    pages: PageSet,
    /// The last step's distinct pages are still to be counted (from `ids`).
    count_pages_later: bool,
    /// The last step took page advice or major faults (its rows were not all cached).
    storage_recently: bool,
    /// DIRECT mode with a row cache: the misses' buffers.
    read_through: cache::ReadThroughScratch,
    /// MMAP: page ranges of rows read directly, to advise WILLNEED when the worker is idle.
    advice: Vec<advice::PageRange>,
}

/// Most page ranges waiting to be advised (beyond it the advice is dropped: those rows are read
/// directly again the next time).
const MAX_PENDING_ADVICE: usize = 1 << 16;
/// Page ranges waiting to be advised that make the worker advise them before its next step even
/// though it has not been idle (steps submitted back to back): about 1 ms of advice, so the page
/// cache still warms under steady load.
const ADVISE_BEFORE_STEP: usize = 512;

/// The I/O mode a handle runs with (AUTO resolved) and how its reads are issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoInfo {
    /// `IoMode::Mmap` or `IoMode::Direct`.
    pub mode: IoMode,
    /// DIRECT's backend; None in MMAP mode.
    pub backend: Option<Backend>,
    /// Bytes of the row cache (`cache_bytes`, AUTO resolved; 0: none).
    pub cache_bytes: u64,
}

/// MMAP mode's cold read: how a small step whose pages are not cached reads its rows (see
/// [`ColdReads`]).
pub(super) enum ColdRead {
    Direct(Mutex<DirectReader>),
    Buffered(Mutex<BufferedReader>),
    /// WILLNEED and the gather (also DIRECT mode and PREFETCH_NEVER, which have no use for one).
    None,
}

impl ColdRead {
    /// The cold read `opts.cold_reads` asks for, falling back where the kernel refuses it:
    /// sector reads need `O_DIRECT` and io_uring (never a pread pool), buffered reads io_uring.
    fn open(table: &Table, opts: &OpenOptions, direct_mode: bool) -> ColdRead {
        if direct_mode || opts.prefetch_policy == PrefetchPolicy::Never {
            return ColdRead::None;
        }
        if opts.cold_reads == ColdReads::Direct {
            match DirectReader::open_uring_only(table.rows_path(), table.row_bytes()) {
                Ok(d) => return ColdRead::Direct(Mutex::new(d)),
                Err(e) => log::info!("MMAP cold reads: buffered ({e})"),
            }
        }
        if opts.cold_reads != ColdReads::Willneed {
            if let Some(u) = BufferedReader::open(table.rows_path()) {
                return ColdRead::Buffered(Mutex::new(u));
            }
        }
        ColdRead::None
    }
}

/// Opens the DIRECT reader `opts.io_mode` asks for: MMAP → none; DIRECT → the reader or its
/// error (`Unsupported` on tmpfs); AUTO → the reader when the row file is larger than the
/// machine's memory and direct I/O works on it, else none. Without the SIGBUS handler
/// (`opts.sigbus_handler` false) only DIRECT can read: AUTO opens it, MMAP is `Unsupported`.
fn open_direct(table: &Table, opts: &OpenOptions) -> Result<Option<DirectReader>> {
    let open = || DirectReader::open(table.rows_path(), table.row_bytes(), opts.force_pread);
    if !opts.sigbus_handler {
        const WHY: &str = "options.sigbus_handler is 0, and only DIRECT mode reads rows without \
                           libple's SIGBUS handler (MMAP copies them from the mapping)";
        return match opts.io_mode {
            IoMode::Mmap => Err(Error::Unsupported(format!(
                "io_mode MMAP: {WHY}; open with io_mode DIRECT or AUTO, or allow the handler"
            ))),
            IoMode::Direct | IoMode::Auto => match open() {
                Ok(r) => Ok(Some(r)),
                Err(Error::Unsupported(m)) => Err(Error::Unsupported(format!("{m}; {WHY}"))),
                Err(e) => Err(e),
            },
        };
    }
    match opts.io_mode {
        IoMode::Mmap => Ok(None),
        IoMode::Direct => open().map(Some),
        IoMode::Auto => {
            let mem = stats::mem_total_bytes();
            if mem == 0 || (table.bytes().len() as u64) <= mem {
                return Ok(None);
            }
            match open() {
                Ok(r) => Ok(Some(r)),
                Err(e) => {
                    log::info!("AUTO io mode: MMAP ({e})");
                    Ok(None)
                }
            }
        }
    }
}

/// The handle's gather pool of `num_threads` threads (0: one per CPU); their join handles go to
/// `handles` (joined by `Drop`).
fn start_pool(
    num_threads: u32,
    handles: Arc<Mutex<Vec<JoinHandle<()>>>>,
) -> Result<rayon::ThreadPool> {
    let threads = match num_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("ple-pool-{i}"))
        .start_handler(|_| {
            stats::thread_read_bytes_delta();
        })
        .exit_handler(|_| stats::close_thread_io())
        .spawn_handler(move |t| {
            let mut b = std::thread::Builder::new();
            if let Some(name) = t.name() {
                b = b.name(name.to_owned());
            }
            if let Some(size) = t.stack_size() {
                b = b.stack_size(size);
            }
            lock(&handles).push(b.spawn(|| t.run())?);
            Ok(())
        })
        .build()
        .map_err(|e| Error::io("starting the gather pool", std::io::Error::other(e)))
}

/// The heads a handle opened as `shard` serves and where each head's rows start in the row file:
/// a whole table serves any shard; a shard table only the shard it holds, else `Error::Format`
/// naming both.
fn shard_rows(table: &Table, shard: Shard) -> Result<(Heads, Vec<u64>)> {
    let m = table.meta();
    let heads = shard.heads(m.num_heads as usize);
    match &m.shard {
        None => Ok((heads, heads.iter().map(|h| m.hash.offsets[h]).collect())),
        Some(s) if s.shard() == shard => {
            // the file holds the heads' ranges one after another
            let starts = s
                .row_ranges
                .iter()
                .scan(0u64, |next, r| {
                    let start = *next;
                    *next += r[1] - r[0];
                    Some(start)
                })
                .collect();
            Ok((heads, starts))
        }
        Some(s) => Err(Error::Format(format!(
            "table {} holds {} (heads {}), but the handle was opened as {}: open it with \
             shard_count {} and shard_index {}, or open the whole table",
            table.dir().display(),
            s.shard().describe(),
            s.shard().heads(m.num_heads as usize).describe(),
            shard.describe(),
            s.count,
            s.index
        ))),
    }
}

#[cfg(test)]
mod tests;
