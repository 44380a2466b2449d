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

use crate::dequant::cpu::{self as dequant, OutArgs};
use crate::dequant::gpu::{GpuConfig, GpuSide};
use crate::error::{Error, Result};
use crate::format::table::Table;
use crate::format::table::TableInfo;
use crate::io::cache::{self, RowCache};
use crate::io::direct::{Backend, DirectReader};
use crate::io::gather;
use crate::io::prefetch::{self, PageSet, PageSetBuilder};
use crate::lookup::context::Batch;
use crate::stats::Counters;
use crate::stats::{self, Stats, StepRecord};
use crate::step::options::{IoMode, OpenOptions, PrefetchPolicy, RingFullPolicy};
use rayon::prelude::*;
use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::lookup::context::{Tracker, resolve_contexts_checked, validate_batch};
use crate::lookup::hash::Hasher;

// ---------------------------------------------------------------------------------------------
// The pipeline
// ---------------------------------------------------------------------------------------------

/// How long a waiter spins on `done` before parking on the condition variable.
const WAIT_SPIN: Duration = Duration::from_micros(50);
/// How long the worker spins for the next job before blocking (back-to-back decode steps).
const WORKER_SPIN: Duration = Duration::from_micros(50);
/// Within a spin, pure busy-waiting lasts this long; after it the spinner yields the CPU on each
/// round, so on a machine with fewer free CPUs than spinning threads it does not starve the
/// thread it waits for. The worker waits for the caller's next submit (a microsecond or two
/// after a step is consumed, in a tight loop); a waiter busy-waits through a whole small step
/// (a decode step gathers in about 10 µs): a `sched_yield` while the step completes would add
/// its own latency to the step's.
const WORKER_BUSY_SPIN: Duration = Duration::from_micros(4);
const WAIT_BUSY_SPIN: Duration = Duration::from_micros(20);

/// One round of a spin that started at `start`: busy for `busy`, then yielding.
#[inline]
fn spin_round(start: Instant, i: u32, busy: Duration) {
    if i >= 64 && start.elapsed() > busy {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}
/// Steps with at least this many tokens are hashed in parallel on the pool.
const PARALLEL_HASH_MIN_TOKENS: usize = 1024;
/// Staging bytes (all slots together) touched at open; beyond it pages fault in on first use.
const PRETOUCH_MAX_BYTES: usize = 256 << 20;
/// Failed steps remembered for their waiters (oldest forgotten first).
const MAX_FAILED_RECORDS: usize = 64;
/// Ranges of skipped (never submitted) seqs remembered, so `wait` tells them from consumed steps.
const MAX_SKIPPED_RANGES: usize = 1024;
/// With a GPU, how often a parked submitter re-checks for slots freed by CUDA Graph replays.
const GRAPH_POLL: Duration = Duration::from_micros(200);

/// A closure run on the worker thread between steps, with the table and the pool.
type OnWorker = Box<dyn FnOnce(&Table, &rayon::ThreadPool) + Send>;

/// What the worker thread receives: a step, or a closure to run on the worker thread between
/// steps (benchmarks measure a bare gather there, on the thread and CPU that gathers steps).
enum Work {
    Step(Job),
    Run(OnWorker),
}

/// One step handed to the worker (owns copies of the caller's arrays).
struct Job {
    seq: u64,
    slot: usize,
    tokens: Vec<i32>,
    /// `tokens.len() × (ngram_size - 1)` context ids, ctx1 first.
    ctx: Vec<i32>,
    prefill: bool,
    submitted: Instant,
}

/// State of one ring slot. A slot goes Free → Pending (submit) → Ready (worker published) →
/// [Consuming (dequant running)] → Free (consumed). A failed step goes Pending → Free at once and
/// its error is kept in `Ring::failed`. Only a Free slot is ever given to a new step.
///
/// GPU mode only: `dequant_fuse` may claim a step that is still Pending (device waits enqueue
/// before the step is complete): Pending → Consuming, and the worker's publish then leaves the
/// slot alone (the step stays claimed; a slot already freed or reused is never touched). A Ready
/// step a CUDA Graph replay consumed counts as Free (`Shared::reclaim_graph_consumed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    Pending { seq: u64, tokens: u32 },
    Ready { seq: u64, tokens: u32 },
    Consuming { seq: u64, tokens: u32 },
}

impl SlotState {
    fn seq(self) -> Option<u64> {
        match self {
            SlotState::Free => None,
            SlotState::Pending { seq, .. }
            | SlotState::Ready { seq, .. }
            | SlotState::Consuming { seq, .. } => Some(seq),
        }
    }
}

struct Ring {
    slots: Vec<SlotState>,
    /// Steps that failed and were not yet released: (seq, error).
    failed: VecDeque<(u64, Error)>,
    /// Highest seq submitted (0: none).
    last_seq: u64,
    /// Slot the next step goes into.
    next_slot: usize,
    /// The most recent ranges `[first, last]` of seqs skipped by sparse submits.
    skipped: VecDeque<(u64, u64)>,
}

/// What is known about a seq.
enum StepStatus {
    Pending { rows: u32 },
    Ready { slot: usize, tokens: u32 },
    Consuming,
    Failed(Error),
}

impl Ring {
    /// Frees the slots of Ready steps a CUDA Graph replay consumed: graph mode since `base`
    /// (0: not in graph mode), replays consumed every step up to `consumed`.
    fn reclaim_graph_consumed(&mut self, base: u64, consumed: u64) {
        if base == 0 {
            return;
        }
        for st in self.slots.iter_mut() {
            if let SlotState::Ready { seq, .. } = *st {
                if seq >= base && seq <= consumed {
                    *st = SlotState::Free;
                }
            }
        }
    }

