//! Eviction of the row cache's shards (S3-FIFO and SIEVE) and the FIFO links they use; under
//! the shard's lock, like every writer.

use super::{Fifo, NIL, Queues, Shard, State, mix, reduce};

/// Links `slot` as `f`'s newest.
pub(super) fn push(next: &mut [u32], f: &mut Fifo, slot: u32) {
    next[slot as usize] = NIL;
    if f.newest == NIL {
        f.oldest = slot;
    } else {
        next[f.newest as usize] = slot;
    }
    f.newest = slot;
    f.len += 1;
}

/// The slot the next eviction of a full shard examines first (NIL if none): a prefetch hint.
pub(super) fn first_examined(q: &Queues) -> u32 {
    match q {
        Queues::S3Fifo {
            small,
            main,
            small_cap,
            ..
        } => {
            if from_small(small, main, *small_cap) {
                small.oldest
            } else {
                main.oldest
            }
        }
        Queues::Sieve { fifo, hand, .. } => {
            if *hand == NIL {
                fifo.oldest
            } else {
                *hand
            }
        }
    }
}

/// Whether S3-FIFO's next candidate comes from the small FIFO (else from the main one).
fn from_small(small: &Fifo, main: &Fifo, small_cap: usize) -> bool {
    small.len > 0 && (small.len >= small_cap || main.len == 0)
}

/// Unlinks `f`'s oldest slot (`f` is not empty).
fn pop(next: &[u32], f: &mut Fifo) -> u32 {
    let s = f.oldest;
    debug_assert_ne!(s, NIL);
    f.oldest = next[s as usize];
    if f.oldest == NIL {
        f.newest = NIL;
    }
    f.len -= 1;
    s
}

impl Shard {
    /// Picks the slot to reuse (the shard is full); the slot stays indexed (the caller removes it).
    pub(super) fn evict(&self, st: &mut State) -> u32 {
        let State { next, q, .. } = st;
        match q {
            Queues::S3Fifo {
                small,
                main,
                small_cap,
                ghost,
            } => self.evict_s3(next, small, main, *small_cap, ghost),
            Queues::Sieve {
                fifo,
                hand,
                hand_prev,
            } => self.evict_sieve(next, fifo, hand, hand_prev),
        }
    }

    fn evict_s3(
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

    fn evict_sieve(
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
