//! [`StepGate`]: the three words of a handle's progress that threads beside the ring read —
//! the highest seq submitted, the highest done, and whether the handle is closing. The ring's
//! [`Completion`](super::ring::Completion) writes `done` and `closing`, the submitting thread
//! `submitted`; the read-ahead runner reads them to keep out of a step's way, without a
//! reference to anything else of the pipeline.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};

/// See the module doc.
#[derive(Debug, Default)]
pub(super) struct StepGate {
    /// Highest seq submitted (stored after its job is sent).
    submitted: AtomicU64,
    /// Highest seq whose step is complete (stored with Release after its rows are written).
    done: AtomicU64,
    closing: AtomicBool,
}

impl StepGate {
    /// Highest seq whose step is complete (Acquire: its rows and failure record are visible).
    pub(super) fn done(&self) -> u64 {
        self.done.load(Acquire)
    }

    /// Publishes step `seq` as complete (its writes before this store are visible to a
    /// [`StepGate::done`] that returns `seq`).
    pub(super) fn set_done(&self, seq: u64) {
        self.done.store(seq, Release);
    }

    /// Highest seq submitted.
    pub(super) fn submitted(&self) -> u64 {
        self.submitted.load(Acquire)
    }

    /// Records step `seq` handed to the worker.
    pub(super) fn set_submitted(&self, seq: u64) {
        self.submitted.store(seq, Release);
    }

    /// Whether a step was submitted and is not yet done.
    pub(super) fn step_pending(&self) -> bool {
        self.submitted() > self.done()
    }

    /// Whether the handle is closing.
    pub(super) fn closing(&self) -> bool {
        self.closing.load(Relaxed)
    }

    /// Whether the handle is closing, ordered with the ring's lock-free checks.
    pub(super) fn closing_seqcst(&self) -> bool {
        self.closing.load(SeqCst)
    }

    /// Marks the handle closing.
    pub(super) fn close(&self) {
        self.closing.store(true, SeqCst);
    }
}
