//! How many rows the read-ahead reader reads per batch. A step submitted while a batch is in
//! flight waits for at most that batch when it has reads of its own (a cached step does not
//! wait for the reader at all), and those reads take the device's latency anyway; so the bound
//! is on what the batch adds beyond one read's latency, in time, not rows: a batch of `n` reads
//! takes about `latency + n / throughput`, and `n` is sized so that `n / throughput` stays within
//! [`AHEAD_BATCH_TARGET`], between [`AHEAD_MIN_ROWS`] and [`AHEAD_MAX_ROWS`]. The reader measures
//! both on its own batches: `latency` is the fastest batch seen lately (it falls at once to a
//! faster batch and rises by 1/16 of the gap per slower one, as a busy device slows down).
//!
//! A batch that a step was submitted during (a collision) drops the size to [`AHEAD_MIN_ROWS`]:
//! while it is in flight its submissions and completions run in the kernel on one of the CPUs
//! the step's threads wake on, and on a kernel without preemption (`PREEMPT_NONE`) a waking
//! thread waits for that work, however low the reader's priority. Steps that follow one another
//! closely (a decode loop) so keep the batches at a few reads; steps far apart (a prefill
//! chunk's compute between them) rarely collide, and once [`COLLISION_HOLD`] has passed since
//! the last collision, clean full batches double the size back.
//! Measured on 2 vCPUs (`ple bench --engine`'s p99 check with 0.5 ms between steps, 5
//! alternating pairs): batches of at most 4 rows gave busy/idle p99 ratios of 0.84–1.61, up to
//! 64 rows 1.72–4.15.
//!
//! Invariant: `rows()` is always within `[min, max]`; after a batch of `n` reads that took `t`
//! with `t - latency` over the target, the next batch is at most `max(min, n * target / (t -
//! latency))` rows (at the throughput just measured its reads fit in the target); a full batch
//! (`n >= rows()`) within half the target doubles the size, so a fast device gets back to deep
//! batches in a few batches; after a collision the next batch is `min` rows.

use std::time::{Duration, Instant};

/// What one batch of reads may add to a step's wait beyond the device's latency.
pub(in crate::step) const AHEAD_BATCH_TARGET: Duration = Duration::from_millis(1);
/// Fewest rows per batch (a slow device still reads ahead, a few reads deep).
pub(in crate::step) const AHEAD_MIN_ROWS: usize = 4;
/// Most rows per batch (the reader's buffer).
pub(in crate::step) const AHEAD_MAX_ROWS: usize = 64;
/// How long after a collision the batches stay at the fewest rows.
pub(in crate::step) const COLLISION_HOLD: Duration = Duration::from_millis(5);

/// The adaptive batch size (see the module doc).
#[derive(Clone, Debug)]
pub(in crate::step) struct BatchSizer {
    rows: usize,
    min: usize,
    max: usize,
    target: Duration,
    /// The device's latency: the fastest batch seen lately (None before the first).
    latency: Option<Duration>,
    /// When the last collision was recorded.
    collided_at: Option<Instant>,
}

impl BatchSizer {
    /// Starts at `min` rows (nothing is known of the device yet).
    pub(in crate::step) fn new(target: Duration, min: usize, max: usize) -> BatchSizer {
        let min = min.max(1);
        BatchSizer {
            rows: min,
            min,
            max: max.max(min),
            target,
            latency: None,
            collided_at: None,
        }
    }

    /// Rows to take for the next batch.
    pub(in crate::step) fn rows(&self) -> usize {
        self.rows
    }

