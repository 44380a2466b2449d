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
//! - CUDA Graph mode (`graph_prepare`, `step/consume.rs`): a Ready step `s >= base` counts as
//!   consumed, its slot free, once `GpuSide::consumed_seq() >= s`; parked submitters poll for
//!   that every `GRAPH_POLL`. Re-preparing first frees the Ready steps replays consumed under the
//!   previous base (`Pipeline::rebase_graph`).
//! - host views (`packed_rows`, `dequant_cpu`, `release_step`) work as on the CPU, on the
//!   pinned staging.
//!
//! The host-side logic of GPU mode (the `seq % slots` ring, graph reclaim, lock scope, wait
//! semantics) is tested on the CPU; the device side by `ffi-tests/gpu/device-check.sh`.

use super::ahead::{Ahead, queue_cap};
use super::plan::IoInfo;
use super::reader::Reader;
use super::ring::Completion;
use super::shared::{Shared, cpu_staging, force_slot_by_seq, replays};
use super::worker::{Job, StepInput, Work, worker_main};
use crate::dequant::gpu::{GpuConfig, GpuSide};
use crate::error::{Error, Result};
use crate::format::table::Table;
use crate::format::table::TableInfo;
use crate::io::cache::RowCache;
use crate::lookup::context::Batch;
use crate::lookup::context::{Tracker, resolve_contexts_checked, validate_batch};
use crate::stats;
use crate::stats::Counters;
use crate::step::options::OpenOptions;
use crate::sync::lock;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// What the worker and the consumers share.
    pub(super) sh: Arc<Shared>,
    pub(super) opts: OpenOptions,
    /// Read-ahead's queue and reader thread (`ahead.rs`).
    pub(super) ahead: Arc<Ahead>,
    pub(super) submit_state: Mutex<SubmitState>,
    pub(super) tracker: Mutex<Tracker>,
    pub(super) worker: Option<JoinHandle<()>>,
    /// The residency cap's `ple-trim` thread (`step::trim`; MMAP with `resident_bytes_max`).
    pub(super) trim: Option<JoinHandle<()>>,
}

impl Pipeline {
    /// Opens the table in `dir` and starts the worker and the pool.
    pub fn open(dir: &Path, opts: OpenOptions) -> Result<Pipeline> {
        opts.validate()?;
        let topts = crate::format::table::TableOpenOptions {
            config_json_path: opts.config_json_path.clone(),
            checkpoint_dir: opts.checkpoint_dir.clone(),
        };
        let mut reader = Reader::open(Table::open(dir, &topts)?, &opts)?;
        let table = &reader.table;
        let heads = reader.heads;
        // Staging is bounded by the memory the machine has, checked before anything is allocated.
        let slot_bytes = opts.check_staging_fits(table.row_bytes(), heads.len())?;
        // The GPU side first (nothing CUDA is touched with cuda_device = -1): a machine without a
        // driver fails here with CudaUnavailable before any thread starts.
        let gpu = if opts.cuda_device >= 0 {
            Some(Arc::new(GpuSide::new(&GpuConfig {
                device: opts.cuda_device,
                wait_mode: opts.wait_mode,
                slots: opts.max_in_flight as usize,
                max_tokens: opts.max_tokens_per_step as usize,
                heads,
                spec: table.row_spec(),
                timeout_us: opts.wait_timeout_us,
            })?))
        } else {
            None
        };
        reader.start_pool()?;
        // With a GPU the worker gathers into the GPU side's pinned staging instead.
        let cpu_slots = if gpu.is_some() { 0 } else { opts.max_in_flight };
        let staging = cpu_staging(cpu_slots as usize, slot_bytes)?;
        reader.open_cache()?;
        let nowhere = reader.direct.is_some() && reader.cache.is_none();
        let ahead = Ahead::new(
            queue_cap(opts.ahead_max_rows, reader.cache.as_deref()),
            nowhere,
        );
        let tracker = {
            let m = reader.table.meta();
            Tracker::new(m.ngram_size, m.hash.eos_token_id, opts.history_window)?
        };
        #[cfg(test)]
        let hooks = super::shared::TestHooks::default();
        #[cfg(test)]
        let stand_in = Some(hooks.graph_consumed.clone());
        #[cfg(not(test))]
        let stand_in = None;
        let completion = Completion::new(
            opts.max_in_flight as usize,
            gpu.is_some() || force_slot_by_seq(),
            replays(gpu.as_ref(), stand_in),
            gpu.is_some(),
        );
        let sh = Arc::new(Shared {
            completion,
            reader,
            staging,
            gpu,
            accounted: AtomicU64::new(0),
            stats: Arc::default(),
            #[cfg(test)]
            hooks,
        });
        let (tx, rx) = mpsc::channel();
        let wsh = sh.clone();
        let worker = std::thread::Builder::new()
            .name("ple-worker".into())
            .spawn(move || worker_main(wsh, rx))
            .map_err(|e| Error::io("starting the worker thread", e))?;
        let trim = start_trim(&sh);
        Ok(Pipeline {
            sh,
            opts,
            ahead: Arc::new(ahead),
            submit_state: Mutex::new(SubmitState {
                tx: Some(tx),
                last_seq: 0,
            }),
            tracker: Mutex::new(tracker),
            worker: Some(worker),
            trim,
        })
    }

