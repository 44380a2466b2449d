//! What the submitting threads, the worker and the consumers share: the ring's [`Completion`]
//! protocol, the [`Reader`], the staging slots, the GPU side and the counters. The read-ahead
//! runner holds none of it (`ahead::Runner`: its own handles).

use super::reader::Reader;
use super::ring::Completion;
use crate::dequant::gpu::GpuSide;
use crate::error::{Error, Result};
use crate::stats::Stats;
use std::cell::UnsafeCell;
use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long a waiter spins on `done` before parking on the condition variable.
pub(super) const WAIT_SPIN: Duration = Duration::from_micros(50);
/// How long the worker spins for the next job before blocking (back-to-back decode steps).
pub(super) const WORKER_SPIN: Duration = Duration::from_micros(50);
/// Rounds of pure busy-waiting (PAUSE, a few µs together) at the start of a spin; after them the
/// spinner yields the CPU on each round. The thread it waits for is often runnable on its own
/// CPU (the scheduler puts a woken thread beside its waker), and there a busy spin holds it off
/// for as long as it lasts: with 20 µs of busy-waiting in `wait`, an all-cached 8-token step
/// queued 22.5 µs (mean) for the worker and took 31 µs (p50), against 3 µs and 9.5 µs when both
/// spinners yield from the first rounds (`ple bench --engine`'s p99 check at 1 ms, idle steps).
/// A yield with nothing else runnable on the CPU costs one system call. 8 rounds, not 64: on the
/// 2-vCPU VM (`ple bench --warm-only` on a table in the page cache, 3 alternated runs each) a
/// 1-token step's p50 went 3.9–5.8 → 2.7 µs, 64x1 70 → 42 µs, 256x4 480 → 410 µs, and with every
/// thread on one CPU (`taskset -c 0`) 9.2 → 6.1 µs (1 token): the worker, the pool and the
/// caller often share a CPU there (docs/PERFORMANCE.md).
const BUSY_ROUNDS: u32 = 8;

/// One round of a spin: busy for the first [`BUSY_ROUNDS`] rounds, then yielding.
#[inline]
pub(super) fn spin_round(i: u32) {
    if i >= BUSY_ROUNDS {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// Staging bytes (all slots together) touched at open; beyond it pages fault in on first use.
pub(super) const PRETOUCH_MAX_BYTES: usize = 256 << 20;

/// `slots` CPU staging slots of `slot_bytes`: anonymous mappings (zero pages the kernel
/// provides on first touch: nothing is written at open beyond the pre-touch), each slot's first
/// `PRETOUCH_MAX_BYTES / slots` bytes touched so steps do not take first-touch faults there.
pub(super) fn cpu_staging(slots: usize, slot_bytes: usize) -> Result<Vec<Staging>> {
    let mut staging = Vec::with_capacity(slots);
    for _ in 0..slots {
        let mut m = memmap2::MmapMut::map_anon(slot_bytes)
            .map_err(|e| Error::OutOfMemory(format!("staging slot of {slot_bytes} bytes: {e}")))?;
        let touch = slot_bytes.min(PRETOUCH_MAX_BYTES / slots);
        for i in (0..touch).step_by(4096) {
            // SAFETY: in bounds; volatile so the store is not elided.
            unsafe { std::ptr::write_volatile(m.as_mut_ptr().add(i), 0) };
        }
        staging.push(Staging(UnsafeCell::new(m)));
    }
    Ok(staging)
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
    pub graph_consumed: Arc<AtomicU64>,
}

pub(super) struct Shared {
    /// The ring's slots and `done`: submit, publish, park, claim, free.
    pub(super) completion: Completion,
    /// The read engine: table, hasher, pool, row cache, direct and cold reads.
    pub(super) reader: Reader,
    /// CPU staging per slot; empty when `gpu` is set (the worker then gathers into the GPU
    /// side's pinned staging, under the same access protocol).
    pub(super) staging: Vec<Staging>,
    /// The GPU side (handles opened with `cuda_device >= 0`). With it, step `seq` always goes in
    /// ring slot `seq % max_in_flight` (`GpuSide::slot_of`: the device kernels find it that way).
    pub(super) gpu: Option<Arc<GpuSide>>,
    /// Highest seq whose counters are recorded (a few µs after `done`).
    pub(super) accounted: AtomicU64,
    pub(super) stats: Arc<Stats>,
    #[cfg(test)]
    pub(super) hooks: TestHooks,
}

/// A slot's staging buffer `[max_tokens][16][row_bytes]`.
///
/// Access protocol (why the `UnsafeCell` is sound): the worker writes a slot's buffer only while
/// the slot is `Pending` with the worker's job; everyone else reads it only while it is `Ready` or
/// `Consuming`. Transitions happen under the ring mutex, and `done` is published with Release
/// after the writes, so readers see complete rows. A slot is never made `Pending` again before it
/// was consumed (set `Free`).
pub(super) struct Staging(pub(super) UnsafeCell<memmap2::MmapMut>);
// SAFETY: see the access protocol above.
unsafe impl Sync for Staging {}

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

impl Shared {
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
}

/// The `replays` word of a handle's [`Completion`]: the GPU side's consumed seq; a CPU handle
/// has none, unless a test stands it in with `stand_in`.
pub(super) fn replays(
    gpu: Option<&Arc<GpuSide>>,
    stand_in: Option<Arc<AtomicU64>>,
) -> Option<super::ring::Replays> {
    if let Some(g) = gpu {
        let g = g.clone();
        return Some(Box::new(move || g.consumed_seq()));
    }
    let c = stand_in?;
    Some(Box::new(move || c.load(Ordering::SeqCst)))
}