    /// Records a batch of `reads` rows read from the device in `took`, ending at `now`, during
    /// which a step was submitted (`collided`) or not.
    pub(in crate::step) fn record(
        &mut self,
        reads: usize,
        took: Duration,
        collided: bool,
        now: Instant,
    ) {
        if reads == 0 {
            return;
        }
        let lat = match self.latency {
            Some(l) if took > l => l + (took - l) / 16,
            _ => took,
        };
        self.latency = Some(lat);
        let extra = took.saturating_sub(lat);
        let held = self
            .collided_at
            .is_some_and(|t| now.saturating_duration_since(t) < COLLISION_HOLD);
        let fits = |budget: Duration, spent: Duration| {
            let fit = reads as f64 * budget.as_secs_f64() / spent.as_secs_f64();
            (fit as usize).clamp(self.min, self.max)
        };
        if collided {
            self.rows = self.min;
            self.collided_at = Some(now);
        } else if extra > self.target {
            self.rows = fits(self.target, extra).min(self.rows);
        } else if extra * 2 < self.target && reads >= self.rows && !held {
            self.rows = (self.rows * 2).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizer() -> BatchSizer {
        BatchSizer::new(Duration::from_millis(1), 4, 64)
    }

    /// A clock for `record`: `ms` milliseconds after a fixed start.
    fn at(ms: u64) -> Instant {
        thread_local!(static T0: Instant = Instant::now());
        T0.with(|t| *t + Duration::from_millis(ms))
    }

    /// A device of `lat_us` latency and `per_read_us` per read beyond it: the batches' sizes
    /// over `batches` batches.
    fn run(s: &mut BatchSizer, lat_us: u64, per_read_us: u64, batches: usize) -> Vec<usize> {
        (0..batches)
            .map(|_| {
                let n = s.rows();
                s.record(
                    n,
                    Duration::from_micros(lat_us + per_read_us * n as u64),
                    false,
                    at(1000),
                );
                n
            })
            .collect()
    }

    #[test]
    fn fast_full_batches_grow_to_the_most_rows() {
        let mut s = sizer();
        assert_eq!(s.rows(), 4);
        assert_eq!(run(&mut s, 100, 0, 6), [4, 8, 16, 32, 64, 64]);
    }

    #[test]
    fn latency_does_not_count_against_a_batch() {
        // 1 ms per read however deep (a shared, busy device), 5 µs per read of throughput: a
        // batch of 64 adds 0.32 ms, so batches stay deep
        let mut s = sizer();
        let sizes = run(&mut s, 1000, 5, 12);
        assert_eq!(&sizes[..5], [4, 8, 16, 32, 64]);
        assert!(sizes[5..].iter().all(|&n| n == 64), "{sizes:?}");
    }

    #[test]
    fn slow_batches_shrink_it_to_what_fits_in_the_target() {
        let mut s = sizer();
        run(&mut s, 10, 0, 5);
        assert_eq!(s.rows(), 64);
        // 64 reads in 4 ms on a 10 µs latency: about 16 fit in 1 ms
        s.record(64, Duration::from_millis(4), false, at(0));
        assert!((15..=17).contains(&s.rows()), "{}", s.rows());
        // a slow device (0.58 ms per read, 1,736 IOPS, 5 ms latency): the batches stay at
        // 4 to 8 rows, adding at most ~2.3 ms to a step's reads (64 rows would add 37 ms)
        let sizes = run(&mut s, 5000, 580, 40);
        assert!(sizes[2..].iter().all(|&n| n <= 8), "{sizes:?}");
        assert!(
            sizes.iter().all(|&n| n >= 4),
            "never below the fewest: {sizes:?}"
        );
    }

    #[test]
    fn a_partial_batch_or_one_near_the_target_keeps_the_size() {
        let mut s = sizer();
        s.record(4, Duration::from_micros(10), false, at(0));
        assert_eq!(s.rows(), 8);
        // 2 of 8 rows were misses (the rest cached): it says nothing of a full batch's time
        s.record(2, Duration::from_micros(10), false, at(0));
        assert_eq!(s.rows(), 8);
        // 0.7 ms beyond the latency: within [target / 2, target], as is
        s.record(8, Duration::from_micros(710), false, at(0));
        assert_eq!(s.rows(), 8);
        s.record(0, Duration::from_secs(1), false, at(0));
        assert_eq!(s.rows(), 8, "no reads, no news");
    }

    #[test]
    fn a_collision_drops_to_the_fewest_until_the_hold_has_passed() {
        let mut s = sizer();
        run(&mut s, 100, 0, 6);
        assert_eq!(s.rows(), 64);
        // a step was submitted while 64 rows were in flight: the next batch is 4 rows
        s.record(64, Duration::from_micros(100), true, at(2000));
        assert_eq!(s.rows(), 4);
        // steps back to back: every batch collides, the size stays the fewest
        for k in 0..10 {
            s.record(4, Duration::from_micros(100), true, at(2000 + k));
        }
        assert_eq!(s.rows(), 4);
        // clean batches within the hold: no growth
        s.record(4, Duration::from_micros(100), false, at(2012));
        assert_eq!(s.rows(), 4);
        // past it (steps far apart): clean full batches double back to the most
        let hold = COLLISION_HOLD.as_millis() as u64;
        for (k, want) in [8, 16, 32, 64, 64].into_iter().enumerate() {
            let n = s.rows();
            s.record(
                n,
                Duration::from_micros(100),
                false,
                at(2009 + hold + k as u64),
            );
            assert_eq!(s.rows(), want);
        }
    }
}
