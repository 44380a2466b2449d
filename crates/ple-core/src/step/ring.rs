//! The ring of staging slots: slot states, step status lookups, failure records (see
//! [`SlotState`] for the protocol).

use super::shared::*;
use crate::error::{Error, Result};
use std::cell::UnsafeCell;
use std::collections::VecDeque;

/// State of one ring slot. A slot goes Free → Pending (submit) → Ready (worker published) →
/// [Consuming (dequant running)] → Free (consumed). A failed step goes Pending → Free at once and
/// its error is kept in `Ring::failed`. Only a Free slot is ever given to a new step.
///
/// GPU mode only: `dequant_fuse` may claim a step that is still Pending (device waits enqueue
/// before the step is complete): Pending → Consuming, and the worker's publish then leaves the
/// slot alone (the step stays claimed; a slot already freed or reused is never touched). A Ready
/// step a CUDA Graph replay consumed counts as Free (`Shared::reclaim_graph_consumed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotState {
    Free,
    Pending { seq: u64, tokens: u32 },
    Ready { seq: u64, tokens: u32 },
    Consuming { seq: u64, tokens: u32 },
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
pub(super) enum StepStatus {
    Pending { rows: u32 },
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
                    return Ok(StepStatus::Pending {
                        rows: tokens.saturating_mul(crate::model::NUM_HEADS as u32), // (at most)
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

/// A slot's staging buffer `[max_tokens][16][row_bytes]`.
///
/// Access protocol (why the `UnsafeCell` is sound): the worker writes a slot's buffer only while
/// the slot is `Pending` with the worker's job; everyone else reads it only while it is `Ready` or
/// `Consuming`. Transitions happen under the ring mutex, and `done` is published with Release
/// after the writes, so readers see complete rows. A slot is never made `Pending` again before it
/// was consumed (set `Free`).
pub(super) struct Staging(pub(super) UnsafeCell<Vec<u8>>);
// SAFETY: see the access protocol above.
unsafe impl Sync for Staging {}

/// Why [`Shared::park`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Parked {
    Ready,
    TimedOut,
    Closing,
}
