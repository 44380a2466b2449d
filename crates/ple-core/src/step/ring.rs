//! The completion protocol of the step ring: [`Completion`] owns the ring of slots and the
//! `done` word, and moves slots through their states (see [`SlotState`]): a submit acquires a
//! slot (parking or failing while none is free), the worker publishes the step, a consumer
//! claims and frees it, a cancelled submit gives it back, and CUDA Graph replays free what they
//! consumed. No I/O and no step data here: slots are indices, steps are seqs.

use super::gate::StepGate;
use crate::error::{Error, Result};
use crate::sync::{self, lock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Failed steps remembered for their waiters (oldest forgotten first).
pub(super) const MAX_FAILED_RECORDS: usize = 64;
/// Ranges of skipped (never submitted) seqs remembered, so `wait` tells them from consumed steps.
pub(super) const MAX_SKIPPED_RANGES: usize = 1024;
/// With graph replays that free slots, how often a parked submitter re-checks for them.
pub(super) const GRAPH_POLL: Duration = Duration::from_micros(200);

/// State of one ring slot. A slot goes Free → Pending (submit) → Ready (worker published) →
/// [Consuming (dequant running)] → Free (consumed). A failed step goes Pending → Free at once and
/// its error is kept in `Ring::failed`. Only a Free slot is ever given to a new step.
///
/// GPU mode only: `dequant_fuse` may claim a step that is still Pending (device waits enqueue
/// before the step is complete): Pending → Consuming, and the worker's publish then leaves the
/// slot alone (the step stays claimed; a slot already freed or reused is never touched). A Ready
/// step a CUDA Graph replay consumed counts as Free (`Completion::reclaim_graph_consumed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotState {
    Free,
    Pending { seq: u64, tokens: u32 },
    Ready { seq: u64, tokens: u32 },
    Consuming { seq: u64, tokens: u32 },
}

/// How an error message names a slot's state ("the slot {state}").
impl std::fmt::Display for SlotState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotState::Free => write!(f, "is free"),
            SlotState::Pending { seq, tokens } => {
                write!(f, "holds step {seq} ({tokens} tokens), being gathered")
            }
            SlotState::Ready { seq, tokens } => {
                write!(f, "holds step {seq} ({tokens} tokens), ready")
            }
            SlotState::Consuming { seq, tokens } => {
                write!(f, "holds step {seq} ({tokens} tokens), being consumed")
            }
        }
    }
}

impl SlotState {
    pub(super) fn seq(self) -> Option<u64> {
        match self {
            SlotState::Free => None,
            SlotState::Pending { seq, .. }
            | SlotState::Ready { seq, .. }
            | SlotState::Consuming { seq, .. } => Some(seq),
        }
    }
}

pub(super) struct Ring {
    pub(super) slots: Vec<SlotState>,
    /// Steps that failed and were not yet released: (seq, error).
    pub(super) failed: VecDeque<(u64, Error)>,
    /// Highest seq submitted (0: none).
    pub(super) last_seq: u64,
    /// Slot the next step goes into.
    pub(super) next_slot: usize,
    /// The most recent ranges `[first, last]` of seqs skipped by sparse submits.
    pub(super) skipped: VecDeque<(u64, u64)>,
}

/// What is known about a seq.
#[derive(Debug)]
pub(super) enum StepStatus {
    Pending { tokens: u32 },
    Ready { slot: usize, tokens: u32 },
    Consuming,
    Failed(Error),
}

