//! The step pipeline: submit → (worker) hash, prefetch, gather, copy → done = seq → wait
//! (`docs/FORMAT.md#the-cpu-gpu-handshake`).
//!
//! # GPU mode (`cuda_device >= 0`)
//! `open` creates a [`GpuSide`] (no driver: `Error::CudaUnavailable`, before any thread starts;
//! with `cuda_device = -1` nothing CUDA is touched). Then:
//! - ring slot of step `seq` is exactly `seq % max_in_flight` (`GpuSide::slot_of`, which the
//!   device kernels use); if that slot still holds an unconsumed step, `ring_full_policy` applies
//!   even when other slots are free. The CPU-only ring keeps its policy (next free slot in ring
//!   order), so sparse seqs still use every slot there.
//! - the worker first waits until no kernel still reads the slot (`GpuSide::begin_step`), then
//!   gathers into the GPU side's pinned, device-mapped staging (no CPU staging is allocated),
//!   then `GpuSide::upload` (timed as `copy_ns`: the H2D copy in host-wait mode, nothing but the
//!   handshake in device-wait modes, where the kernel reads the staging) before publishing
//!   `done`; a failed step is published to the device with `GpuSide::publish_failed` (never
//!   blocks, called without the ring's lock) so device waiters are released.
//! - `dequant_fuse` claims the step (Pending or Ready → Consuming), calls `GpuSide::fuse` (host
//!   wait = `wait(seq, 0)`) and frees the slot on success; the GPU side keeps the kernel's event
//!   so the slot's rows (staging or device rows) are not overwritten before the kernel read them.
//! - CUDA Graph mode (`graph_prepare`, `step/gpu.rs`): a Ready step `s >= base` counts as
//!   consumed, its slot free, once `GpuSide::consumed_seq() >= s`; parked submitters poll for
//!   that every `GRAPH_POLL`. Re-preparing first frees the Ready steps replays consumed under the
//!   previous base (`Pipeline::rebase_graph`).
//! - host views (`packed_rows`, `dequant_cpu`, `release_step`) work as on the CPU, on the
//!   pinned staging.
//!
//! The host-side logic of GPU mode (the `seq % slots` ring, graph reclaim, lock scope, wait
//! semantics) is tested on the CPU; the device side by `ffi-tests/gpu/device-check.sh`.

use crate::dequant::gpu::{GpuConfig, GpuSide};
use crate::error::{Error, Result};
use crate::format::table::Table;
use crate::format::table::TableInfo;
use crate::io::cache::RowCache;
use crate::lookup::context::Batch;
use crate::lookup::context::{Tracker, resolve_contexts_checked, validate_batch};
use crate::lookup::hash::Hasher;
use crate::shard::Shard;
use crate::stats::Counters;
use crate::stats::{self, Stats};
use crate::step::options::{CACHE_AUTO, IoMode, OpenOptions, RingFullPolicy};
use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::ring::*;
use super::shared::*;
use super::worker::*;

pub(super) struct SubmitState {
    pub(super) tx: Option<mpsc::Sender<Work>>,
    /// The ring's `last_seq`, read here without the ring's lock (both change only in `submit`).
    pub(super) last_seq: u64,
}

/// An open table with its step pipeline (what a `ple_handle` holds).
///
/// Threads: a worker thread (hash → prefetch → gather → publish, one step at a time, in submission
/// order) and a private rayon pool of `num_threads` for the parallel parts (and `dequant_cpu`).
/// `submit` is serialised internally; `wait`, `stats`, `ngram_ids`, `table_info` can be called
/// from any thread. Every submitted step occupies a ring slot until it is consumed by
/// `dequant_cpu`/`dequant_fuse`/`release_step` (a failed step frees its slot at once and keeps
/// only its error, until released).
pub struct Pipeline {
    pub(super) sh: Arc<Shared>,
    pub(super) submit_state: Mutex<SubmitState>,
    pub(super) tracker: Mutex<Tracker>,
    pub(super) worker: Option<JoinHandle<()>>,
    pub(super) pool_threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
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

/// `slots` CPU staging slots of `slot_bytes`, their first pages touched (up to
/// `PRETOUCH_MAX_BYTES` over all slots) so steps do not take first-touch faults.
fn cpu_staging(slots: usize, slot_bytes: usize) -> Result<Vec<Staging>> {
    let mut staging = Vec::with_capacity(slots);
    for _ in 0..slots {
        let mut v = Vec::new();
        v.try_reserve_exact(slot_bytes)
            .map_err(|_| Error::OutOfMemory(format!("staging slot of {slot_bytes} bytes")))?;
        v.resize(slot_bytes, 0u8);
        // touch the pages now (up to PRETOUCH_MAX_BYTES over all slots) so steps do not take
        // first-touch faults
        let touch = slot_bytes.min(PRETOUCH_MAX_BYTES / slots);
        for i in (0..touch).step_by(4096) {
            // SAFETY: in bounds; volatile so the store is not elided.
            unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), 0) };
        }
        staging.push(Staging(UnsafeCell::new(v)));
    }
    Ok(staging)
}

