//! When the next step is due, so that the read-ahead reader starts no batch that would still be
//! in flight when it comes. An engine submits its steps at a steady cadence (a decode step, then
//! the layers' compute, then the next; a prefill chunk, then its compute): the reader reads in
//! the gap after a step is done and keeps quiet from one batch (plus a margin) before the next
//! step is due until a little after, or until that step is done. On a kernel without preemption
//! a batch's submissions and completions delay a step's threads on the CPUs they share (see
//! `sizer`'s doc); avoiding the collision beats shrinking the batch it hits.
//!
//! The prediction: the last submit plus the shortest of the last [`PERIODS`] intervals between
//! submits (an early guess costs the reader a short wait; a late one, a collision as without a
//! prediction). The window starts [`BATCH_SAFETY`] batches (the batches' time varies with the
//! device's) and [`MARGIN`] before the predicted submit and ends [`slack`](Cadence::quiet_until)
//! after it, by when a step that came on time is done. Where that window would take more than
//! half the interval (steps close together), it starts one batch and the margin before the
//! submit instead: the reader then reads one batch right after each step, done before the next
//! (at 0.5 ms between steps on 2 vCPUs, 1–2% of the steps met a batch in flight against 93%
//! reading without a window). No window while fewer than [`MIN_PERIODS`] intervals are known,
//! when even one batch, the margin and the slack take the whole interval (the sizer's collision
//! rule keeps the batches short there instead, and the reader keeps reading), or once the step
//! is overdue by the slack (the engine paused: nothing is due).
//!
//! Invariants: a window leaves at least a batch's time of every interval to start a batch in;
//! it takes more than half the interval only as one batch + [`MARGIN`] + the slack; and at most
//! `BATCH_SAFETY` batches + [`MARGIN`] + [`SLACK_MAX`].

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Intervals between submits remembered.
const PERIODS: usize = 8;
/// Intervals needed before any window.
const MIN_PERIODS: u64 = 4;
/// Batches of the recent mean time kept free before the predicted submit.
pub(in crate::step) const BATCH_SAFETY: u32 = 2;
/// Kept free before the predicted submit beyond one batch: the reader's own CPU work and the
/// wake-ups around a batch.
pub(in crate::step) const MARGIN: Duration = Duration::from_micros(100);
/// How long past the predicted submit the reader still waits for it: a quarter of the
/// interval, within these bounds.
const SLACK_MIN: Duration = Duration::from_micros(100);
pub(in crate::step) const SLACK_MAX: Duration = Duration::from_millis(2);

/// The submits' cadence. Written by the submitting threads (atomics: two racing submits only
/// blend their figures), read by the reader.
#[derive(Debug)]
pub(in crate::step) struct Cadence {
    base: Instant,
    /// The last submit, ns after `base` (0: none yet).
    last: AtomicU64,
    /// The last intervals between submits, ns (ring by `count`).
    periods: [AtomicU64; PERIODS],
    count: AtomicU64,
}