impl Ring {
    /// Frees the slots of Ready steps a CUDA Graph replay consumed: graph mode since `base`
    /// (0: not in graph mode), replays consumed every step up to `consumed`.
    pub(super) fn reclaim_graph_consumed(&mut self, base: u64, consumed: u64) {
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
    pub(super) fn left_ring(&self, seq: u64) -> bool {
        seq != 0
            && seq <= self.last_seq
            && !self.skipped.iter().any(|&(a, b)| (a..=b).contains(&seq))
            && !self.failed.iter().any(|(s, _)| *s == seq)
            && !self.slots.iter().any(|st| st.seq() == Some(seq))
    }

    /// Records the seqs a submit of `seq` skips (between the last submitted seq and it).
    pub(super) fn note_submitted(&mut self, seq: u64) {
        if seq > self.last_seq + 1 {
            self.skipped.push_back((self.last_seq + 1, seq - 1));
            if self.skipped.len() > MAX_SKIPPED_RANGES {
                self.skipped.pop_front();
            }
        }
        self.last_seq = seq;
    }

    /// Takes the failure record of `seq`, if there is one.
    fn take_failure(&mut self, seq: u64) -> Option<Error> {
        let i = self.failed.iter().position(|(s, _)| *s == seq)?;
        self.failed.remove(i).map(|(_, e)| e)
    }

    pub(super) fn status(&self, seq: u64) -> Result<StepStatus> {
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
                    return Ok(StepStatus::Pending { tokens });
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
pub(super) fn clone_error(e: &Error) -> Error {
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

/// Why [`Completion::park`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Parked {
    Ready,
    TimedOut,
    Closing,
}

/// Reads the last step a CUDA Graph replay consumed (the GPU side's control word).
pub(super) type Replays = Box<dyn Fn() -> u64 + Send + Sync>;

/// The ring's completion protocol: slot states, `done`, failure records, parking.
///
/// Invariants: steps complete in submission order, so `done` (the highest seq published) only
/// grows; `last_failed` is stored before the `done` of its step, so a waiter that sees
/// `done >= seq > last_failed` knows its step succeeded without taking the lock; every slot
/// transition happens under the ring's lock and wakes parked threads (`notify`).
pub(super) struct Completion {
    ring: Mutex<Ring>,
    /// Signalled when a step is published or a slot freed (only while `waiters > 0`).
    cv: Condvar,
    waiters: AtomicUsize,
    /// `done` (highest seq published), `closing`, and `submitted` (the submitting thread's).
    gate: Arc<StepGate>,
    /// Highest seq that failed (0: none), stored before its `done`.
    last_failed: AtomicU64,
    /// Step `seq` goes in slot `seq % slots` (GPU handles: the device kernels find it that way);
    /// else in the next Free slot in ring order.
    slot_by_seq: bool,
    /// First step of CUDA Graph mode (0: not prepared). A Ready step `s >= graph_base` counts
    /// as consumed once `replays() >= s` (a graph replay consumed it).
    graph_base: AtomicU64,
    replays: Option<Replays>,
    /// Replays free slots without signalling: parked submitters poll every `GRAPH_POLL`.
    poll_replays: bool,
}

impl Completion {
    /// A ring of `slots` Free slots. `replays` reads how far CUDA Graph replays consumed (None:
    /// no graph mode); with `poll_replays` parked threads look again every `GRAPH_POLL`.
    pub(super) fn new(
        slots: usize,
        slot_by_seq: bool,
        replays: Option<Replays>,
        poll_replays: bool,
    ) -> Completion {
        Completion {
            ring: Mutex::new(Ring {
                slots: vec![SlotState::Free; slots],
                failed: VecDeque::new(),
                last_seq: 0,
                next_slot: 0,
                skipped: VecDeque::new(),
            }),
            cv: Condvar::new(),
            waiters: AtomicUsize::new(0),
            gate: Arc::default(),
            last_failed: AtomicU64::new(0),
            slot_by_seq,
            graph_base: AtomicU64::new(0),
            replays,
            poll_replays,
        }
    }

    /// Highest seq whose step is complete (Acquire: its rows and failure record are visible).
    pub(super) fn done(&self) -> u64 {
        self.gate.done()
    }

    /// The handle's progress words, for threads that read nothing else of the ring.
    pub(super) fn gate(&self) -> &Arc<StepGate> {
        &self.gate
    }

    /// Highest seq that failed (0: none).
    pub(super) fn last_failed(&self) -> u64 {
        self.last_failed.load(Ordering::Acquire)
    }

    /// Whether the handle is closing.
    pub(super) fn closing(&self) -> bool {
        self.gate.closing()
    }

    /// Whether step `seq` goes in slot `seq % slots`.
    #[cfg(test)]
    pub(super) fn slot_by_seq(&self) -> bool {
        self.slot_by_seq
    }

    /// The first step of CUDA Graph mode (0: not prepared).
    pub(super) fn graph_base(&self) -> u64 {
        self.graph_base.load(Ordering::Acquire)
    }

    /// Marks the handle closing and wakes every parked thread (under the ring's lock, so a
    /// thread about to park cannot miss it).
    pub(super) fn close(&self) {
        self.gate.close();
        let _ring = lock(&self.ring);
        self.cv.notify_all();
    }

    /// A copy of the slot states (tests).
    #[cfg(test)]
    pub(super) fn slot_states(&self) -> Vec<SlotState> {
        lock(&self.ring).slots.clone()
    }

    /// Whether the ring's lock is free now (tests).
    #[cfg(test)]
    pub(super) fn ring_lock_free(&self) -> bool {
        self.ring.try_lock().is_ok()
    }

    fn notify(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }

    /// Parks on the condition variable until `ready(ring)`, the deadline (None: forever) or the
    /// handle closing (`close` sets `closing` and signals under the ring's lock, so a parked
    /// caller cannot miss it). Returns the guard and why it stopped.
    fn park<'a>(
        &'a self,
        mut ring: MutexGuard<'a, Ring>,
        deadline: Option<Instant>,
        ready: impl Fn(&Ring) -> bool,
    ) -> (MutexGuard<'a, Ring>, Parked) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        // graph replays free slots without signalling the condition variable: poll
        let poll = self.poll_replays.then_some(GRAPH_POLL);
        let ok = loop {
            if ready(&ring) {
                break Parked::Ready;
            }
            if self.gate.closing_seqcst() {
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
                None => sync::wait(&self.cv, ring),
                Some(t) => sync::wait_timeout(&self.cv, ring, t).0,
            };
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        (ring, ok)
    }

    /// Parks until step `seq` is published (`done >= seq`), the deadline or the handle closing.
    pub(super) fn park_until_done(&self, seq: u64, deadline: Option<Instant>) -> Parked {
        if self.done() >= seq {
            return Parked::Ready;
        }
        let ring = lock(&self.ring);
        self.park(ring, deadline, |_| self.done() >= seq).1
    }

    /// Publishes finished step `seq` in `slot`: the slot becomes Ready (or Free with the error
    /// recorded), then `done = seq` (Release), then waiters are woken.
    pub(super) fn publish(&self, seq: u64, slot: usize, result: std::result::Result<(), Error>) {
        let mut failure = None;
        let mut ring = lock(&self.ring);
        match result {
            Ok(()) => {
                // (GPU mode: a slot a dequant_fuse claimed, or already freed, is left alone.)
                if let SlotState::Pending { seq: s, tokens } = ring.slots[slot] {
                    if s == seq {
                        ring.slots[slot] = SlotState::Ready { seq, tokens };
                    }
                }
            }
            Err(e) => {
                // logged once the ring's lock is released (below)
                failure = Some((self.closing(), e.to_string()));
                if ring.slots[slot].seq() == Some(seq) {
                    ring.slots[slot] = SlotState::Free;
                }
                ring.failed.push_back((seq, e));
                self.last_failed.fetch_max(seq, Ordering::Release);
                while ring.failed.len() > MAX_FAILED_RECORDS {
                    ring.failed.pop_front();
                }
            }
        }
        self.gate.set_done(seq);
        drop(ring);
        self.notify();
        match failure {
            Some((true, e)) => log::debug!("step {seq} abandoned: {e}"),
            Some((false, e)) => log::warn!("step {seq} failed: {e}"),
            None => {}
        }
    }

    /// What is known about `seq` (steps a graph replay consumed count as consumed).
    pub(super) fn status(&self, seq: u64) -> Result<StepStatus> {
        let mut ring = lock(&self.ring);
        self.reclaim_graph_consumed(&mut ring);
        ring.status(seq)
    }

    /// What `wait` needs to know of `seq`: None for a step that was submitted and has left the
    /// ring (consumed or released; still its error if a failure record is left), else its status.
    pub(super) fn status_for_wait(&self, seq: u64) -> Result<Option<StepStatus>> {
        let mut ring = lock(&self.ring);
        self.reclaim_graph_consumed(&mut ring);
        match ring.status(seq) {
            Err(_) if ring.left_ring(seq) => Ok(None),
            r => r.map(Some),
        }
    }
}

mod claim;
mod graph;
mod submit;

#[cfg(test)]
mod tests;