    /// Whether `seq` was submitted and has left the ring (consumed or released) with no failure
    /// record left. (A seq skipped longer ago than the last `MAX_SKIPPED_RANGES` gaps counts as
    /// submitted.)
    fn left_ring(&self, seq: u64) -> bool {
        seq != 0
            && seq <= self.last_seq
            && !self.skipped.iter().any(|&(a, b)| (a..=b).contains(&seq))
            && !self.failed.iter().any(|(s, _)| *s == seq)
            && !self.slots.iter().any(|st| st.seq() == Some(seq))
    }

    /// Records the seqs a submit of `seq` skips (between the last submitted seq and it).
    fn note_submitted(&mut self, seq: u64) {
        if seq > self.last_seq + 1 {
            self.skipped.push_back((self.last_seq + 1, seq - 1));
            if self.skipped.len() > MAX_SKIPPED_RANGES {
                self.skipped.pop_front();
            }
        }
        self.last_seq = seq;
    }

    fn status(&self, seq: u64) -> Result<StepStatus> {
        if seq == 0 || seq > self.last_seq {
            return Err(Error::State(format!(
                "step {seq} was never submitted (last submitted seq is {})",
                self.last_seq
            )));
        }
        if let Some((_, e)) = self.failed.iter().find(|(s, _)| *s == seq) {
            return Ok(StepStatus::Failed(clone_error(e)));
        }
        for (i, st) in self.slots.iter().enumerate() {
            match *st {
                SlotState::Pending { seq: s, tokens } if s == seq => {
                    return Ok(StepStatus::Pending {
                        rows: tokens.saturating_mul(crate::model::NUM_HEADS as u32),
                    });
                }
                SlotState::Ready { seq: s, tokens } if s == seq => {
                    return Ok(StepStatus::Ready { slot: i, tokens });
                }
                SlotState::Consuming { seq: s, .. } if s == seq => {
                    return Ok(StepStatus::Consuming);
                }
                _ => {}
            }
        }
        Err(Error::State(format!(
            "step {seq} is not in the ring: it was already consumed (ple_dequant_* or \
             ple_release_step), or never submitted"
        )))
    }
}

/// A copy of an error (errors are reported to every waiter of a failed step).
fn clone_error(e: &Error) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
        Error::Io { context, source } => Error::Io {
            context: context.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        Error::Format(m) => Error::Format(m.clone()),
        Error::Timeout(m) => Error::Timeout(m.clone()),
        Error::State(m) => Error::State(m.clone()),
        Error::CudaUnavailable(m) => Error::CudaUnavailable(m.clone()),
        Error::Cuda(m) => Error::Cuda(m.clone()),
        Error::Unsupported(m) => Error::Unsupported(m.clone()),
        Error::Panic(m) => Error::Panic(m.clone()),
        Error::OutOfMemory(m) => Error::OutOfMemory(m.clone()),
    }
}

/// A slot's staging buffer `[max_tokens][16][row_bytes]`.
///
/// Access protocol (why the `UnsafeCell` is sound): the worker writes a slot's buffer only while
/// the slot is `Pending` with the worker's job; everyone else reads it only while it is `Ready` or
/// `Consuming`. Transitions happen under the ring mutex, and `done` is published with Release
/// after the writes, so readers see complete rows. A slot is never made `Pending` again before it
/// was consumed (set `Free`).
struct Staging(UnsafeCell<Vec<u8>>);
// SAFETY: see the access protocol above.
unsafe impl Sync for Staging {}

/// Why [`Shared::park`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parked {
    Ready,
    TimedOut,
    Closing,
}

/// Hooks that make a step fail, panic or stall (tests only).
#[cfg(test)]
#[derive(Default)]
pub(crate) struct TestHooks {
    pub fail_seq: AtomicU64,
    pub panic_seq: AtomicU64,
    pub delay_us: AtomicU64,
    /// Failed steps published to the device side (whether or not there is a GPU).
    pub device_failures: AtomicU64,
    /// Whether the ring's lock was free when the last failure was published to the device.
    pub ring_free_at_device_publish: AtomicBool,
    /// CPU handles: stands in for `GpuSide::consumed_seq` (0: no graph replay consumed any).
    pub graph_consumed: AtomicU64,
}

