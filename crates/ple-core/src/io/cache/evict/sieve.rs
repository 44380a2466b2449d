//! SIEVE eviction (Zhang et al., NSDI 2024): one FIFO with a visited bit and a hand that moves
//! from the oldest row toward the newest, keeping visited rows in place.

use super::super::{Fifo, NIL, Shard};

impl Shard {
    pub(super) fn evict_sieve(
        &self,
        next: &mut [u32],
        fifo: &mut Fifo,
        hand: &mut u32,
        hand_prev: &mut u32,
    ) -> u32 {
        let (mut prev, mut cur) = if *hand == NIL {
            (NIL, fifo.oldest)
        } else {
            (*hand_prev, *hand)
        };
        while self.bits(cur) != 0 {
            self.set_bits(cur, 0);
            prev = cur;
            cur = next[cur as usize];
            if cur == NIL {
                prev = NIL;
                cur = fifo.oldest;
            }
        }
        let nx = next[cur as usize];
        if prev == NIL {
            fifo.oldest = nx;
        } else {
            next[prev as usize] = nx;
        }
        if fifo.newest == cur {
            fifo.newest = prev;
        }
        fifo.len -= 1;
        *hand = nx;
        *hand_prev = if nx == NIL { NIL } else { prev };
        cur
    }
}
