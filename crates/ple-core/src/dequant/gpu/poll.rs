//! The pauses of a host-side poll (of a CUDA event, the `consumed` word, a replay's `entered`
//! word): yield the CPU while a short wait is likely, then sleep between checks.

use std::time::{Duration, Instant};

/// How long a poll sleeps between two checks once its spin is over.
const POLL: Duration = Duration::from_micros(20);
/// How long a poll yields the CPU between checks before it sleeps [`POLL`] between them. A
/// sleep lasts `POLL` plus the timer slack (50 µs by default on Linux), so sleeping from the first
/// check would add up to ~70 µs to every host-wait step whose copy had not finished then; the
/// spin covers the copy of a 2,048-token step (≈ 2.9 MB of nvfp4 rows at ≈ 25 GB/s).
const POLL_SPIN: Duration = Duration::from_micros(200);

/// What a poll does between two checks, `elapsed` after it began: yield the CPU (`None`) within
/// [`POLL_SPIN`], else sleep for the duration returned.
fn poll_pause(elapsed: Duration) -> Option<Duration> {
    (elapsed >= POLL_SPIN).then_some(POLL)
}

/// The pauses between the checks of one poll (of an event, the `consumed` word, a replay's
/// `entered` word): yielding for [`POLL_SPIN`], then sleeping [`POLL`] each.
pub(super) struct Poll(Instant);

impl Poll {
    pub(super) fn start() -> Poll {
        Poll(Instant::now())
    }

    /// Call between two checks.
    pub(super) fn pause(&self) {
        match poll_pause(self.0.elapsed()) {
            None => std::thread::yield_now(),
            Some(d) => std::thread::sleep(d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_yields_within_its_spin_then_sleeps() {
        assert_eq!(poll_pause(Duration::ZERO), None);
        assert_eq!(poll_pause(POLL_SPIN - Duration::from_nanos(1)), None);
        assert_eq!(poll_pause(POLL_SPIN), Some(POLL));
        assert_eq!(poll_pause(Duration::from_secs(1)), Some(POLL));
        // past its spin a pause really sleeps: never shorter than POLL
        let p = Poll(Instant::now() - POLL_SPIN);
        let t = Instant::now();
        p.pause();
        assert!(t.elapsed() >= POLL, "{:?}", t.elapsed());
    }

    /// Within its spin a poll checks again right away: a pause then lasts a yield, where a
    /// sleeping poll's lasts at least POLL (20 µs). The best of 30 pauses, so that a loaded
    /// machine descheduling the thread in some does not matter.
    #[test]
    fn within_its_spin_a_poll_checks_again_without_sleeping() {
        let mut best = Duration::MAX;
        for _ in 0..30 {
            let p = Poll::start();
            let t = Instant::now();
            p.pause();
            best = best.min(t.elapsed());
        }
        assert!(
            best < POLL / 2,
            "shortest pause {best:?} (a sleep: >= {POLL:?})"
        );
    }
}
