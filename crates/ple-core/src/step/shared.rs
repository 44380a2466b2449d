//! What the submitting threads, the worker and the consumers share: the table, the ring and its
//! condition variable, `done`, the counters; parking, publishing and freeing slots.

use super::ring::*;
use super::worker::*;
use crate::dequant::gpu::GpuSide;
use crate::error::{Error, Result};
use crate::format::table::Table;
use crate::io::cache::RowCache;
use crate::io::direct::{Backend, DirectReader};
use crate::io::prefetch::{self};
use crate::lookup::hash::Hasher;
use crate::stats::{self, Stats};
use crate::step::options::{ColdReads, IoMode, OpenOptions, PrefetchPolicy};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a waiter spins on `done` before parking on the condition variable.
pub(super) const WAIT_SPIN: Duration = Duration::from_micros(50);
/// How long the worker spins for the next job before blocking (back-to-back decode steps).
pub(super) const WORKER_SPIN: Duration = Duration::from_micros(50);
/// Within a spin, pure busy-waiting lasts this long; after it the spinner yields the CPU on each
/// round, so on a machine with fewer free CPUs than spinning threads it does not starve the
/// thread it waits for. The worker waits for the caller's next submit (a microsecond or two
/// after a step is consumed, in a tight loop); a waiter busy-waits through a whole small step
/// (a decode step gathers in about 10 µs): a `sched_yield` while the step completes would add
/// its own latency to the step's.
pub(super) const WORKER_BUSY_SPIN: Duration = Duration::from_micros(4);
pub(super) const WAIT_BUSY_SPIN: Duration = Duration::from_micros(20);

