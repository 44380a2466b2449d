//! The worker thread: the loop between the ring and the reader. It takes steps in submission
//! order, has the [`Reader`] read each into its slot, hands it to the device (GPU handles),
//! publishes it through the [`Completion`] protocol (`done = seq`), then does the accounting.
//!
//! [`Completion`]: super::ring::Completion

use super::reader::{ReadScratch, Reader};
use super::shared::{Shared, WORKER_SPIN, spin_round};
use crate::error::{Error, Result, panic_text};
use crate::format::table::Table;
use crate::stats::{self, StepRecord};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Instant;

/// A closure run on the worker thread between steps, with the table and the pool.
pub(super) type OnWorker = Box<dyn FnOnce(&Table, &rayon::ThreadPool) + Send>;

/// What the worker thread receives: a step, or a closure to run on the worker thread between
/// steps (benchmarks measure a bare gather there, on the thread and CPU that gathers steps).
pub(super) enum Work {
    Step(Job),
    Run(OnWorker),
}

/// One step handed to the worker (owns copies of the caller's arrays).
pub(super) struct Job {
    pub(super) seq: u64,
    pub(super) slot: usize,
    pub(super) num_tokens: u32,
    pub(super) input: StepInput,
    pub(super) prefill: bool,
    pub(super) submitted: Instant,
}

/// What a step's rows come from.
pub(super) enum StepInput {
    /// Tokens to hash, with `tokens.len() × (ngram_size - 1)` context ids, ctx1 first.
    Tokens { tokens: Vec<i32>, ctx: Vec<i32> },
    /// The rows themselves (`ple_submit_ids`), checked: `[tokens][heads]` rows of the row file.
    Rows(Vec<u64>),
}

/// The worker's part of a step: the reader reads its rows into its slot, then the device
/// hand-off.
fn run_step(sh: &Shared, job: &Job, s: &mut ReadScratch) -> Result<StepRecord> {
    #[cfg(test)]
    {
        let d = sh.hooks.delay_us.load(Ordering::Relaxed);
        if d > 0 {
            std::thread::sleep(std::time::Duration::from_micros(d));
        }
        if sh.hooks.fail_seq.load(Ordering::Relaxed) == job.seq {
            return Err(Error::io(
                format!("injected failure of step {}", job.seq),
                std::io::Error::other("test hook"),
            ));
        }
        if sh.hooks.panic_seq.load(Ordering::Relaxed) == job.seq {
            panic!("injected panic in step {}", job.seq);
        }
    }
    if let Some(g) = &sh.gpu {
        // no kernel may still read the slot's rows when the gather overwrites them
        g.begin_step(job.slot, job.seq)?;
    }
    let queue_ns = stats::ns(job.submitted.elapsed());
    // SAFETY: the slot is Pending with this job: only the worker touches its buffer.
    let staging = unsafe { sh.staging_mut(job.slot) };
    let r: &Reader = &sh.reader;
    let cancelled = || sh.completion.closing();
    let mut rec = match &job.input {
        StepInput::Tokens { tokens, ctx } => r.read_step(tokens, ctx, staging, s, &cancelled)?,
        StepInput::Rows(rows) => r.read_rows(rows, staging, s, &cancelled)?,
    };
    count_ahead_hits(sh);
    rec.queue_ns = queue_ns;
    rec.prefill = job.prefill;
    let bytes = rec.rows as usize * r.table.row_bytes();
    upload(sh, job, bytes, rec)
}

/// After a step's cache lookups: counts the rows read ahead that they found for the first time
/// as `ahead_hits`.
fn count_ahead_hits(sh: &Shared) {
    if let Some(c) = &sh.reader.cache {
        let hits = c.take_ahead_hits();
        if hits > 0 {
            sh.stats.ahead_hits.fetch_add(hits, Ordering::Relaxed);
        }
    }
}

