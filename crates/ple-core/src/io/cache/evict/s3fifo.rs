//! S3-FIFO eviction (Yang et al., SOSP 2023): a small FIFO in front of a main CLOCK, and a ghost
//! table of the fingerprints of rows dropped from the small FIFO unhit.

use super::super::{Fifo, Shard, mix, reduce};
use super::{pop, push};

/// Whether S3-FIFO's next candidate comes from the small FIFO (else from the main one).
pub(super) fn from_small(small: &Fifo, main: &Fifo, small_cap: usize) -> bool {
    small.len > 0 && (small.len >= small_cap || main.len == 0)
}

impl Shard {
    pub(super) fn evict_s3(
        &self,
        next: &mut [u32],
        small: &mut Fifo,
        main: &mut Fifo,
        small_cap: usize,
        ghost: &mut [u32],
    ) -> u32 {
        loop {
            if from_small(small, main, small_cap) {
                let t = pop(next, small);
                if self.bits(t) > 0 && self.cap > 1 {
                    // hit while in the small FIFO: promote
                    self.set_bits(t, 0);
                    push(next, main, t);
                    continue;
                }
                let h2 = mix(mix(self.header(t) >> 8));
                let g = reduce(h2 as u32, ghost.len());
                ghost[g] = (h2 >> 32) as u32 | 1;
                return t;
            }
            let t = pop(next, main);
            let f = self.bits(t);
            if f > 0 {
                self.set_bits(t, f - 1);
                push(next, main, t);
                continue;
            }
            return t;
        }
    }
}