/// The heads a handle opened as `shard` serves and the row file's base (the whole table's row id
/// of its row 0): a whole table serves any shard; a shard table only the shard it holds, else
/// `Error::Format` naming both.
fn shard_rows(table: &Table, shard: Shard) -> Result<(std::ops::Range<usize>, u64)> {
    let heads = shard.heads(table.meta().num_heads as usize);
    match &table.meta().shard {
        None => Ok((heads, 0)),
        Some(s) if s.shard() == shard => Ok((heads, s.first_row)),
        Some(s) => Err(Error::Format(format!(
            "table {} holds {} (heads {}..{}), but the handle was opened as {}: open it with \
             shard_count {} and shard_index {}, or open the whole table",
            table.dir().display(),
            s.shard().describe(),
            s.first_head,
            s.first_head + s.heads,
            shard.describe(),
            s.count,
            s.index
        ))),
    }
}

impl Pipeline {
    /// Opens the table in `dir` and starts the worker and the pool.
    pub fn open(dir: &Path, opts: OpenOptions) -> Result<Pipeline> {
        opts.validate()?;
        let topts = crate::format::table::TableOpenOptions {
            config_json_path: opts.config_json_path.clone(),
            checkpoint_dir: opts.checkpoint_dir.clone(),
        };
        let table = Table::open(dir, &topts)?;
        let hasher = Hasher::new(table.hash_params())?;
        let direct = open_direct(&table, &opts)?.map(Mutex::new);
        let cold = open_cold(&table, &opts, direct.is_some());
        if table.meta().num_heads as usize != crate::model::NUM_HEADS {
            return Err(Error::Unsupported(format!(
                "tables with {} heads",
                table.meta().num_heads
            )));
        }
        let (heads, row_base) = shard_rows(&table, opts.shard)?;
        // Staging is bounded by the memory the machine has, checked before anything is allocated.
        let slot_bytes = opts.check_staging_fits(table.row_bytes(), heads.len())?;
        // The GPU side first (nothing CUDA is touched with cuda_device = -1): a machine without a
        // driver fails here with CudaUnavailable before any thread starts.
        let gpu = if opts.cuda_device >= 0 {
            Some(GpuSide::new(&GpuConfig {
                device: opts.cuda_device,
                wait_mode: opts.wait_mode,
                slots: opts.max_in_flight as usize,
                max_tokens: opts.max_tokens_per_step as usize,
                heads: heads.clone(),
                format: table.format(),
                global_scale: table.global_scale(),
                timeout_us: opts.wait_timeout_us,
            })?)
        } else {
            None
        };
        let pool_threads: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let pool = start_pool(opts.num_threads, pool_threads.clone())?;
        // With a GPU the worker gathers into the GPU side's pinned staging instead.
        let cpu_slots = if gpu.is_some() { 0 } else { opts.max_in_flight };
        let staging = cpu_staging(cpu_slots as usize, slot_bytes)?;
        let n = opts.max_in_flight as usize;
        let cache_bytes = opts.cache_bytes_for(direct.is_some());
        let cache = match cache_bytes {
            0 => None,
            b => match RowCache::new(b, table.row_bytes()) {
                Ok(c) => Some(c),
                // AUTO on a machine with almost no memory free: no cache
                Err(Error::InvalidArgument(_)) if opts.cache_bytes == CACHE_AUTO => None,
                Err(Error::InvalidArgument(m)) => {
                    return Err(Error::InvalidArgument(format!("options.{m}")));
                }
                Err(e) => return Err(e),
            },
        };
        let cache_budget = if cache.is_some() { cache_bytes } else { 0 };
        let ahead =
            super::ahead::Ahead::new(super::ahead::queue_cap(opts.ahead_max_rows, cache.as_ref()));
        // MMAP only: DIRECT reads bypass the page cache
        let residency = (opts.resident_bytes_max > 0 && direct.is_none()).then(|| {
            Mutex::new(crate::io::residency::ResidencyCap::new(
                table.bytes(),
                opts.resident_bytes_max,
            ))
        });
        let tracker = {
            let m = table.meta();
            Tracker::new(m.ngram_size, m.hash.eos_token_id, opts.history_window)?
        };
        let sh = Arc::new(Shared {
            table,
            hasher,
            heads,
            row_base,
            pool: Some(pool),
            staging,
            slot_by_seq: gpu.is_some() || force_slot_by_seq(),
            gpu,
            graph_base: AtomicU64::new(0),
            ring: Mutex::new(Ring {
                slots: vec![SlotState::Free; n],
                failed: VecDeque::new(),
                last_seq: 0,
                next_slot: 0,
                skipped: VecDeque::new(),
            }),
            cv: Condvar::new(),
            waiters: AtomicUsize::new(0),
            done: AtomicU64::new(0),
            last_failed: AtomicU64::new(0),
            accounted: AtomicU64::new(0),
            stats: Stats::default(),
            closing: AtomicBool::new(false),
            cache,
            cache_budget,
            direct,
            cold,
            ahead,
            residency,
            submitted: AtomicU64::new(0),
            opts,
            #[cfg(test)]
            hooks: TestHooks::default(),
        });
        let (tx, rx) = mpsc::channel();
        let wsh = sh.clone();
        let worker = std::thread::Builder::new()
            .name("ple-worker".into())
            .spawn(move || worker_main(wsh, rx))
            .map_err(|e| Error::io("starting the worker thread", e))?;
        Ok(Pipeline {
            sh,
            submit_state: Mutex::new(SubmitState {
                tx: Some(tx),
                last_seq: 0,
            }),
            tracker: Mutex::new(tracker),
            worker: Some(worker),
            pool_threads,
        })
    }