/// CUDA handles: the GPU side publishes the step's `bytes` of rows to the device (host-wait
/// mode: after its host → device copy) before the pipeline publishes it. On error the step
/// fails and is published to the device as failed.
fn upload(sh: &Shared, job: &Job, bytes: usize, mut rec: StepRecord) -> Result<StepRecord> {
    if let Some(g) = &sh.gpu {
        if sh.completion.closing() {
            return Err(Error::State(
                "the handle was closed while the step ran".into(),
            ));
        }
        let t = Instant::now();
        g.upload(job.slot, bytes, job.seq, job.num_tokens)?;
        rec.copy_ns = stats::ns(t.elapsed());
    }
    Ok(rec)
}

/// Publishes a finished step (a failure first to the device side, without the ring's lock:
/// nothing there may block API calls). Returns the submit→done time.
fn publish(sh: &Shared, job: &Job, result: std::result::Result<(), Error>) -> u64 {
    if result.is_err() {
        publish_failed_to_device(sh, job);
        sh.stats.failed_steps.fetch_add(1, Ordering::Relaxed);
    }
    let step_ns = stats::ns(job.submitted.elapsed());
    sh.completion.publish(job.seq, job.slot, result);
    step_ns
}

/// Releases the device waiters of a failed step (its launch raises a device error and fills
/// its output with NaN).
fn publish_failed_to_device(sh: &Shared, job: &Job) {
    #[cfg(test)]
    {
        let free = sh.completion.ring_lock_free();
        sh.hooks
            .ring_free_at_device_publish
            .store(free, Ordering::SeqCst);
        sh.hooks.device_failures.fetch_add(1, Ordering::SeqCst);
    }
    if let Some(g) = &sh.gpu {
        if let Err(ge) = g.publish_failed(job.slot, job.seq, job.num_tokens) {
            log::warn!("step {}: publishing the failure to the GPU: {ge}", job.seq);
        }
    }
}

/// Receives the next job, spinning briefly first (back-to-back steps skip the futex wake-up);
/// when the spin ends with no job, runs `idle` once before blocking.
fn recv_spin(rx: &mpsc::Receiver<Work>, idle: impl FnOnce()) -> Option<Work> {
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
            idle();
            return rx.recv().ok();
        }
        spin_round(i);
    }
}

pub(super) fn worker_main(sh: Arc<Shared>, rx: mpsc::Receiver<Work>) {
    stats::thread_read_bytes_delta();
    stats::thread_io_since_last();
    let r = &sh.reader;
    let mut s = ReadScratch::default();
    loop {
        let Some(work) = recv_spin(&rx, || r.idle(&mut s, &sh.stats)) else {
            break;
        };
        let job = match work {
            Work::Step(job) => job,
            Work::Run(f) => {
                // the advice still waiting for an idle worker is issued first, so a closure
                // (a benchmark's baseline) never runs beside it
                r.idle(&mut s, &sh.stats);
                // (a panic here drops the reply sender: the caller sees the error)
                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| f(&r.table, r.pool())));
                stats::thread_io_since_last(); // not a step's
                continue;
            }
        };
        if r.idle_overdue(&s) {
            r.idle(&mut s, &sh.stats);
        }
        let result = if sh.completion.closing() {
            Err(Error::State(
                "the handle was closed before the step ran".into(),
            ))
        } else {
            std::panic::catch_unwind(AssertUnwindSafe(|| run_step(&sh, &job, &mut s)))
                .unwrap_or_else(|p| {
                    Err(Error::Panic(format!(
                        "step {}: {}",
                        job.seq,
                        panic_text(&*p)
                    )))
                })
        };
        match result {
            Ok(mut rec) => {
                rec.step_ns = publish(&sh, &job, Ok(()));
                // accounting after the step is visible to its waiter: this thread's faults
                // (and storage reads) since the previous step's, and the distinct pages
                rec.io.add(stats::thread_io_since_last());
                r.finish_step(&mut s, &mut rec, &sh.stats);
                sh.stats.record_step(&rec);
            }
            Err(e) => {
                publish(&sh, &job, Err(e));
                stats::thread_io_since_last();
            }
        }
        sh.accounted.store(job.seq, Ordering::Release);
    }
    stats::close_thread_io();
}
