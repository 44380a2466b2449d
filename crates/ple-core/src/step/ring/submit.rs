//! The submit side of [`Completion`]: taking a step's slot (per the ring-full policy), and
//! giving it back when the submit cannot hand the step on.

use super::{Completion, Parked, Ring, SlotState};
use crate::error::{Error, Result};
use crate::stats::{self, Stats};
use crate::step::options::RingFullPolicy;
use crate::sync::lock;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Completion {
    /// Takes a slot for step `seq` of `tokens` tokens and marks it Pending: with `slot_by_seq`
    /// exactly `seq % slots` (free, or holding a step a graph replay consumed), else the next
    /// Free slot in ring order. While none is free, `policy` applies: `Error` fails at once,
    /// `Wait` parks up to `timeout_us` (counted in `stats.wait_ns`; a timeout in
    /// `stats.timeouts`). Returns the slot.
    pub(in crate::step) fn acquire(
        &self,
        seq: u64,
        tokens: u32,
        policy: RingFullPolicy,
        timeout_us: u64,
        stats: &Stats,
    ) -> Result<usize> {
        let mut ring = lock(&self.ring);
        let free = |r: &Ring| self.free_slot_for(r, seq);
        if free(&ring).is_none() {
            let oldest = ring.slots.iter().filter_map(|s| s.seq()).min().unwrap_or(0);
            if policy == RingFullPolicy::Error {
                return Err(self.ring_full_error(&ring, seq, oldest));
            }
            let t0 = Instant::now();
            let deadline = t0.checked_add(Duration::from_micros(timeout_us));
            let (r, parked) = self.park(ring, deadline, |r| free(r).is_some());
            ring = r;
            stats
                .wait_ns
                .fetch_add(stats::ns(t0.elapsed()), Ordering::Relaxed);
            if parked == Parked::Closing {
                return Err(Error::State(
                    "the handle was closed while ple_submit waited for a ring slot".into(),
                ));
            }
            if parked == Parked::TimedOut {
                stats.timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(Error::Timeout(format!(
                    "ring full for {timeout_us} µs: all {} slots hold steps not consumed \
                     (oldest {oldest})",
                    ring.slots.len()
                )));
            }
        }
        let slot = free(&ring).expect("a free slot");
        self.reclaim_graph_consumed(&mut ring);
        ring.slots[slot] = SlotState::Pending { seq, tokens };
        ring.note_submitted(seq);
        ring.next_slot = (slot + 1) % ring.slots.len();
        Ok(slot)
    }

    /// Gives back the slot of a submit that could not hand its step on (still Pending): the
    /// slot is Free again, and with `failure` the step keeps that error for its waiters.
    pub(in crate::step) fn cancel(&self, seq: u64, slot: usize, failure: Option<Error>) {
        let mut ring = lock(&self.ring);
        if ring.slots[slot].seq() == Some(seq) {
            ring.slots[slot] = SlotState::Free;
        }
        if let Some(e) = failure {
            ring.failed.push_back((seq, e));
        }
        drop(ring);
        self.notify();
    }

    /// The slot step `seq` may take now, if any: with `slot_by_seq` exactly `seq % slots` (free,
    /// or holding a step a graph replay consumed); else the next Free slot in ring order (any
    /// free slot, so sparse seqs use the whole ring).
    fn free_slot_for(&self, r: &Ring, seq: u64) -> Option<usize> {
        let n = r.slots.len();
        if self.slot_by_seq {
            let s = (seq % n as u64) as usize;
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
    fn ring_full_error(&self, ring: &Ring, seq: u64, oldest: u64) -> Error {
        let n = ring.slots.len();
        let target = (seq % n as u64) as usize;
        Error::State(if self.slot_by_seq {
            format!(
                "ring full: slot {target} (seq % {n}) holds step {} not yet consumed; \
                 consume steps with ple_dequant_* or ple_release_step",
                ring.slots[target].seq().unwrap_or(0)
            )
        } else {
            format!(
                "ring full: all {n} slots hold steps not yet consumed (oldest {oldest}); \
                 consume steps with ple_dequant_* or ple_release_step"
            )
        })
    }
}
