//! Bounded close: a handle whose worker does not stop within [`CLOSE_WAIT`] (a read stalled on
//! the device, which no system call can cancel once the kernel holds its buffer) is handed to a
//! detached `ple-reaper` thread.
//!
//! Invariants: the worker and the residency cap's trim thread each hold their own `Arc` of the
//! handle's shared state (table mapping, ring, io_uring, aligned read buffers, descriptors), the
//! read-ahead reader its own `Arc`s of what it reads with (the table, the row cache, the cap)
//! and its own backend and buffers, so nothing a read in flight writes into (nor the mapping a
//! trim drops pages of) is freed before all return from it; the trim thread reads no storage
//! and stops after the chunk it is dropping. The reaper joins them, then drops the gather pool and
//! joins its threads, then drops the last reference. Closing returns after at most `CLOSE_WAIT`
//! plus the time to spawn the reaper.

use super::pipeline::Pipeline;
use super::shared::Shared;
use crate::sync::{self, lock};
use std::sync::Arc;
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

impl Drop for Pipeline {
    /// Stops the worker after the step it is running (queued steps are abandoned) and the trim
    /// thread after the chunk it is dropping, and joins them, then drops the pool and joins its
    /// threads. A worker that does not stop within
    /// [`CLOSE_WAIT`] (a read stalled on the device) is joined by a reaper thread instead,
    /// which then frees the rest (see `reaper`): the drop returns within about 30 ms.
    fn drop(&mut self) {
        self.sh.completion.close();
        if let Some(g) = &self.sh.gpu {
            g.begin_close();
        }
        lock(&self.submit_state).tx = None;
        self.ahead.stop();
        self.sh.reader.stop_trim();
        let ahead = self.ahead.take_thread();
        // all hold a reference to `sh`: the pool is released only after all returned (the trim
        // thread returns after the chunk it is dropping: no storage reads)
        let mut threads = [self.worker.take(), ahead, self.trim.take()];
        if !join_within(&mut threads) {
            let mut sh = self.sh.clone();
            hand_over(move || {
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
                release_pool(&mut sh);
            });
            return;
        }
        release_pool(&mut self.sh);
    }
}

/// Drops the gather pool and joins its threads, once `sh` is the last reference to the shared
/// state (the worker has returned).
fn release_pool(sh: &mut Arc<Shared>) {
    if let Some(sh) = Arc::get_mut(sh) {
        sh.reader.stop_pool();
    }
}