    /// The open table.
    pub fn table(&self) -> &Table {
        &self.sh.table
    }
    /// The options the handle was opened with.
    pub fn options(&self) -> &OpenOptions {
        &self.sh.opts
    }
    /// The handle's gather pool.
    pub fn pool(&self) -> &rayon::ThreadPool {
        self.sh.pool()
    }
    /// The row cache (handles opened with `cache_bytes > 0`).
    pub fn row_cache(&self) -> Option<&RowCache> {
        self.sh.cache.as_ref()
    }
    pub fn ngram_size(&self) -> u32 {
        self.sh.table.meta().ngram_size
    }
    pub fn num_heads(&self) -> usize {
        self.sh.table.meta().num_heads as usize
    }
    /// The heads the handle serves (`options().shard`'s; `0..16` for the whole table): a step's
    /// rows are `[tokens][heads.len()][row_bytes]`.
    pub fn heads(&self) -> std::ops::Range<usize> {
        self.sh.heads.clone()
    }
    /// Highest seq whose step is complete.
    pub fn done(&self) -> u64 {
        self.sh.done.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub(crate) fn hooks(&self) -> &TestHooks {
        &self.sh.hooks
    }

    /// Facts about the table (`ple_table_info`).
    pub fn table_info(&self) -> TableInfo {
        let mut info =
            crate::format::table::table_info(&self.sh.table).with_shard(self.sh.opts.shard);
        if let Some(g) = &self.sh.gpu {
            info.device_wait_supported = g.device_wait_supported();
        }
        info
    }

    /// The I/O mode the handle runs with and its backend.
    pub fn io_info(&self) -> IoInfo {
        let (mode, backend) = match &self.sh.direct {
            Some(d) => (IoMode::Direct, Some(lock(d).backend())),
            None => (IoMode::Mmap, None),
        };
        IoInfo {
            mode,
            backend,
            cache_bytes: self.sh.cache_budget,
        }
    }

    /// The handle's GPU side, if it was opened with `cuda_device >= 0`.
    pub(crate) fn gpu(&self) -> Result<&GpuSide> {
        self.sh.gpu.as_ref().ok_or_else(|| {
            Error::CudaUnavailable("handle opened without a CUDA device (cuda_device = -1)".into())
        })
    }

    /// Enters CUDA Graph mode from step `base_seq` on: under the ring's lock, frees the Ready
    /// steps replays consumed under the previous base (else they would hold their slots forever:
    /// the new base no longer counts them), runs `prepare` (the GPU side's re-base, which may
    /// refuse), and only then records the base.
    pub(crate) fn rebase_graph(
        &self,
        base_seq: u64,
        prepare: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let sh = &*self.sh;
        let mut ring = lock(&sh.ring);
        sh.reclaim_graph_consumed(&mut ring);
        prepare()?;
        sh.graph_base.store(base_seq, Ordering::Release);
        drop(ring);
        sh.notify();
        Ok(())
    }

    /// Cumulative counters without the on-demand fields (no mincore: cheap). Includes every step
    /// complete (`done`) at the call: a step's counters are recorded just after it is published,
    /// so this waits for that (microseconds).
    pub fn counters(&self) -> Counters {
        let sh = &*self.sh;
        let done = sh.done.load(Ordering::Acquire);
        let t0 = Instant::now();
        while sh.accounted.load(Ordering::Acquire) < done && t0.elapsed() < Duration::from_secs(1) {
            std::thread::yield_now();
        }
        let mut c = sh.stats.snapshot();
        if let Some(rc) = &sh.cache {
            c.cache_bytes_used = rc.counters().bytes_used;
        }
        c
    }

    /// Cumulative counters, with page-cache residency of the table and MemAvailable measured now.
    pub fn stats(&self) -> Counters {
        let mut s = self.counters();
        let (resident, total) = stats::residency(self.sh.table.bytes());
        s.resident_pages = resident;
        s.table_pages = total;
        s.mem_available_bytes = stats::mem_available_bytes();
        s
    }

    /// Submits one step (see `ple_submit`): validates, resolves context and updates the tracked
    /// history on the calling thread, takes the next ring slot (waiting or failing per
    /// `ring_full_policy` while it holds an unconsumed step) and hands the step to the worker.
    pub fn submit(&self, b: &Batch, seq: u64) -> Result<()> {
        self.submit_in_order(b, None, seq)
    }

    /// Submits a per-token batch (see `ple_submit_tokens`) grouped by
    /// [`crate::lookup::tokens::group_tokens`]: as [`Pipeline::submit`] of the grouped batch, with
    /// the step's rows staged in the caller's token order.
    pub fn submit_tokens(&self, g: &crate::lookup::tokens::Grouped, seq: u64) -> Result<()> {
        self.submit_in_order(&g.batch(), g.order(), seq)
    }

    /// Validates `b` (at most `max_tokens` tokens) against the table and resolves each token's
    /// context: `b.context` when given (its length checked), else the tracked history as it
    /// stands plus the batch's own earlier tokens; the history is read, never changed. With
    /// `room`, a tracked batch must also fit the history window (a submit, which appends).
    pub(super) fn checked_contexts(
        &self,
        b: &Batch,
        max_tokens: u32,
        room: bool,
    ) -> Result<Vec<i32>> {
        let meta = self.sh.table.meta();
        validate_batch(b, meta.hash.vocab_size, max_tokens)?;
        if let Some(c) = b.context {
            let want = b.request_ids.len() * (meta.ngram_size as usize - 1);
            if c.len() != want {
                return crate::invalid!(
                    "batch.context has {} entries, expected num_requests × (ngram_size - 1) = {want}",
                    c.len()
                );
            }
        }
        let t = lock(&self.tracker);
        if room && b.context.is_none() {
            t.check_room(b)?;
        }
        resolve_contexts_checked(b, Some(&t), meta.hash.eos_token_id, meta.ngram_size)
    }

    /// [`Pipeline::submit`], staging token `order[g]` of the caller from token `g` of `b`.
    pub(super) fn submit_in_order(&self, b: &Batch, order: Option<&[u32]>, seq: u64) -> Result<()> {
        let mut sub = lock(&self.submit_state);
        let sh = &*self.sh;
        let last_seq = sub.last_seq;
        if seq == 0 || seq <= last_seq {
            return Err(Error::State(format!(
                "seq {seq} must be greater than the last submitted seq {last_seq} (and not 0)"
            )));
        }
        let ctx = self.checked_contexts(b, sh.opts.max_tokens_per_step, true)?;
        let prefill = b
            .query_start
            .windows(2)
            .any(|w| (w[1] - w[0]) as usize > stats::DECODE_MAX_SPAN);

        // take a free slot (CPU: the next one in ring order if free; a failed step frees its slot
        // early. GPU: exactly seq % slots, see `Shared::free_slot_for`)
        let mut ring = lock(&sh.ring);
        let free = |r: &Ring| sh.free_slot_for(r, seq);
        if free(&ring).is_none() {
            let oldest = ring.slots.iter().filter_map(|s| s.seq()).min().unwrap_or(0);
            if sh.opts.ring_full_policy == RingFullPolicy::Error {
                return Err(sh.ring_full_error(&ring, seq, oldest));
            }
            let t0 = Instant::now();
            let deadline = t0.checked_add(Duration::from_micros(sh.opts.wait_timeout_us));
            let (r, parked) = sh.park(ring, deadline, |r| free(r).is_some());
            ring = r;
            sh.stats
                .wait_ns
                .fetch_add(stats::ns(t0.elapsed()), Ordering::Relaxed);
            if parked == Parked::Closing {
                return Err(Error::State(
                    "the handle was closed while ple_submit waited for a ring slot".into(),
                ));
            }
            if parked == Parked::TimedOut {
                sh.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(Error::Timeout(format!(
                    "ring full for {} µs: all {} slots hold steps not consumed (oldest {oldest})",
                    sh.opts.wait_timeout_us, sh.opts.max_in_flight
                )));
            }
        }
        let slot = free(&ring).expect("a free slot");
        sh.reclaim_graph_consumed(&mut ring);
        if sub.tx.is_none() {
            return Err(Error::State("the handle is closing".into()));
        }
        ring.slots[slot] = SlotState::Pending {
            seq,
            tokens: b.tokens.len() as u32,
        };
        ring.note_submitted(seq);
        sub.last_seq = seq;
        ring.next_slot = (slot + 1) % ring.slots.len();
        drop(ring);
        // Tracked history changes last, once nothing else can refuse the step.
        if b.context.is_none() {
            if let Err(e) = lock(&self.tracker).commit(b) {
                lock(&self.sh.ring).slots[slot] = SlotState::Free;
                return Err(e);
            }
        }
        let (tokens, ctx) = match order {
            None => (b.tokens.to_vec(), ctx),
            Some(o) => {
                let k = sh.table.meta().ngram_size as usize - 1;
                let scatter = crate::lookup::tokens::scatter_rows;
                (scatter(b.tokens, o, 1), scatter(&ctx, o, k))
            }
        };
        let job = Job {
            seq,
            slot,
            tokens,
            ctx,
            prefill,
            submitted: Instant::now(),
        };
        let tx = sub.tx.as_ref().expect("checked above, under the same lock");
        if tx.send(Work::Step(job)).is_err() {
            // the worker is gone (cannot happen while the handle lives): record the failure
            let mut ring = lock(&sh.ring);
            ring.slots[slot] = SlotState::Free;
            ring.failed
                .push_back((seq, Error::State("the worker thread has stopped".into())));
            return Err(Error::State("the worker thread has stopped".into()));
        }
        sh.submitted.store(seq, Ordering::Release);
        Ok(())
    }

    /// The 16 row ids of each token of `b` into `out` (`num_tokens × 16`), without side effects:
    /// tracked history is read, not changed.
    pub fn ngram_ids(&self, b: &Batch, out: &mut [i64]) -> Result<()> {
        let meta = self.sh.table.meta();
        validate_batch(b, meta.hash.vocab_size, u32::MAX)?;
        let heads = self.num_heads();
        if out.len() != b.tokens.len() * heads {
            return crate::invalid!(
                "out_ids holds {} ids, {} tokens need {}",
                out.len(),
                b.tokens.len(),
                b.tokens.len() * heads
            );
        }
        let k = meta.ngram_size as usize - 1;
        if let Some(c) = b.context {
            if c.len() != b.request_ids.len() * k {
                return crate::invalid!(
                    "batch.context has {} entries, expected {}",
                    c.len(),
                    b.request_ids.len() * k
                );
            }
        }
        let ctx = {
            let t = lock(&self.tracker);
            resolve_contexts_checked(b, Some(&t), meta.hash.eos_token_id, meta.ngram_size)?
        };
        let mut ids = vec![0u64; heads];
        for (i, &t) in b.tokens.iter().enumerate() {
            self.sh.hasher.ids(t, &ctx[i * k..(i + 1) * k], &mut ids);
            for (o, &v) in out[i * heads..(i + 1) * heads].iter_mut().zip(&ids) {
                *o = v as i64;
            }
        }
        Ok(())
    }

    /// Forgets a request's tracked history (unknown ids are fine).
    pub fn release_request(&self, id: u64) {
        lock(&self.tracker).release(id);
    }

    /// Runs `f` on the worker thread, after the steps submitted before it, and returns its result
    /// (for benchmarks: a gather timed there runs on the same thread, CPU and caches as the
    /// steps' gathers, so comparing the two measures the pipeline and not thread placement).
    pub fn run_on_worker<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Table, &rayon::ThreadPool) -> R + Send + 'static,
    ) -> Result<R> {
        let (rtx, rrx) = mpsc::channel();
        {
            let sub = lock(&self.submit_state);
            let Some(tx) = sub.tx.as_ref() else {
                return Err(Error::State("the handle is closing".into()));
            };
            let work = Work::Run(Box::new(move |t: &Table, p: &rayon::ThreadPool| {
                let _ = rtx.send(f(t, p));
            }));
            if tx.send(work).is_err() {
                return Err(Error::State("the worker thread has stopped".into()));
            }
        }
        rrx.recv()
            .map_err(|_| Error::Panic("the closure run on the worker thread panicked".into()))
    }

    /// Marks the handle as closing (from `ple_close`): queued steps are abandoned, waiters wake
    /// and calls that still hold the handle get `Error::State`. The worker is joined when the last
    /// reference is dropped.
    pub fn shutdown(&self) {
        self.sh.closing.store(true, Ordering::SeqCst);
        if let Some(g) = &self.sh.gpu {
            g.begin_close(); // device waits and the worker's slot waits stop now
        }
        self.sh.ahead.stop();
        let _ring = lock(&self.sh.ring);
        self.sh.cv.notify_all();
    }
}

