//! Eviction of the row cache's shards: the FIFO links every policy uses and the dispatch to the
//! shard's policy, one file each ([`s3fifo`], [`sieve`]). Under the shard's lock, like every
//! writer.

mod s3fifo;
mod sieve;

use super::{Fifo, NIL, Queues, Shard, State};
use s3fifo::from_small;

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
}