/// One round of a spin that started at `start`: busy for `busy`, then yielding.
#[inline]
pub(super) fn spin_round(start: Instant, i: u32, busy: Duration) {
    if i >= 64 && start.elapsed() > busy {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}
/// Steps with at least this many tokens are hashed in parallel on the pool.
pub(super) const PARALLEL_HASH_MIN_TOKENS: usize = 1024;
/// Staging bytes (all slots together) touched at open; beyond it pages fault in on first use.
pub(super) const PRETOUCH_MAX_BYTES: usize = 256 << 20;
/// Failed steps remembered for their waiters (oldest forgotten first).
pub(super) const MAX_FAILED_RECORDS: usize = 64;
/// Ranges of skipped (never submitted) seqs remembered, so `wait` tells them from consumed steps.
pub(super) const MAX_SKIPPED_RANGES: usize = 1024;
/// With a GPU, how often a parked submitter re-checks for slots freed by CUDA Graph replays.
pub(super) const GRAPH_POLL: Duration = Duration::from_micros(200);

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

pub(super) struct Shared {
    pub(super) table: Table,
    pub(super) hasher: Hasher,
    /// The heads the handle serves (`opts.shard`'s; all 16 for the whole table): a step's rows
    /// are `[tokens][heads.len()][row_bytes]`.
    pub(super) heads: std::ops::Range<usize>,
    /// Subtracted from the whole table's row ids to address the row file: 0 for a whole table,
    /// the shard's first row for a shard table (`crate::shard`).
    pub(super) row_base: u64,
    pub(super) opts: OpenOptions,
    /// Taken out only by `Drop` (to join its threads).
    pub(super) pool: Option<rayon::ThreadPool>,
    /// CPU staging per slot; empty when `gpu` is set (the worker then gathers into the GPU
    /// side's pinned staging, under the same access protocol).
    pub(super) staging: Vec<Staging>,
    /// The GPU side (handles opened with `cuda_device >= 0`). With it, step `seq` always goes in
    /// ring slot `seq % max_in_flight` (`GpuSide::slot_of`: the device kernels find it that way).
    pub(super) gpu: Option<GpuSide>,
    /// Step `seq` goes in slot `seq % max_in_flight` (set with a GPU; tests can force it on CPU).
    pub(super) slot_by_seq: bool,
    /// First step of CUDA Graph mode (0: not prepared). A Ready step `s >= graph_base` counts
    /// as consumed once `gpu.consumed_seq() >= s` (a graph replay consumed it).
    pub(super) graph_base: AtomicU64,
    pub(super) ring: Mutex<Ring>,
    /// Signalled when a step is published or a slot freed (only while `waiters > 0`).
    pub(super) cv: Condvar,
    pub(super) waiters: AtomicUsize,
    /// Highest seq published (steps complete in submission order).
    pub(super) done: AtomicU64,
    /// Highest seq that failed (0: none), stored before its `done`: a waiter that sees
    /// `done >= seq > last_failed` knows its step succeeded without taking the ring's lock.
    pub(super) last_failed: AtomicU64,
    /// Highest seq whose counters are recorded (a few µs after `done`).
    pub(super) accounted: AtomicU64,
    pub(super) stats: Stats,
    pub(super) closing: AtomicBool,
    /// The row cache (`cache_bytes > 0`): steps gather through it (see `run_step`).
    pub(super) cache: Option<RowCache>,
    /// Its `cache_bytes` (AUTO resolved; 0: no cache).
    pub(super) cache_budget: u64,
    /// DIRECT mode's reader (None: MMAP mode). Used by the worker only; the lock is uncontended.
    pub(super) direct: Option<Mutex<DirectReader>>,
    /// MMAP mode: how prefetching steps of at most `COLD_READ_MAX_ROWS` rows read their rows. Used by
    /// the worker only.
    pub(super) cold: ColdReader,
    /// Read-ahead's queue and reader thread (`ahead.rs`).
    pub(super) ahead: super::ahead::Ahead,
    /// MMAP with `resident_bytes_max`: the table's residency cap (locked by the worker after a
    /// step and by the read-ahead reader after a batch).
    pub(super) residency: Option<Mutex<crate::io::residency::ResidencyCap>>,
    /// Highest seq submitted (stored after its job is sent): the reader waits while it is above
    /// `done`.
    pub(super) submitted: AtomicU64,
    #[cfg(test)]
    pub(super) hooks: TestHooks,
}

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

/// MMAP mode's reader of cold rows (see [`ColdReads`]).
pub(super) enum ColdReader {
    Direct(Mutex<DirectReader>),
    Buffered(Mutex<prefetch::UringPrefetcher>),
    /// WILLNEED and the gather (also DIRECT mode and PREFETCH_NEVER, which have no use for one).
    None,
}

/// The cold-row reader `opts.cold_reads` asks for, falling back where the kernel refuses it:
/// sector reads need `O_DIRECT` and io_uring (never a pread pool), buffered reads io_uring.
pub(super) fn open_cold(table: &Table, opts: &OpenOptions, direct_mode: bool) -> ColdReader {
    if direct_mode || opts.prefetch_policy == PrefetchPolicy::Never {
        return ColdReader::None;
    }
    if opts.cold_reads == ColdReads::Direct {
        match DirectReader::open_uring_only(table.rows_path(), table.row_bytes()) {
            Ok(d) => return ColdReader::Direct(Mutex::new(d)),
            Err(e) => log::info!("MMAP cold reads: buffered ({e})"),
        }
    }
    if opts.cold_reads != ColdReads::Willneed {
        if let Some(u) = prefetch::UringPrefetcher::open(table.rows_path()) {
            return ColdReader::Buffered(Mutex::new(u));
        }
    }
    ColdReader::None
}

/// Opens the DIRECT reader `opts.io_mode` asks for: MMAP → none; DIRECT → the reader or its
/// error (`Unsupported` on tmpfs); AUTO → the reader when the row file is larger than the
/// machine's memory and direct I/O works on it, else none.
pub(super) fn open_direct(table: &Table, opts: &OpenOptions) -> Result<Option<DirectReader>> {
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

pub(super) fn force_slot_by_seq() -> bool {
    #[cfg(test)]
    return FORCE_SLOT_BY_SEQ.with(|f| f.get());
    #[cfg(not(test))]
    false
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// MMAP with a residency cap: marks the pages of `ids` used and, over the cap, drops the
    /// least recently used chunks. Every row of a step is marked, also those a row cache or a
    /// direct cold read served without touching the page cache: the count errs high, never low.
    /// A failed drop is logged: the rows are unaffected.
    pub(super) fn keep_resident_within_cap(&self, ids: &[u64]) {
        let Some(r) = &self.residency else {
            return;
        };
        let mut r = lock(r);
        r.touch(ids, self.table.row_bytes());
        if r.over() {
            use std::os::fd::AsRawFd;
            let t0 = Instant::now();
            match r.trim(self.table.bytes(), self.table.file().as_raw_fd()) {
                Ok(n) => {
                    self.stats.add_resident_dropped(n);
                    log::debug!(
                        "residency cap: {n} bytes freed in {:?}, {} marked",
                        t0.elapsed(),
                        r.marked_bytes()
                    );
                }
                Err(e) => log::warn!("{e}"),
            }
        }
    }

    pub(super) fn pool(&self) -> &rayon::ThreadPool {
        self.pool
            .as_ref()
            .expect("the pool lives until the handle is dropped")
    }

    pub(super) fn notify(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }

    /// Parks on the condition variable until `ready(ring)`, the deadline (None: forever) or the
    /// handle closing (`shutdown` sets `closing` and signals under the ring's lock, so a parked
    /// caller cannot miss it). Returns the guard and why it stopped.
    pub(super) fn park<'a>(
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
    pub(super) fn publish(&self, job: &Job, result: std::result::Result<(), Error>) -> u64 {
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
    pub(super) fn publish_failed_to_device(&self, job: &Job) {
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
    pub(super) fn free_slot(&self, slot: usize) {
        lock(&self.ring).slots[slot] = SlotState::Free;
        self.notify();
    }

    /// The staging bytes of `slot` (the GPU side's pinned staging when there is one).
    ///
    /// # Safety
    /// Only while the slot is Ready/Consuming (readers) — see [`Staging`].
    pub(super) unsafe fn staging(&self, slot: usize) -> &[u8] {
        match &self.gpu {
            // SAFETY: `staging(slot)` holds `slot_bytes()` bytes while the GpuSide lives.
            Some(g) => unsafe { std::slice::from_raw_parts(g.staging(slot), g.slot_bytes()) },
            // SAFETY: the caller holds the slot Ready/Consuming: nobody writes it meanwhile.
            None => unsafe { &*self.staging[slot].0.get() },
        }
    }

    /// The staging bytes of `slot`, for the worker.
    ///
    /// # Safety
    /// Only by the worker, while the slot is Pending with its job — see [`Staging`].
    #[allow(
        clippy::mut_from_ref,
        reason = "the ring protocol gives the worker the slot alone"
    )]
    pub(super) unsafe fn staging_mut(&self, slot: usize) -> &mut [u8] {
        match &self.gpu {
            // SAFETY: as above; nobody else reads or writes the slot while it is Pending.
            Some(g) => unsafe { std::slice::from_raw_parts_mut(g.staging(slot), g.slot_bytes()) },
            // SAFETY: only the worker, while the slot is Pending with its job: nobody else
            // reads or writes it meanwhile.
            None => unsafe { &mut *self.staging[slot].0.get() },
        }
    }

    /// What is known about `seq` (steps a graph replay consumed count as consumed).
    pub(super) fn status(&self, ring: &mut Ring, seq: u64) -> Result<StepStatus> {
        self.reclaim_graph_consumed(ring);
        ring.status(seq)
    }

    /// The last step a CUDA Graph replay consumed (GPU handles; tests stand it in on the CPU).
    pub(super) fn graph_consumed_seq(&self) -> Option<u64> {
        #[cfg(test)]
        if self.gpu.is_none() {
            return Some(self.hooks.graph_consumed.load(Ordering::SeqCst));
        }
        self.gpu.as_ref().map(|g| g.consumed_seq())
    }

    /// Whether Ready step `seq` was consumed by a CUDA Graph replay (graph mode only).
    pub(super) fn graph_consumed(&self, seq: u64) -> bool {
        let base = self.graph_base.load(Ordering::Acquire);
        self.graph_consumed_seq()
            .is_some_and(|c| base != 0 && seq >= base && c >= seq)
    }

    /// Frees the slots of Ready steps a CUDA Graph replay consumed.
    pub(super) fn reclaim_graph_consumed(&self, ring: &mut Ring) {
        if let Some(c) = self.graph_consumed_seq() {
            ring.reclaim_graph_consumed(self.graph_base.load(Ordering::Acquire), c);
        }
    }

    /// The slot step `seq` may take now, if any: with a GPU exactly `seq % slots` (free, or
    /// holding a step a graph replay consumed); without, the next Free slot in ring order (the
    /// CPU ring keeps its original policy: any free slot, so sparse seqs use the whole ring).
    pub(super) fn free_slot_for(&self, r: &Ring, seq: u64) -> Option<usize> {
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

    /// The error of a submit that finds its ring slot taken under `RingFullPolicy::Error`
    /// (`oldest`: the oldest step the ring holds).
    pub(super) fn ring_full_error(&self, ring: &Ring, seq: u64, oldest: u64) -> Error {
        let target = (seq % ring.slots.len() as u64) as usize;
        Error::State(if self.slot_by_seq {
            format!(
                "ring full: slot {target} (seq % {}) holds step {} not yet consumed; \
                 consume steps with ple_dequant_* or ple_release_step",
                self.opts.max_in_flight,
                ring.slots[target].seq().unwrap_or(0)
            )
        } else {
            format!(
                "ring full: all {} slots hold steps not yet consumed (oldest {oldest}); \
                 consume steps with ple_dequant_* or ple_release_step",
                self.opts.max_in_flight
            )
        })
    }
}