struct Shared {
    table: Table,
    hasher: Hasher,
    opts: OpenOptions,
    /// Taken out only by `Drop` (to join its threads).
    pool: Option<rayon::ThreadPool>,
    /// CPU staging per slot; empty when `gpu` is set (the worker then gathers into the GPU
    /// side's pinned staging, under the same access protocol).
    staging: Vec<Staging>,
    /// The GPU side (handles opened with `cuda_device >= 0`). With it, step `seq` always goes in
    /// ring slot `seq % max_in_flight` (`GpuSide::slot_of`: the device kernels find it that way).
    gpu: Option<GpuSide>,
    /// Step `seq` goes in slot `seq % max_in_flight` (set with a GPU; tests can force it on CPU).
    slot_by_seq: bool,
    /// First step of CUDA Graph mode (0: not prepared). A Ready step `s >= graph_base` counts
    /// as consumed once `gpu.consumed_seq() >= s` (a graph replay consumed it).
    graph_base: AtomicU64,
    ring: Mutex<Ring>,
    /// Signalled when a step is published or a slot freed (only while `waiters > 0`).
    cv: Condvar,
    waiters: AtomicUsize,
    /// Highest seq published (steps complete in submission order).
    done: AtomicU64,
    /// Highest seq that failed (0: none), stored before its `done`: a waiter that sees
    /// `done >= seq > last_failed` knows its step succeeded without taking the ring's lock.
    last_failed: AtomicU64,
    /// Highest seq whose counters are recorded (a few µs after `done`).
    accounted: AtomicU64,
    stats: Stats,
    closing: AtomicBool,
    /// The row cache (`cache_bytes > 0`): steps gather through it (see `run_step`).
    cache: Option<RowCache>,
    /// DIRECT mode's reader (None: MMAP mode). Used by the worker only; the lock is uncontended.
    direct: Option<Mutex<DirectReader>>,
    /// MMAP mode: the io_uring page reads that prefetch steps gathered on the worker thread
    /// (None: io_uring refused, WILLNEED advice instead). Used by the worker only.
    uring_prefetch: Option<Mutex<prefetch::UringPrefetcher>>,
    #[cfg(test)]
    hooks: TestHooks,
}

/// The I/O mode a handle runs with (AUTO resolved) and how its reads are issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoInfo {
    /// `IoMode::Mmap` or `IoMode::Direct`.
    pub mode: IoMode,
    /// DIRECT's backend; None in MMAP mode.
    pub backend: Option<Backend>,
}

