//! The read engine of a handle: [`Reader`] turns a step's tokens into its rows in a buffer —
//! hashing (on the pool for big steps), then in MMAP mode the page-advice decision, the cold
//! read or the gather from the mapping (through the row cache when there is one), in DIRECT mode
//! the direct reads (behind the row cache). One call, [`Reader::read_step`]; no ring, no
//! threads of its own beyond the pool: the worker drives it, and so can a benchmark or a test.

use crate::error::{Error, Result};
use crate::format::table::Table;
use crate::io::cache::{self, RowCache};
use crate::io::direct::DirectReader;
use crate::io::mmap::advice::{self, PageSet, PageSetBuilder};
use crate::io::mmap::gather;
use crate::io::source::{Cached, RowSource};
use crate::lookup::hash::Hasher;
use crate::shard::{Heads, Shard};
use crate::stats::{self, Stats, StepRecord};
use crate::step::options::{IoMode, OpenOptions, PrefetchPolicy};
use crate::step::plan::{AheadSource, ColdRead, IoInfo, IoPlan};
use crate::sync::lock;
use rayon::prelude::*;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

mod mmap;
mod pool;
use mmap::ADVISE_BEFORE_STEP;

/// Steps with at least this many tokens are hashed in parallel on the pool.
const PARALLEL_HASH_MIN_TOKENS: usize = 1024;

/// A handle's read engine: the table, its hasher, the gather pool, the row cache and the
/// direct and cold readers (see the module doc).
pub struct Reader {
    pub(super) table: Arc<Table>,
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
    pub(super) cache: Option<Arc<RowCache>>,
    /// DIRECT with a cache: where a big step's lookups run (measured).
    placement: cache::Placement,
    /// The plan's `cache_bytes` (AUTO resolved); 0 once [`Reader::open_cache`] made none.
    cache_budget: u64,
    /// Whether `cache_budget` came from AUTO.
    cache_auto: bool,
    /// DIRECT mode's reader (None: MMAP mode). The lock is uncontended (one reading thread).
    pub(super) direct: Option<Mutex<DirectReader>>,
    /// MMAP mode: how steps of at most `COLD_READ_MAX_ROWS` rows whose pages are not cached
    /// read their rows.
    cold: ColdRead,
    /// MMAP with `resident_bytes_max`: the table's residency cap and its trim thread's state.
    pub(super) residency: Option<Arc<super::trim::Trim>>,
    /// The backend read-ahead's thread opens.
    pub(super) ahead_source: AheadSource,
}

impl Reader {
    /// The reader of `table` for `opts` (`io_mode`, `cold_reads`, `cache_bytes`,
    /// `resident_bytes_max`, `shard`, `prefetch_*`, `num_threads`): the I/O plan is resolved
    /// here ([`IoPlan::resolve`]). Starts no thread and creates no row cache: call
    /// [`Reader::start_pool`] and [`Reader::open_cache`] before reading.
    pub fn open(table: Table, opts: &OpenOptions) -> Result<Reader> {
        let hasher = Hasher::new(table.hash_params())?;
        let plan = IoPlan::resolve(&table, opts)?;
        let (heads, head_starts) = shard_rows(&table, opts.shard)?;
        Ok(Reader {
            table: Arc::new(table),
            hasher,
            heads,
            head_starts,
            prefetch_policy: opts.prefetch_policy,
            prefetch_min_rows: opts.prefetch_min_rows,
            num_threads: opts.num_threads,
            pool: None,
            pool_threads: Arc::default(),
            cache: None,
            cache_budget: plan.cache_bytes,
            cache_auto: plan.cache_auto,
            placement: cache::Placement::default(),
            direct: plan.direct.map(Mutex::new),
            cold: plan.cold,
            residency: plan.residency.map(|c| Arc::new(super::trim::Trim::new(c))),
            ahead_source: plan.ahead,
        })
    }

    /// Creates the row cache of the plan's `cache_bytes` (AUTO resolved for the I/O mode; AUTO
    /// with almost no memory free: none).
    pub fn open_cache(&mut self) -> Result<()> {
        self.cache = match self.cache_budget {
            0 => None,
            b => match RowCache::new(b, self.table.row_bytes()) {
                Ok(c) => Some(Arc::new(c)),
                // AUTO on a machine with almost no memory free: no cache
                Err(Error::InvalidArgument(_)) if self.cache_auto => None,
                Err(Error::InvalidArgument(m)) => {
                    return Err(Error::InvalidArgument(format!("options.{m}")));
                }
                Err(e) => return Err(e),
            },
        };
        if self.cache.is_none() {
            self.cache_budget = 0;
        }
        Ok(())
    }

    /// Starts the gather pool of `num_threads` threads (0: one per CPU).
    pub fn start_pool(&mut self) -> Result<()> {
        self.pool = Some(pool::start_pool(
            self.num_threads,
            self.pool_threads.clone(),
        )?);
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

    /// DIRECT mode's read of the step's rows (`s.ids`, hashed at `t1`) into its slot.
    fn read_direct(
        &self,
        d: &Mutex<DirectReader>,
        s: &mut ReadScratch,
        staging: &mut [u8],
        mut rec: StepRecord,
        t1: Instant,
    ) -> Result<StepRecord> {
        let mut d = lock(d);
        let r = match &self.cache {
            // the row cache in front of the direct reads: only the rows it misses are read
            Some(c) => {
                let lookups = cache::Lookups::Measured(self.pool(), &self.placement);
                Cached::new(c, &mut *d, &mut s.read_through, lookups).read(&s.ids, staging)?
            }
            None => d.read(&s.ids, staging)?,
        };
        if self.cache.is_some() {
            rec.cache_hits = r.hits;
            rec.cache_misses = s.ids.len() as u64 - r.hits;
        }
        rec.storage_reads = r.reads;
        rec.io.read_bytes += r.bytes;
        s.count_pages_later = true;
        rec.gather_ns = stats::ns(t1.elapsed());
        Ok(rec)
    }

    /// MMAP with a residency cap: marks the pages of `ids` used and, over the cap, has the
    /// least recently used chunks dropped — by the trim thread once [`Reader::run_trim`] runs
    /// (past the cap's margin this waits for it), else here. Every row of a step is marked,
    /// also those a row cache or a direct cold read served without touching the page cache:
    /// the count errs high, never low. A failed drop is logged: the rows are unaffected.
    fn keep_resident_within_cap(&self, ids: &[u64], stats: &Stats) {
        super::trim::keep_within(self.residency.as_deref(), &self.table, ids, stats);
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
pub(super) fn check_cancelled(cancelled: &dyn Fn() -> bool) -> Result<()> {
    if cancelled() {
        Err(Error::State(
            "the handle was closed while the step ran".into(),
        ))
    } else {
        Ok(())
    }
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

/// The heads a handle opened as `shard` serves and where each head's rows start in the row file:
/// a whole table serves any shard; a shard table only the shard it holds, else `Error::Format`
/// naming both.
fn shard_rows(table: &Table, shard: Shard) -> Result<(Heads, Vec<u64>)> {
    let m = table.meta();
    if shard.count > m.num_heads {
        return crate::invalid!(
            "shard_count {} is more than the table's {} heads (at most one shard per head)",
            shard.count,
            m.num_heads
        );
    }
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
