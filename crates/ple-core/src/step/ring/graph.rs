//! CUDA Graph mode's part of [`Completion`]: a Ready step counts as consumed once graph
//! replays consumed it, and its slot is reclaimed.

use super::{Completion, Ring};
use crate::error::Result;
use crate::sync::lock;
use std::sync::atomic::Ordering;

impl Completion {
    /// Enters CUDA Graph mode from step `base_seq` on: under the ring's lock, frees the Ready
    /// steps replays consumed under the previous base (else they would hold their slots forever:
    /// the new base no longer counts them), runs `prepare` (which may refuse), and only then
    /// records the base.
    pub(in crate::step) fn rebase_graph(
        &self,
        base_seq: u64,
        prepare: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut ring = lock(&self.ring);
        self.reclaim_graph_consumed(&mut ring);
        prepare()?;
        self.graph_base.store(base_seq, Ordering::Release);
        drop(ring);
        self.notify();
        Ok(())
    }

    /// Whether Ready step `seq` was consumed by a CUDA Graph replay (graph mode only).
    pub(super) fn graph_consumed(&self, seq: u64) -> bool {
        let base = self.graph_base();
        self.replays
            .as_ref()
            .is_some_and(|c| base != 0 && seq >= base && c() >= seq)
    }

    /// Frees the slots of Ready steps a CUDA Graph replay consumed.
    pub(super) fn reclaim_graph_consumed(&self, ring: &mut Ring) {
        if let Some(c) = &self.replays {
            ring.reclaim_graph_consumed(self.graph_base(), c());
        }
    }
}
