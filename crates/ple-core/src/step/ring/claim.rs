//! The consumer side of [`Completion`]: claiming a Ready step for a dequant call, ending the
//! claim, releasing a step.

use super::{Completion, SlotState, StepStatus};
use crate::error::{Error, Result};
use crate::sync::lock;

impl Completion {
    /// Claims complete step `seq` for a consumer (Ready → Consuming) and returns its slot and
    /// tokens; `waited` is the consumer's wait for it. A failed step's record is taken (the
    /// step is released) and its error returned.
    pub(in crate::step) fn claim(&self, seq: u64, waited: Result<()>) -> Result<(usize, u32)> {
        let mut ring = lock(&self.ring);
        if let Some(e) = ring.take_failure(seq) {
            return Err(e);
        }
        waited?;
        self.reclaim_graph_consumed(&mut ring);
        let (slot, tokens) = match ring.status(seq)? {
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
        Ok((slot, tokens))
    }

    /// Claims step `seq` in its `seq % slots` slot before it may be complete (Pending or Ready
    /// → Consuming; device waits) and returns its tokens. A failed step's record is taken and
    /// its error returned.
    pub(in crate::step) fn claim_early(&self, seq: u64, slot: usize) -> Result<u32> {
        let mut ring = lock(&self.ring);
        if let Some(e) = ring.take_failure(seq) {
            return Err(e);
        }
        self.reclaim_graph_consumed(&mut ring);
        match ring.status(seq)? {
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
                    "step {seq} is not in ring slot {slot} (seq % {}): the slot {st}",
                    ring.slots.len()
                )));
            }
        };
        ring.slots[slot] = SlotState::Consuming { seq, tokens };
        Ok(tokens)
    }

    /// Ends a claim of step `seq` (`tokens` tokens) in `slot`: `consumed` frees the slot;
    /// otherwise the step stays available (Ready once complete, else Pending) and a failure
    /// record of it is forgotten (the consumer reported it). A slot no longer held by the claim
    /// is left alone.
    pub(in crate::step) fn end_claim(&self, seq: u64, slot: usize, tokens: u32, consumed: bool) {
        let mut ring = lock(&self.ring);
        if ring.slots[slot] == (SlotState::Consuming { seq, tokens }) {
            ring.slots[slot] = if consumed {
                SlotState::Free
            } else if self.done() >= seq {
                SlotState::Ready { seq, tokens }
            } else {
                SlotState::Pending { seq, tokens }
            };
        }
        if !consumed {
            ring.take_failure(seq);
        }
        drop(ring);
        self.notify();
    }

    /// Releases complete step `seq` without consuming its rows (`waited`: the wait for it).
    /// Releasing a failed step forgets its error and succeeds.
    pub(in crate::step) fn release(&self, seq: u64, waited: Result<()>) -> Result<()> {
        let mut ring = lock(&self.ring);
        if ring.take_failure(seq).is_some() {
            return Ok(());
        }
        waited?;
        match ring.status(seq)? {
            StepStatus::Ready { slot, .. } => {
                ring.slots[slot] = SlotState::Free;
                drop(ring);
                self.notify();
                Ok(())
            }
            StepStatus::Consuming => Err(Error::State(format!(
                "step {seq} is being consumed by a dequant call"
            ))),
            StepStatus::Failed(e) => Err(e),
            StepStatus::Pending { .. } => Err(Error::State(format!("step {seq} is not complete"))),
        }
    }
}
