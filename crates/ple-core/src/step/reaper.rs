//! Bounded close: a handle whose worker does not stop within [`CLOSE_WAIT`] (a read stalled on
//! the device, which no system call can cancel once the kernel holds its buffer) is handed to a
//! detached `ple-reaper` thread.
//!
//! Invariants: the worker, the read-ahead reader and the residency cap's trim thread (joined
//! together) each hold their own `Arc` of the handle's shared state (table mapping, ring,
//! io_uring, aligned read buffers, descriptors), so nothing a read in flight writes into (nor
//! the mapping a trim drops pages of) is freed before all return from it; the trim thread
//! reads no storage and stops after the chunk it is dropping. The reaper joins them, then drops the gather pool and
//! joins its threads, then drops the last reference. Closing returns after at most `CLOSE_WAIT`
//! plus the time to spawn the reaper.

use crate::sync;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a close waits for the worker before handing the handle to a reaper.
pub const CLOSE_WAIT: Duration = Duration::from_millis(30);

static ABANDONED: AtomicU64 = AtomicU64::new(0);
static REAPED: AtomicU64 = AtomicU64::new(0);

/// Handles whose close did not wait for their worker (process-wide, since start).
pub fn abandoned_handles() -> u64 {
    ABANDONED.load(Ordering::Relaxed)
}

/// Of those, the ones whose reaper has freed everything.
pub fn reaped_handles() -> u64 {
    REAPED.load(Ordering::Relaxed)
}

/// Waits up to [`CLOSE_WAIT`] in all for every thread in `threads` (the worker, the read-ahead
/// reader, the trim thread) to finish; true when all did (they are then joined and taken). On false, the ones
/// still running stay in `threads` for the reaper.
pub(super) fn join_within(threads: &mut [Option<JoinHandle<()>>]) -> bool {
    let t0 = Instant::now();
    let mut pause = Duration::from_micros(20);
    while threads.iter().flatten().any(|t| !t.is_finished()) {
        if t0.elapsed() >= CLOSE_WAIT {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
    for t in threads.iter_mut() {
        if let Some(t) = t.take() {
            let _ = t.join();
        }
    }
    true
}

/// Hands `finish` (joins the worker, then frees the rest) to a detached reaper thread; runs it
/// here if no thread can be started (the close then waits, but nothing is leaked or freed early).
pub(super) fn hand_over(finish: impl FnOnce() + Send + 'static) {
    ABANDONED.fetch_add(1, Ordering::Relaxed);
    let job = std::sync::Arc::new(std::sync::Mutex::new(Some(finish)));
    let run = {
        let job = job.clone();
        move || {
            if let Some(f) = sync::lock(&job).take() {
                f();
                REAPED.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    let spawned = std::thread::Builder::new()
        .name("ple-reaper".into())
        .spawn(run);
    if spawned.is_err() {
        log::warn!("no reaper thread could be started: the close waits for the worker");
        if let Some(f) = sync::lock(&job).take() {
            f();
            REAPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}
