//! Where a step's row-cache lookups run, on the calling thread or split over the gather pool:
//! chosen by what each way has measured on this machine, per size class of the step.
//!
//! Splitting is not free: the pool's threads are woken and the rows' cache lines move to other
//! CPUs. On a 2-vCPU VM a 1,024-row step whose rows were all cached (and in the CPU caches)
//! measured 23–24 µs of lookups on the worker alone against 38–44 µs split over the pool
//! (`ple bench steady`, the all-cached step's stage means); for big steps, or rows far from any
//! CPU cache, the split wins. So for each size class (rows in `[2^k, 2^(k+1))`, from
//! [`PARALLEL_MIN_ROWS`]) an exponentially weighted mean of picoseconds per row is kept for each
//! way; the cheaper way is taken, a way without a figure is tried first, and every
//! [`EXPLORE`]-th step of a class takes the other way, so that a change (colder rows, other load
//! on the machine) is seen. A wrong choice costs only time: the rows are the same either way.

use crate::io::mmap::gather::{PARALLEL_MIN_ROWS, runs_on_pool};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// Size classes: `[1024, 2048)`, `[2048, 4096)`, …, the last open-ended.
const CLASSES: usize = 8;
/// One step in this many of a class takes the way not preferred.
const EXPLORE: u64 = 32;
/// Weight of a new figure in the mean: 1/2^`SHIFT`.
const SHIFT: u32 = 3;

/// The measured choice (see the module doc). Shared by reference: every field is an atomic
/// word, written by the thread that looks up (a race between two only blends their figures).
#[derive(Debug, Default)]
pub struct Placement {
    classes: [Class; CLASSES],
}

#[derive(Debug, Default)]
struct Class {
    /// Mean ps per row on the calling thread and on the pool (0: not measured yet).
    here: AtomicU64,
    pooled: AtomicU64,
    steps: AtomicU64,
}

impl Placement {
    fn class(rows: usize) -> usize {
        let k = (rows.max(PARALLEL_MIN_ROWS) / PARALLEL_MIN_ROWS).ilog2() as usize;
        k.min(CLASSES - 1)
    }

    /// Whether the way measured cheaper for `rows` is the pool (no figure: the pool, the way
    /// big steps ran before any measurement). Counts nothing.
    pub fn prefers_pool(&self, rows: usize) -> bool {
        let c = &self.classes[Placement::class(rows)];
        let (here, pooled) = (c.here.load(Relaxed), c.pooled.load(Relaxed));
        pooled == 0 || (here != 0 && pooled < here)
    }

    /// Whether the next lookups of `rows` rows run on `pool`: never when the set is too small
    /// to split (or the pool has one thread); else the way not measured yet, or every
    /// [`EXPLORE`]-th time the other way, or the cheaper.
    pub fn choose(&self, rows: usize, pool: &rayon::ThreadPool) -> bool {
        if !runs_on_pool(rows, pool) {
            return false;
        }
        let c = &self.classes[Placement::class(rows)];
        let n = c.steps.fetch_add(1, Relaxed);
        let (here, pooled) = (c.here.load(Relaxed), c.pooled.load(Relaxed));
        if pooled == 0 || here == 0 {
            return pooled == 0;
        }
        (pooled < here) != (n % EXPLORE == EXPLORE - 1)
    }

    /// The means of `rows`'s class, ps per row (on the calling thread, on the pool; 0: none).
    pub fn figures(&self, rows: usize) -> (u64, u64) {
        let c = &self.classes[Placement::class(rows)];
        (c.here.load(Relaxed), c.pooled.load(Relaxed))
    }

    /// Records that `rows` rows took `took`, on the pool or not.
    pub fn record(&self, rows: usize, pooled: bool, took: Duration) {
        if rows < PARALLEL_MIN_ROWS {
            return;
        }
        let c = &self.classes[Placement::class(rows)];
        let mean = if pooled { &c.pooled } else { &c.here };
        let ps = (took.as_nanos().saturating_mul(1000) / rows as u128).clamp(1, u64::MAX as u128);
        let old = mean.load(Relaxed);
        let new = if old == 0 {
            ps as u64
        } else {
            let (o, x) = (old as i128, ps as i128);
            (o + ((x - o) >> SHIFT)).max(1) as u64
        };
        mean.store(new, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
    }

    #[test]
    fn small_sets_and_one_thread_pools_never_split() {
        let p = Placement::default();
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        assert!(!p.choose(PARALLEL_MIN_ROWS - 1, &pool()));
        assert!(!p.choose(1 << 20, &one));
    }

    #[test]
    fn each_way_is_measured_then_the_cheaper_taken_and_the_other_revisited() {
        let (p, pool) = (Placement::default(), pool());
        let rows = 1024;
        // nothing measured: the pool first, then (pool measured) the calling thread
        assert!(p.choose(rows, &pool));
        p.record(rows, true, Duration::from_micros(40));
        assert!(!p.choose(rows, &pool));
        p.record(rows, false, Duration::from_micros(20));
        // the calling thread measured cheaper: taken, except one step in EXPLORE
        let picks: Vec<bool> = (0..2 * EXPLORE).map(|_| p.choose(rows, &pool)).collect();
        assert_eq!(picks.iter().filter(|&&x| x).count(), 2, "{picks:?}");
        assert!(!p.prefers_pool(rows));
        // the pool grows cheaper (the rows went cold for one thread): the preference turns
        for _ in 0..40 {
            p.record(rows, false, Duration::from_micros(80));
        }
        assert!(p.prefers_pool(rows));
        // another size class is measured apart
        assert!(p.prefers_pool(8 * rows) && p.choose(8 * rows, &pool));
    }

    #[test]
    fn the_mean_moves_an_eighth_of_the_way() {
        let p = Placement::default();
        p.record(1024, false, Duration::from_nanos(8 * 1024)); // 8 ns a row
        p.record(1024, false, Duration::from_nanos(16 * 1024)); // then 16
        assert_eq!(p.classes[0].here.load(Relaxed), 9000);
        assert_eq!(Placement::class(2047), 0);
        assert_eq!(Placement::class(2048), 1);
        assert_eq!(Placement::class(usize::MAX), CLASSES - 1);
    }
}