impl Cadence {
    pub(in crate::step) fn new() -> Cadence {
        Cadence {
            base: Instant::now(),
            last: AtomicU64::new(0),
            periods: Default::default(),
            count: AtomicU64::new(0),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        // (+1: 0 means "none yet")
        t.saturating_duration_since(self.base).as_nanos() as u64 + 1
    }

    /// Records a step submitted at `now`.
    pub(in crate::step) fn submitted(&self, now: Instant) {
        let t = self.ns(now);
        let prev = self.last.swap(t, Relaxed);
        if prev != 0 && t > prev {
            let i = self.count.fetch_add(1, Relaxed) as usize % PERIODS;
            self.periods[i].store(t - prev, Relaxed);
        }
    }

    /// The shortest recent interval between submits and its slack (ns), and the last submit;
    /// None while fewer than [`MIN_PERIODS`] intervals are known.
    fn prediction(&self) -> Option<(u64, u64, u64)> {
        let n = self.count.load(Relaxed);
        let last = self.last.load(Relaxed);
        if n < MIN_PERIODS || last == 0 {
            return None;
        }
        let known = (n as usize).min(PERIODS);
        let period = self.periods[..known]
            .iter()
            .map(|p| p.load(Relaxed))
            .filter(|&p| p > 0)
            .min()?;
        let slack = Duration::from_nanos(period / 4)
            .clamp(SLACK_MIN, SLACK_MAX)
            .as_nanos() as u64;
        Some((period, slack, last))
    }

    /// The longest batch that leaves a window between the steps (see the module doc), while
    /// steps come at a cadence (not past the slack of the next one at `now`); None otherwise.
    /// The reader's batches are sized to it.
    pub(in crate::step) fn batch_room(&self, now: Instant) -> Option<Duration> {
        let (period, slack, last) = self.prediction()?;
        if self.ns(now) >= last + period + slack {
            return None;
        }
        let room = (period / 2).saturating_sub(slack + MARGIN.as_nanos() as u64);
        Some(Duration::from_nanos(room / BATCH_SAFETY as u64))
    }

    /// If `now` is within the quiet window around the next predicted submit (for batches that
    /// take `batch` lately), when the window ends; else None (the reader may start a batch).
    /// The slack after the predicted submit is a quarter of the interval, within
    /// [`SLACK_MIN`]..=[`SLACK_MAX`].
    pub(in crate::step) fn quiet_until(&self, now: Instant, batch: Duration) -> Option<Instant> {
        let (period, slack, last) = self.prediction()?;
        let mut before = (batch * BATCH_SAFETY + MARGIN).as_nanos() as u64;
        if before.saturating_add(slack) > period / 2 {
            // steps close together: room for one batch only, right after a step
            before = (batch + MARGIN).as_nanos() as u64;
            if before.saturating_add(slack) >= period {
                return None;
            }
        }
        let next = last + period;
        let (start, end) = (next - before, next + slack);
        let t = self.ns(now);
        (start <= t && t < end).then(|| self.base + Duration::from_nanos(end - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// `n` submits `period_us` apart from `t0`; returns the last one's instant.
    fn steady(c: &Cadence, t0: Instant, period_us: u32, n: u32) -> Instant {
        let mut t = t0;
        for k in 0..n {
            t = t0 + US * period_us * k;
            c.submitted(t);
        }
        t
    }

    /// At `at_us` after `last`, `c` is in a quiet window (for batches of `batch`) that ends
    /// at `end_us` after `last`.
    fn assert_window_ends(c: &Cadence, last: Instant, at_us: u32, batch: Duration, end_us: u32) {
        let until = c
            .quiet_until(last + US * at_us, batch)
            .expect("in the window");
        let end = until.duration_since(last);
        assert!(end > US * (end_us - 1) && end <= US * end_us, "{end:?}");
    }

    #[test]
    fn no_window_until_the_cadence_is_known() {
        let c = Cadence::new();
        let last = steady(&c, Instant::now(), 2000, MIN_PERIODS as u32); // one interval short
        assert_eq!(c.quiet_until(last + US * 1900, US * 100), None);
        c.submitted(last + US * 2000);
        assert!(c.quiet_until(last + US * 3900, US * 100).is_some());
    }

    #[test]
    fn the_window_spans_two_batches_and_the_margin_before_the_submit_to_the_slack_after() {
        let c = Cadence::new();
        let last = steady(&c, Instant::now(), 2000, 10);
        let batch = US * 100;
        // next submit due at +2,000 µs: window [+1,700, +2,500) (2 × 100 + 100 before, a
        // quarter of the interval after)
        assert_eq!(
            c.quiet_until(last + US * 10, batch),
            None,
            "right after a step"
        );
        assert_eq!(c.quiet_until(last + US * 1690, batch), None);
        assert_window_ends(&c, last, 1710, batch, 2500);
        assert!(c.quiet_until(last + US * 2490, batch).is_some());
        assert_eq!(
            c.quiet_until(last + US * 2510, batch),
            None,
            "overdue past the slack: nothing is due"
        );
        // the next submit moves the window an interval on
        c.submitted(last + US * 2000);
        assert_eq!(c.quiet_until(last + US * 2100, batch), None);
        assert!(c.quiet_until(last + US * 3750, batch).is_some());
    }

    #[test]
    fn the_shortest_recent_interval_is_the_prediction() {
        let c = Cadence::new();
        let mut t = Instant::now();
        c.submitted(t);
        for p in [4000u32, 4000, 2000, 4000, 4000] {
            t += US * p;
            c.submitted(t);
        }
        // due at +2,000 (the shortest), not +4,000
        assert!(c.quiet_until(t + US * 1750, US * 100).is_some());
        assert_eq!(c.quiet_until(t + US * 3000, US * 100), None);
        assert_eq!(c.quiet_until(t + US * 3750, US * 100), None);
    }

    #[test]
    fn steps_close_together_keep_one_batch_free_before_the_next() {
        // 600 µs intervals: 2 × 100 + 100 before and 150 after is more than half of them, so
        // one batch + the margin before and the slack after: [+400, +750)
        let c = Cadence::new();
        let last = steady(&c, Instant::now(), 600, 10);
        let batch = US * 100;
        assert_eq!(c.quiet_until(last + US * 160, batch), None, "after a step");
        assert_eq!(c.quiet_until(last + US * 390, batch), None);
        assert_window_ends(&c, last, 410, batch, 750);
        // a batch too long for any room in the interval: no window (short batches instead)
        for at in (0..600).step_by(10) {
            assert_eq!(c.quiet_until(last + US * at, US * 400), None, "{at}");
        }
        // a 20 ms cadence with batches of 3 ms: 6.1 ms before and 2 ms after fit in half of it;
        // with batches of 5 ms they do not: 5.1 ms before
        let c = Cadence::new();
        let last = steady(&c, Instant::now(), 20_000, 10);
        assert!(c.quiet_until(last + US * 14_000, US * 3000).is_some());
        assert_eq!(c.quiet_until(last + US * 14_000, US * 5000), None);
        assert!(c.quiet_until(last + US * 15_000, US * 5000).is_some());
    }

    #[test]
    fn a_window_leaves_room_for_a_batch_in_every_interval_and_is_bounded() {
        for period in [600u32, 1000, 5000, 20_000, 600_000] {
            for batch_us in [10u32, 100, 1000, 4000] {
                let c = Cadence::new();
                let last = steady(&c, Instant::now(), period, 10);
                let batch = US * batch_us;
                let quiet = (0..2 * period)
                    .step_by(5)
                    .filter(|&at| c.quiet_until(last + US * at, batch).is_some())
                    .count() as u32
                    * 5;
                // over half the interval only as one batch + the margin + the slack, which
                // leaves a batch's room
                if quiet > period / 2 {
                    let slack = (US * period / 4).clamp(SLACK_MIN, SLACK_MAX);
                    assert!(
                        US * quiet <= batch + MARGIN + slack + US * 5,
                        "{period} {batch_us}: {quiet} µs"
                    );
                }
                assert!(
                    quiet == 0 || quiet + batch_us < period,
                    "{period} {batch_us}: {quiet} µs"
                );
                let most = batch * BATCH_SAFETY + MARGIN + SLACK_MAX;
                assert!(
                    US * quiet <= most + US * 5,
                    "{period} {batch_us}: {quiet} µs"
                );
            }
        }
    }
}