impl Drop for Pipeline {
    /// Stops the worker after the step it is running (queued steps are abandoned) and joins it,
    /// then drops the pool and joins its threads. A worker that does not stop within
    /// [`reaper::CLOSE_WAIT`] (a read stalled on the device) is joined by a reaper thread instead,
    /// which then frees the rest (see `reaper`): the drop returns within about 30 ms.
    fn drop(&mut self) {
        self.sh.closing.store(true, Ordering::SeqCst);
        if let Some(g) = &self.sh.gpu {
            g.begin_close();
        }
        lock(&self.submit_state).tx = None;
        self.sh.ahead.stop();
        let ahead = lock(&self.sh.ahead.thread).take();
        // both hold a reference to `sh`: the pool is released only after both returned
        let mut threads = [self.worker.take(), ahead];
        if !super::reaper::join_within(&mut threads) {
            let mut sh = self.sh.clone();
            let pool_threads = self.pool_threads.clone();
            super::reaper::hand_over(move || {
                for t in threads.into_iter().flatten() {
                    let _ = t.join();
                }
                // the closing Pipeline drops its reference right after handing this over
                for _ in 0..10_000 {
                    if Arc::strong_count(&sh) == 1 {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                release_pool(&mut sh, &pool_threads);
            });
            return;
        }
        release_pool(&mut self.sh, &self.pool_threads);
    }
}

/// Drops the gather pool and joins its threads, once `sh` is the last reference to the shared
/// state (the worker has returned).
fn release_pool(sh: &mut Arc<Shared>, pool_threads: &Mutex<Vec<JoinHandle<()>>>) {
    if let Some(sh) = Arc::get_mut(sh) {
        drop(sh.pool.take());
        let handles = std::mem::take(&mut *lock(pool_threads));
        for h in handles {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

#[cfg(test)]
#[path = "gpu_tests.rs"]
mod gpu_tests;