/// Opens the DIRECT reader `opts.io_mode` asks for: MMAP → none; DIRECT → the reader or its
/// error (`Unsupported` on tmpfs); AUTO → the reader when the row file is larger than the
/// machine's memory and direct I/O works on it, else none.
fn open_direct(table: &Table, opts: &OpenOptions) -> Result<Option<DirectReader>> {
    let open = || DirectReader::open(table.rows_path(), table.row_bytes(), opts.force_pread);
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

#[cfg(test)]
thread_local! {
    /// Tests: handles opened on this thread use the GPU mode's `seq % slots` ring on the CPU.
    pub(crate) static FORCE_SLOT_BY_SEQ: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn force_slot_by_seq() -> bool {
    #[cfg(test)]
    return FORCE_SLOT_BY_SEQ.with(|f| f.get());
    #[cfg(not(test))]
    false
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn pool(&self) -> &rayon::ThreadPool {
        self.pool
            .as_ref()
            .expect("the pool lives until the handle is dropped")
    }

    fn notify(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }

    /// Parks on the condition variable until `ready(ring)`, the deadline (None: forever) or the
    /// handle closing (`shutdown` sets `closing` and signals under the ring's lock, so a parked
    /// caller cannot miss it). Returns the guard and why it stopped.
    fn park<'a>(
        &'a self,
        mut ring: MutexGuard<'a, Ring>,
        deadline: Option<Instant>,
        ready: impl Fn(&Ring) -> bool,
    ) -> (MutexGuard<'a, Ring>, Parked) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        // With a GPU, graph replays free slots without signalling the condition variable: poll.
        let poll = self.gpu.as_ref().map(|_| GRAPH_POLL);
        let ok = loop {
            if ready(&ring) {
                break Parked::Ready;
            }
            if self.closing.load(Ordering::SeqCst) {
                break Parked::Closing;
            }
            let now = Instant::now();
            let until = match (deadline, poll) {
                (Some(d), _) if now >= d => break Parked::TimedOut,
                (Some(d), Some(p)) => Some((d - now).min(p)),
                (Some(d), None) => Some(d - now),
                (None, p) => p,
            };
            ring = match until {
                None => self.cv.wait(ring).unwrap_or_else(|p| p.into_inner()),
                Some(t) => {
                    self.cv
                        .wait_timeout(ring, t)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        (ring, ok)
    }

    /// Publishes a finished step: its slot becomes Ready (or Free with the error recorded), then
    /// `done = seq` (Release), then waiters are woken. Returns the submit→done time.
    fn publish(&self, job: &Job, result: std::result::Result<(), Error>) -> u64 {
        let mut failure = None;
        if result.is_err() {
            self.publish_failed_to_device(job);
        }
        let mut ring = lock(&self.ring);
        let step_ns = stats::ns(job.submitted.elapsed());
        match result {
            Ok(()) => {
                // (GPU mode: a slot a dequant_fuse claimed, or already freed, is left alone.)
                if let SlotState::Pending { seq, tokens } = ring.slots[job.slot] {
                    if seq == job.seq {
                        ring.slots[job.slot] = SlotState::Ready { seq, tokens };
                    }
                }
            }
            Err(e) => {
                // logged once the ring's lock is released (below)
                failure = Some((self.closing.load(Ordering::Relaxed), e.to_string()));
                self.stats.failed_steps.fetch_add(1, Ordering::Relaxed);
                if ring.slots[job.slot].seq() == Some(job.seq) {
                    ring.slots[job.slot] = SlotState::Free;
                }
                ring.failed.push_back((job.seq, e));
                self.last_failed.fetch_max(job.seq, Ordering::Release);
                while ring.failed.len() > MAX_FAILED_RECORDS {
                    ring.failed.pop_front();
                }
            }
        }
        self.done.store(job.seq, Ordering::Release);
        drop(ring);
        self.notify();
        match failure {
            Some((true, e)) => log::debug!("step {} abandoned: {e}", job.seq),
            Some((false, e)) => log::warn!("step {} failed: {e}", job.seq),
            None => {}
        }
        step_ns
    }

    /// Releases the device waiters of a failed step (its launch raises a device error and fills
    /// its output with NaN). Called without the ring's lock: nothing here may block API calls.
    fn publish_failed_to_device(&self, job: &Job) {
        #[cfg(test)]
        {
            let free = self.ring.try_lock().is_ok();
            self.hooks
                .ring_free_at_device_publish
                .store(free, Ordering::SeqCst);
            self.hooks.device_failures.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(g) = &self.gpu {
            if let Err(ge) = g.publish_failed(job.slot, job.seq, job.tokens.len() as u32) {
                log::warn!("step {}: publishing the failure to the GPU: {ge}", job.seq);
            }
        }
    }

    /// Frees a consumed slot.
    fn free_slot(&self, slot: usize) {
        lock(&self.ring).slots[slot] = SlotState::Free;
        self.notify();
    }

    /// The staging bytes of `slot` (the GPU side's pinned staging when there is one).
    ///
    /// # Safety
    /// Only while the slot is Ready/Consuming (readers) — see [`Staging`].
    unsafe fn staging(&self, slot: usize) -> &[u8] {
        match &self.gpu {
            // SAFETY: `staging(slot)` holds `slot_bytes()` bytes while the GpuSide lives.
            Some(g) => unsafe { std::slice::from_raw_parts(g.staging(slot), g.slot_bytes()) },
            None => unsafe { &*self.staging[slot].0.get() },
        }
    }

    /// The staging bytes of `slot`, for the worker.
    ///
    /// # Safety
    /// Only by the worker, while the slot is Pending with its job — see [`Staging`].
    #[allow(clippy::mut_from_ref)]
    unsafe fn staging_mut(&self, slot: usize) -> &mut [u8] {
        match &self.gpu {
            // SAFETY: as above; nobody else reads or writes the slot while it is Pending.
            Some(g) => unsafe { std::slice::from_raw_parts_mut(g.staging(slot), g.slot_bytes()) },
            None => unsafe { &mut *self.staging[slot].0.get() },
        }
    }

    /// What is known about `seq` (steps a graph replay consumed count as consumed).
    fn status(&self, ring: &mut Ring, seq: u64) -> Result<StepStatus> {
        self.reclaim_graph_consumed(ring);
        ring.status(seq)
    }

    /// The last step a CUDA Graph replay consumed (GPU handles; tests stand it in on the CPU).
    fn graph_consumed_seq(&self) -> Option<u64> {
        #[cfg(test)]
        if self.gpu.is_none() {
            return Some(self.hooks.graph_consumed.load(Ordering::SeqCst));
        }
        self.gpu.as_ref().map(|g| g.consumed_seq())
    }

    /// Whether Ready step `seq` was consumed by a CUDA Graph replay (graph mode only).
    fn graph_consumed(&self, seq: u64) -> bool {
        let base = self.graph_base.load(Ordering::Acquire);
        self.graph_consumed_seq()
            .is_some_and(|c| base != 0 && seq >= base && c >= seq)
    }

    /// Frees the slots of Ready steps a CUDA Graph replay consumed.
    fn reclaim_graph_consumed(&self, ring: &mut Ring) {
        if let Some(c) = self.graph_consumed_seq() {
            ring.reclaim_graph_consumed(self.graph_base.load(Ordering::Acquire), c);
        }
    }

    /// The slot step `seq` may take now, if any: with a GPU exactly `seq % slots` (free, or
    /// holding a step a graph replay consumed); without, the next Free slot in ring order (the
    /// CPU ring keeps its original policy: any free slot, so sparse seqs use the whole ring).
    fn free_slot_for(&self, r: &Ring, seq: u64) -> Option<usize> {
        let n = r.slots.len();
        if self.slot_by_seq {
            let s = (seq % n as u64) as usize;
            debug_assert!(self.gpu.as_ref().is_none_or(|g| g.slot_of(seq) == s));
            match r.slots[s] {
                SlotState::Free => Some(s),
                SlotState::Ready { seq: q, .. } if self.graph_consumed(q) => Some(s),
                _ => None,
            }
        } else {
            (0..n)
                .map(|i| (r.next_slot + i) % n)
                .find(|&i| r.slots[i] == SlotState::Free)
        }
    }

    /// Hashes, prefetches and gathers one step into its slot (the worker's part of a step).
    fn run_step(&self, job: &Job, w: &mut WorkerScratch) -> Result<StepRecord> {
        #[cfg(test)]
        {
            let d = self.hooks.delay_us.load(Ordering::Relaxed);
            if d > 0 {
                std::thread::sleep(Duration::from_micros(d));
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
        let heads = self.table.meta().num_heads as usize;
        let k = self.table.meta().ngram_size as usize - 1;
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
        w.ids.clear();
        w.ids.resize(n * heads, 0);
        let total_rows = self.table.meta().total_rows;
        let hash_chunk = |(ids, (toks, ctx)): (&mut [u64], (&[i32], &[i32]))| -> Result<()> {
            self.hasher.ids_for_tokens(toks, ctx, ids);
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
        let t1 = Instant::now();
        rec.hash_ns = stats::ns(t1 - t0);

        // prefetch decision (AUTO: steps of at least `prefetch_min_rows` rows, decode steps
        // included, unless a residency sample finds their pages cached) and, when prefetching,
        // the step's sorted page ranges. Steps that do not prefetch count their distinct pages
        // after they are published (off the critical path).
        if let Some(d) = &self.direct {
            return self.read_direct(d, job, w, rec, t1);
        }
        let prefetch = match self.opts.prefetch_policy {
            _ if self.cache.is_some() => false,
            PrefetchPolicy::Always => true,
            PrefetchPolicy::Never => false,
            _ => {
                w.ids.len() >= self.opts.prefetch_min_rows as usize
                    && !prefetch::sample_resident(
                        self.table.bytes(),
                        &w.ids,
                        rb,
                        // warm streak: one probe (about 1 µs); after a step that read storage, the
                        // full sample, so a partly cached step is caught
                        if w.storage_recently {
                            prefetch::sample_size(w.ids.len())
                        } else {
                            1
                        },
                    )
            }
        };
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
            let n = prefetch::prefetch(
                self.table.file(),
                self.table.bytes(),
                ranges,
                prefetch::Advise::Fadvise,
            )?;
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
            if w.ids.len() >= gather::PARALLEL_MIN_ROWS && pool.current_num_threads() > 1 {
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
                let (n, io) = match &self.uring_prefetch {
                    Some(u) => {
                        let len = self.table.bytes().len() as u64;
                        let (n, reads) = lock(u).prefetch(&w.pages.ranges, len)?;
                        rec.storage_reads = reads;
                        let io = stats::IoDelta {
                            read_bytes: stats::thread_read_bytes_delta(),
                            ..Default::default()
                        };
                        (n, io)
                    }
                    None => issue(&w.pages.ranges)?,
                };
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
        self.upload(job, n * heads * rb, rec)
    }

    /// DIRECT mode's read of the step's rows (`w.ids`, hashed at `t1`) into its slot.
    fn read_direct(
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
            let (r, hits) =
                cache::read_through(c, &w.ids, staging, &mut w.read_through, |m, o| {
                    lock(d).read_rows(m, o)
                })?;
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
    fn upload(&self, job: &Job, bytes: usize, mut rec: StepRecord) -> Result<StepRecord> {
        if let Some(g) = &self.gpu {
            self.check_closing()?;
            let t = Instant::now();
            g.upload(job.slot, bytes, job.seq, job.tokens.len() as u32)?;
            rec.copy_ns = stats::ns(t.elapsed());
        }
        Ok(rec)
    }

    fn check_closing(&self) -> Result<()> {
        if self.closing.load(Ordering::Relaxed) {
            Err(Error::State(
                "the handle was closed while the step ran".into(),
            ))
        } else {
            Ok(())
        }
    }
}

/// Buffers the worker keeps between steps.
#[derive(Default)]
struct WorkerScratch {
    ids: Vec<u64>,
    pages_builder: PageSetBuilder,
    pages: PageSet,
    /// The last step's distinct pages are still to be counted (from `ids`).
    count_pages_later: bool,
    /// The last step prefetched or took major faults (its rows were not all cached).
    storage_recently: bool,
    /// DIRECT mode with a row cache: the misses' buffers.
    read_through: cache::ReadThroughScratch,
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// Receives the next job, spinning briefly first (back-to-back steps skip the futex wake-up).
fn recv_spin(rx: &mpsc::Receiver<Work>) -> Option<Work> {
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
            return rx.recv().ok();
        }
        spin_round(start, i, WORKER_BUSY_SPIN);
    }
}

fn worker_main(sh: Arc<Shared>, rx: mpsc::Receiver<Work>) {
    stats::thread_read_bytes_delta();
    stats::thread_io_since_last();
    let mut w = WorkerScratch::default();
    while let Some(work) = recv_spin(&rx) {
        let job = match work {
            Work::Step(job) => job,
            Work::Run(f) => {
                // (a panic here drops the reply sender: the caller sees the error)
                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| f(&sh.table, sh.pool())));
                stats::thread_io_since_last(); // not a step's
                continue;
            }
        };
        w.count_pages_later = false;
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

struct SubmitState {
    tx: Option<mpsc::Sender<Work>>,
    /// The ring's `last_seq`, read here without the ring's lock (both change only in `submit`).
    last_seq: u64,
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
    sh: Arc<Shared>,
    submit_state: Mutex<SubmitState>,
    tracker: Mutex<Tracker>,
    worker: Option<JoinHandle<()>>,
    pool_threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
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
        let uring_prefetch = match (&direct, opts.prefetch_policy) {
            (None, PrefetchPolicy::Auto | PrefetchPolicy::Always) if opts.uring_prefetch => {
                prefetch::UringPrefetcher::open(table.rows_path()).map(Mutex::new)
            }
            _ => None,
        };
        if table.meta().num_heads as usize != crate::model::NUM_HEADS {
            return Err(Error::Unsupported(format!(
                "tables with {} heads",
                table.meta().num_heads
            )));
        }
        // Staging is bounded by the memory the machine has, checked before anything is allocated.
        let slot_bytes = opts.check_staging_fits(table.row_bytes())?;
        // The GPU side first (nothing CUDA is touched with cuda_device = -1): a machine without a
        // driver fails here with CudaUnavailable before any thread starts.
        let gpu = if opts.cuda_device >= 0 {
            Some(GpuSide::new(&GpuConfig {
                device: opts.cuda_device,
                wait_mode: opts.wait_mode,
                slots: opts.max_in_flight as usize,
                max_tokens: opts.max_tokens_per_step as usize,
                format: table.format(),
                global_scale: table.global_scale(),
                timeout_us: opts.wait_timeout_us,
            })?)
        } else {
            None
        };
        let threads = match opts.num_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n as usize,
        };
        let pool_threads: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let handles = pool_threads.clone();
        let pool = rayon::ThreadPoolBuilder::new()
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
            .map_err(|e| Error::io("starting the gather pool", std::io::Error::other(e)))?;
        let mut staging = Vec::with_capacity(opts.max_in_flight as usize);
        // With a GPU the worker gathers into the GPU side's pinned staging instead.
        let cpu_slots = if gpu.is_some() { 0 } else { opts.max_in_flight };
        for _ in 0..cpu_slots {
            let mut v = Vec::new();
            v.try_reserve_exact(slot_bytes)
                .map_err(|_| Error::OutOfMemory(format!("staging slot of {slot_bytes} bytes")))?;
            v.resize(slot_bytes, 0u8);
            // touch the pages now (up to PRETOUCH_MAX_BYTES over all slots) so steps do not take
            // first-touch faults
            let touch = slot_bytes.min(PRETOUCH_MAX_BYTES / opts.max_in_flight as usize);
            for i in (0..touch).step_by(4096) {
                // SAFETY: in bounds; volatile so the store is not elided.
                unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), 0) };
            }
            staging.push(Staging(UnsafeCell::new(v)));
        }
        let n = opts.max_in_flight as usize;
        let cache = match opts.cache_bytes {
            0 => None,
            b => Some(RowCache::new(b, table.row_bytes()).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(format!("options.{m}")),
                e => e,
            })?),
        };
        let tracker = {
            let m = table.meta();
            Tracker::new(m.ngram_size, m.hash.eos_token_id, opts.history_window)?
        };
        let sh = Arc::new(Shared {
            table,
            hasher,
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
            direct,
            uring_prefetch,
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
        let mut info = crate::format::table::table_info(&self.sh.table);
        if let Some(g) = &self.sh.gpu {
            info.device_wait_supported = g.device_wait_supported();
        }
        info
    }

    /// The I/O mode the handle runs with and its backend.
    pub fn io_info(&self) -> IoInfo {
        match &self.sh.direct {
            Some(d) => IoInfo {
                mode: IoMode::Direct,
                backend: Some(lock(d).backend()),
            },
            None => IoInfo {
                mode: IoMode::Mmap,
                backend: None,
            },
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

    /// [`Pipeline::submit`], staging token `order[g]` of the caller from token `g` of `b`.
    fn submit_in_order(&self, b: &Batch, order: Option<&[u32]>, seq: u64) -> Result<()> {
        let mut sub = lock(&self.submit_state);
        let sh = &*self.sh;
        let last_seq = sub.last_seq;
        if seq == 0 || seq <= last_seq {
            return Err(Error::State(format!(
                "seq {seq} must be greater than the last submitted seq {last_seq} (and not 0)"
            )));
        }
        let meta = sh.table.meta();
        validate_batch(b, meta.hash.vocab_size, sh.opts.max_tokens_per_step)?;
        if let Some(c) = b.context {
            let want = b.request_ids.len() * (meta.ngram_size as usize - 1);
            if c.len() != want {
                return crate::invalid!(
                    "batch.context has {} entries, expected num_requests × (ngram_size - 1) = {want}",
                    c.len()
                );
            }
        }
        let ctx = {
            let t = lock(&self.tracker);
            if b.context.is_none() {
                t.check_room(b)?;
            }
            resolve_contexts_checked(b, Some(&t), meta.hash.eos_token_id, meta.ngram_size)?
        };
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
                let target = (seq % ring.slots.len() as u64) as usize;
                return Err(Error::State(if sh.slot_by_seq {
                    format!(
                        "ring full: slot {target} (seq % {}) holds step {} not yet consumed; \
                         consume steps with ple_dequant_* or ple_release_step",
                        sh.opts.max_in_flight,
                        ring.slots[target].seq().unwrap_or(0)
                    )
                } else {
                    format!(
                        "ring full: all {} slots hold steps not yet consumed (oldest {oldest}); \
                         consume steps with ple_dequant_* or ple_release_step",
                        sh.opts.max_in_flight
                    )
                }));
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
                let k = meta.ngram_size as usize - 1;
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
        Ok(())
    }

    /// Waits until step `seq` is complete (`done >= seq`): spins briefly, then parks. `timeout_us`
    /// 0 = the handle's default, `u64::MAX` = forever. Returns the step's own error if it failed,
    /// `Error::Timeout` past the timeout, `Error::State` for a seq never submitted or consumed.
    pub fn wait(&self, seq: u64, timeout_us: u64) -> Result<()> {
        let sh = &*self.sh;
        let rows = match self.status_for_wait(seq)? {
            None => usize::MAX, // consumed or released: wait until it is complete
            Some(StepStatus::Failed(e)) => return Err(e),
            Some(StepStatus::Ready { .. }) => return Ok(()),
            // (GPU mode: a dequant_fuse may claim a step before it is complete)
            Some(StepStatus::Consuming) if sh.done.load(Ordering::Acquire) >= seq => return Ok(()),
            Some(StepStatus::Consuming) => usize::MAX,
            Some(StepStatus::Pending { rows }) => rows as usize,
        };
        // Spin only for steps the worker gathers alone (small ones, done in microseconds): a
        // spinning waiter would take a CPU from the pool gathering a big step.
        let spin = if rows < gather::PARALLEL_MIN_ROWS {
            WAIT_SPIN
        } else {
            Duration::ZERO
        };
        let t0 = Instant::now();
        let timeout = match timeout_us {
            0 => Some(sh.opts.wait_timeout_us),
            u64::MAX => None,
            t => Some(t),
        };
        let deadline = timeout.and_then(|t| t0.checked_add(Duration::from_micros(t)));
        let mut i = 0u32;
        while sh.done.load(Ordering::Acquire) < seq {
            i += 1;
            if i % 16 == 0 && t0.elapsed() >= spin {
                break;
            }
            spin_round(t0, i, WAIT_BUSY_SPIN);
        }
        let mut parked = Parked::Ready;
        if sh.done.load(Ordering::Acquire) < seq {
            let ring = lock(&sh.ring);
            parked = sh
                .park(ring, deadline, |_| sh.done.load(Ordering::Acquire) >= seq)
                .1;
        }
        sh.stats
            .wait_ns
            .fetch_add(stats::ns(t0.elapsed()), Ordering::Relaxed);
        if parked == Parked::Closing {
            return Err(Error::State(format!(
                "the handle was closed while waiting for step {seq}"
            )));
        }
        if parked == Parked::TimedOut {
            sh.stats.timeouts.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Timeout(format!(
                "step {seq} not complete after {} µs (done = {})",
                timeout.unwrap_or(u64::MAX),
                sh.done.load(Ordering::Acquire)
            )));
        }
        // (`done >= seq` was read with Acquire: a failure of this step is visible here)
        if seq > sh.last_failed.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.status_for_wait(seq)? {
            Some(StepStatus::Failed(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Whether step `seq` is complete, without waiting (`ple_wait(.., 0)`): `Ok` if it succeeded
    /// (also once consumed or released), its own error while its failure is recorded,
    /// `Error::Timeout` while it is not complete, `Error::State` for a seq never submitted. A poll
    /// is not counted in `timeouts`.
    pub fn poll(&self, seq: u64) -> Result<()> {
        let sh = &*self.sh;
        match self.status_for_wait(seq)? {
            Some(StepStatus::Failed(e)) => Err(e),
            None | Some(StepStatus::Ready { .. }) => Ok(()),
            _ if sh.done.load(Ordering::Acquire) >= seq => Ok(()),
            _ => Err(Error::Timeout(format!(
                "step {seq} is not complete (polled; done = {})",
                sh.done.load(Ordering::Acquire)
            ))),
        }
    }

    /// What `wait` needs to know of `seq`: None for a step that was submitted and has left the
    /// ring (consumed or released; still its error if a failure record is left), else its status.
    fn status_for_wait(&self, seq: u64) -> Result<Option<StepStatus>> {
        let mut ring = lock(&self.sh.ring);
        match self.sh.status(&mut ring, seq) {
            Err(_) if ring.left_ring(seq) => Ok(None),
            r => r.map(Some),
        }
    }

    /// Waits for step `seq` and returns its rows `[tokens][16][row_bytes]` (pointer, tokens). The
    /// pointer stays valid until the step is consumed.
    pub fn packed_rows(&self, seq: u64) -> Result<(*const u8, u32)> {
        self.wait(seq, 0)?;
        match self.sh.status(&mut lock(&self.sh.ring), seq)? {
            StepStatus::Ready { slot, tokens } => {
                // SAFETY: the slot is Ready: its rows are complete and stay until consumed.
                Ok((unsafe { self.sh.staging(slot) }.as_ptr(), tokens))
            }
            StepStatus::Consuming => Err(Error::State(format!(
                "step {seq} is being consumed by a dequant call"
            ))),
            StepStatus::Failed(e) => Err(e),
            StepStatus::Pending { .. } => Err(Error::State(format!("step {seq} is not complete"))),
        }
    }

    /// Calls `f` with step `seq`'s rows while holding the slot (Consuming), then frees it.
    /// A failing `f` (error or panic) leaves the step Ready: only a call that succeeds consumes it.
    fn consume<R>(&self, seq: u64, f: impl FnOnce(&[u8], usize) -> Result<R>) -> Result<R> {
        let sh = &*self.sh;
        let waited = self.wait(seq, 0);
        let mut ring = lock(&sh.ring);
        if let Some(i) = ring.failed.iter().position(|(s, _)| *s == seq) {
            let (_, e) = ring.failed.remove(i).expect("index from position");
            return Err(e);
        }
        waited?;
        let (slot, tokens) = match sh.status(&mut ring, seq)? {
            StepStatus::Ready { slot, tokens } => (slot, tokens),
            StepStatus::Consuming => {
                return Err(Error::State(format!(
                    "step {seq} is already being consumed by another call"
                )));
            }
            StepStatus::Failed(e) => return Err(e),
            StepStatus::Pending { .. } => {
                return Err(Error::State(format!("step {seq} is not complete")));
            }
        };
        ring.slots[slot] = SlotState::Consuming { seq, tokens };
        drop(ring);
        // SAFETY: the slot is Consuming, held by this call: nobody writes it until freed below.
        let rows = unsafe { sh.staging(slot) };
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| f(rows, tokens as usize)))
            .map_err(|p| Error::Panic(panic_text(&*p)))
            .and_then(|r| r);
        if r.is_ok() {
            sh.free_slot(slot);
        } else {
            // a step is consumed only by a call that succeeds: it stays Ready for a retry
            lock(&sh.ring).slots[slot] = SlotState::Ready { seq, tokens };
            sh.notify();
        }
        r
    }

    /// Releases step `seq`'s slot without dequantising (waits for the step first). Releasing a
    /// failed step forgets its error and succeeds.
    pub fn release_step(&self, seq: u64) -> Result<()> {
        let sh = &*self.sh;
        let waited = self.wait(seq, 0);
        let mut ring = lock(&sh.ring);
        if let Some(i) = ring.failed.iter().position(|(s, _)| *s == seq) {
            ring.failed.remove(i);
            return Ok(());
        }
        waited?;
        match ring.status(seq)? {
            StepStatus::Ready { slot, .. } => {
                ring.slots[slot] = SlotState::Free;
                drop(ring);
                sh.notify();
                Ok(())
            }
            StepStatus::Consuming => Err(Error::State(format!(
                "step {seq} is being consumed by a dequant call"
            ))),
            StepStatus::Failed(e) => Err(e),
            StepStatus::Pending { .. } => Err(Error::State(format!("step {seq} is not complete"))),
        }
    }

    /// Waits for step `seq`, dequantises its rows into `out` (`[tokens]` × 2560 of `dtype`,
    /// `stride` elements apart; `PLE_FUSE_ACCUMULATE` adds) and releases the slot. A failed step
    /// returns its error and is released too.
    ///
    /// # Safety
    /// `out` must be valid for reads and writes of `(tokens - 1) * stride + 2560` elements of
    /// `dtype` and not be used by anyone else during the call.
    pub unsafe fn dequant_cpu(&self, seq: u64, out: *mut u8, args: OutArgs) -> Result<()> {
        args.check_ptr(out as usize)?;
        let t = &self.sh.table;
        self.consume(seq, |rows, tokens| {
            // SAFETY: the caller guarantees `out` (see above).
            unsafe {
                dequant::dequant_raw(
                    t.format(),
                    t.global_scale(),
                    rows,
                    tokens,
                    out,
                    args.dtype,
                    args.stride,
                    args.accumulate,
                    Some(self.sh.pool()),
                )
            }
        })
    }

    /// GPU dequant (see `ple_dequant_fuse`): enqueues step `seq`'s wait and dequantisation on the
    /// engine's `stream` (`GpuSide::fuse`, `out` a device pointer) and marks the step consumed
    /// once enqueued; the GPU side keeps the kernel's event, so the worker does not overwrite the
    /// slot's rows (staging or device rows) before the kernel has read them. `Error::State` for a
    /// step not submitted, already consumed or being consumed; a failed step returns its error
    /// (and is released, as with `dequant_cpu`). With `PLE_WAIT_HOST` the call first waits for
    /// the step on the host (`wait(seq, 0)`); with device waits it returns without waiting.
    pub fn dequant_fuse(
        &self,
        stream: *mut c_void,
        seq: u64,
        out: u64,
        args: OutArgs,
    ) -> Result<()> {
        let sh = &*self.sh;
        let g = self.gpu()?;
        let slot = g.slot_of(seq);
        // Claim the step (Pending or Ready → Consuming) so no other call consumes it meanwhile.
        let tokens = {
            let mut ring = lock(&sh.ring);
            if let Some(i) = ring.failed.iter().position(|(s, _)| *s == seq) {
                let (_, e) = ring.failed.remove(i).expect("index from position");
                return Err(e);
            }
            match sh.status(&mut ring, seq)? {
                StepStatus::Failed(e) => return Err(e),
                StepStatus::Consuming => {
                    return Err(Error::State(format!(
                        "step {seq} is already being consumed by another call"
                    )));
                }
                StepStatus::Pending { .. } | StepStatus::Ready { .. } => {}
            }
            let tokens = match ring.slots[slot] {
                SlotState::Pending { seq: s, tokens } | SlotState::Ready { seq: s, tokens }
                    if s == seq =>
                {
                    tokens
                }
                st => {
                    return Err(Error::State(format!(
                        "step {seq} is not in ring slot {slot} (seq % {}): {st:?}",
                        g.slots()
                    )));
                }
            };
            ring.slots[slot] = SlotState::Consuming { seq, tokens };
            tokens
        };
        let r = g.fuse(stream, slot, seq, tokens, out, args, &|| self.wait(seq, 0));
        let mut ring = lock(&sh.ring);
        if ring.slots[slot] == (SlotState::Consuming { seq, tokens }) {
            ring.slots[slot] = match &r {
                // consumed: the GPU side keeps the kernel's event until the slot is reused
                Ok(()) => SlotState::Free,
                // not enqueued: the step stays available
                Err(_) if sh.done.load(Ordering::Acquire) >= seq => {
                    SlotState::Ready { seq, tokens }
                }
                Err(_) => SlotState::Pending { seq, tokens },
            };
        }
        if r.is_err() {
            // the step's own failure (host wait) is reported now and released, as in dequant_cpu
            if let Some(i) = ring.failed.iter().position(|(s, _)| *s == seq) {
                ring.failed.remove(i);
            }
        }
        drop(ring);
        sh.notify();
        r
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
        let _ring = lock(&self.sh.ring);
        self.sh.cv.notify_all();
    }
}

impl Drop for Pipeline {
    /// Stops the worker after the step it is running (queued steps are abandoned), joins it, then
    /// drops the pool and joins its threads: nothing of the handle outlives the call.
    fn drop(&mut self) {
        self.sh.closing.store(true, Ordering::SeqCst);
        if let Some(g) = &self.sh.gpu {
            g.begin_close();
        }
        lock(&self.submit_state).tx = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        if let Some(sh) = Arc::get_mut(&mut self.sh) {
            drop(sh.pool.take());
            let handles = std::mem::take(&mut *lock(&self.pool_threads));
            for h in handles {
                let _ = h.join();
            }
        }
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

#[cfg(test)]
#[path = "gpu_tests.rs"]
mod gpu_tests;