    /// The open table.
    pub fn table(&self) -> &Table {
        &self.sh.reader.table
    }
    /// The options the handle was opened with.
    pub fn options(&self) -> &OpenOptions {
        &self.opts
    }
    /// The handle's gather pool.
    pub fn pool(&self) -> &rayon::ThreadPool {
        self.sh.reader.pool()
    }
    /// The row cache (handles opened with `cache_bytes > 0`).
    pub fn row_cache(&self) -> Option<&RowCache> {
        self.sh.reader.cache.as_deref()
    }
    pub fn ngram_size(&self) -> u32 {
        self.sh.reader.table.meta().ngram_size
    }
    pub fn num_heads(&self) -> usize {
        self.sh.reader.table.meta().num_heads as usize
    }
    /// The heads the handle serves (`options().shard`'s; all 16 for the whole table): a step's
    /// rows are `[tokens][heads.len()][row_bytes]`.
    pub fn heads(&self) -> crate::shard::Heads {
        self.sh.reader.heads
    }
    /// Highest seq whose step is complete.
    pub fn done(&self) -> u64 {
        self.sh.completion.done()
    }

    #[cfg(test)]
    pub(crate) fn hooks(&self) -> &super::shared::TestHooks {
        &self.sh.hooks
    }

    /// Facts about the table (`ple_table_info`).
    pub fn table_info(&self) -> TableInfo {
        let mut info =
            crate::format::table::table_info(&self.sh.reader.table).with_shard(self.opts.shard);
        if let Some(g) = &self.sh.gpu {
            info.device_wait_supported = g.device_wait_supported();
        }
        info
    }

    /// The I/O mode the handle runs with and its backend.
    pub fn io_info(&self) -> IoInfo {
        self.sh.reader.io_info()
    }

    /// The handle's GPU side, if it was opened with `cuda_device >= 0`.
    pub(crate) fn gpu(&self) -> Result<&GpuSide> {
        self.sh.gpu.as_deref().ok_or_else(|| {
            Error::CudaUnavailable("handle opened without a CUDA device (cuda_device = -1)".into())
        })
    }

    /// Cumulative counters without the measured fields (no mincore, no /proc read: cheap enough
    /// to read every step; `table_pages` is counted, `resident_pages` and `mem_available_bytes`
    /// are 0). Includes every step complete (`done`) at the call: a step's counters are recorded
    /// just after it is published, so this waits for that (microseconds).
    pub fn counters(&self) -> Counters {
        let sh = &*self.sh;
        let done = sh.completion.done();
        let t0 = Instant::now();
        while sh.accounted.load(Ordering::Acquire) < done && t0.elapsed() < Duration::from_secs(1) {
            std::thread::yield_now();
        }
        let mut c = sh.stats.snapshot();
        if let Some(rc) = &sh.reader.cache {
            c.cache_bytes_used = rc.counters().bytes_used;
        }
        let table = sh.reader.table.bytes().len();
        c.table_pages = table.div_ceil(stats::os_page_size()) as u64;
        c
    }

    /// Cumulative counters, with page-cache residency of the table (a mincore pass over it: time
    /// grows with the table's size) and MemAvailable measured now.
    pub fn stats(&self) -> Counters {
        let mut s = self.counters();
        let (resident, total) = stats::residency(self.sh.reader.table.bytes());
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
        let meta = self.sh.reader.table.meta();
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

    /// Checks `seq` against the last submitted one (under the submit lock `sub`).
    pub(super) fn check_seq(sub: &SubmitState, seq: u64) -> Result<()> {
        let last_seq = sub.last_seq;
        if seq == 0 || seq <= last_seq {
            return Err(Error::State(format!(
                "seq {seq} must be greater than the last submitted seq {last_seq} (and not 0)"
            )));
        }
        Ok(())
    }

    /// [`Pipeline::submit`], staging token `order[g]` of the caller from token `g` of `b`.
    pub(super) fn submit_in_order(&self, b: &Batch, order: Option<&[u32]>, seq: u64) -> Result<()> {
        let mut sub = lock(&self.submit_state);
        let sh = &*self.sh;
        Self::check_seq(&sub, seq)?;
        let ctx = self.checked_contexts(b, self.opts.max_tokens_per_step, true)?;
        let prefill = b
            .query_start
            .windows(2)
            .any(|w| (w[1] - w[0]) as usize > stats::DECODE_MAX_SPAN);
        let input = |ctx: Vec<i32>| match order {
            None => StepInput::Tokens {
                tokens: b.tokens.to_vec(),
                ctx,
            },
            Some(o) => {
                let k = sh.reader.table.meta().ngram_size as usize - 1;
                let scatter = crate::lookup::tokens::scatter_rows;
                StepInput::Tokens {
                    tokens: scatter(b.tokens, o, 1),
                    ctx: scatter(&ctx, o, k),
                }
            }
        };
        let tracked = b.context.is_none().then_some(b);
        self.enqueue(
            &mut sub,
            seq,
            b.tokens.len(),
            || input(ctx),
            prefill,
            tracked,
        )
    }

    /// Takes step `seq`'s ring slot (per `ring_full_policy`), commits the tracked history of
    /// `tracked` (a tracked batch) once nothing else can refuse the step, and hands the step
    /// (`input()`, `num_tokens` tokens) to the worker. `sub` is the held submit lock, `seq`
    /// already checked.
    pub(super) fn enqueue(
        &self,
        sub: &mut SubmitState,
        seq: u64,
        num_tokens: usize,
        input: impl FnOnce() -> StepInput,
        prefill: bool,
        tracked: Option<&Batch>,
    ) -> Result<()> {
        let sh = &*self.sh;
        if sub.tx.is_none() {
            return Err(Error::State("the handle is closing".into()));
        }
        // take a free slot (CPU: the next one in ring order if free; a failed step frees its slot
        // early. GPU: exactly seq % slots)
        let slot = sh.completion.acquire(
            seq,
            num_tokens as u32,
            self.opts.ring_full_policy,
            self.opts.wait_timeout_us,
            &sh.stats,
        )?;
        debug_assert!(sh.gpu.as_ref().is_none_or(|g| g.slot_of(seq) == slot));
        sub.last_seq = seq;
        // Tracked history changes last, once nothing else can refuse the step.
        if let Some(b) = tracked {
            if let Err(e) = lock(&self.tracker).commit(b) {
                sh.completion.cancel(seq, slot, None);
                return Err(e);
            }
        }
        let now = Instant::now();
        let job = Job {
            seq,
            slot,
            num_tokens: num_tokens as u32,
            input: input(),
            prefill,
            submitted: now,
        };
        let tx = sub.tx.as_ref().expect("checked above, under the same lock");
        if tx.send(Work::Step(job)).is_err() {
            // the worker is gone (cannot happen while the handle lives): record the failure
            let stopped = Error::State("the worker thread has stopped".into());
            sh.completion.cancel(seq, slot, Some(stopped));
            return Err(Error::State("the worker thread has stopped".into()));
        }
        sh.completion.gate().set_submitted(seq);
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
        self.sh.completion.close();
        if let Some(g) = &self.sh.gpu {
            g.begin_close(); // device waits and the worker's slot waits stop now
        }
        self.ahead.stop();
        self.sh.reader.stop_trim();
    }
}

/// Starts the residency cap's `ple-trim` thread when the reader has a cap; None without a cap,
/// or when no thread can be started (the reading threads then trim for themselves).
fn start_trim(sh: &Arc<Shared>) -> Option<JoinHandle<()>> {
    if !sh.reader.has_residency_cap() {
        return None;
    }
    // before the spawn: no step may trim on the worker while the thread starts
    sh.reader.set_trim_thread(true);
    let tsh = sh.clone();
    std::thread::Builder::new()
        .name("ple-trim".into())
        .spawn(move || tsh.reader.run_trim(&tsh.stats))
        .map_err(|e| {
            sh.reader.set_trim_thread(false);
            log::warn!("no trim thread (the worker trims itself): {e}");
        })
        .ok()
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod gpu_tests;
