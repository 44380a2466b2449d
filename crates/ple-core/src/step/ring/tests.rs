//! The completion protocol alone: no table, no worker, no I/O. Slots are acquired, published,
//! claimed, released and cancelled by hand, and each step's state is checked against what the
//! protocol promises.

use super::*;
use crate::stats::Stats;
use crate::step::options::RingFullPolicy;
use std::sync::Arc;

fn ring(slots: usize, slot_by_seq: bool) -> Completion {
    Completion::new(slots, slot_by_seq, None, false)
}

fn acquire(c: &Completion, seq: u64, policy: RingFullPolicy, timeout_us: u64) -> Result<usize> {
    c.acquire(seq, 1, policy, timeout_us, &Stats::default())
}

#[test]
fn a_step_goes_pending_ready_consuming_free() {
    let c = ring(2, false);
    let s = acquire(&c, 1, RingFullPolicy::Error, 0).unwrap();
    assert!(matches!(c.status(1).unwrap(), StepStatus::Pending { .. }));
    assert_eq!(c.done(), 0);
    c.publish(1, s, Ok(()));
    assert_eq!(c.done(), 1);
    assert!(matches!(
        c.status(1).unwrap(),
        StepStatus::Ready { slot, tokens: 1 } if slot == s
    ));
    let (slot, tokens) = c.claim(1, Ok(())).unwrap();
    assert_eq!((slot, tokens), (s, 1));
    assert!(matches!(c.status(1).unwrap(), StepStatus::Consuming));
    let e = c.claim(1, Ok(())).unwrap_err();
    assert!(e.to_string().contains("already being consumed"), "{e}");
    // a failed consumer leaves the step Ready for a retry
    c.end_claim(1, slot, tokens, false);
    assert!(matches!(c.status(1).unwrap(), StepStatus::Ready { .. }));
    let (slot, tokens) = c.claim(1, Ok(())).unwrap();
    c.end_claim(1, slot, tokens, true);
    assert_eq!(c.slot_states(), vec![SlotState::Free; 2]);
    assert_eq!(
        c.status_for_wait(1).unwrap().map(|_| ()),
        None,
        "left the ring"
    );
    assert!(
        c.status(1)
            .unwrap_err()
            .to_string()
            .contains("not in the ring")
    );
    assert!(
        c.status(2)
            .unwrap_err()
            .to_string()
            .contains("never submitted")
    );
}

#[test]
fn a_full_ring_errors_or_times_out_and_never_overwrites() {
    let c = ring(2, false);
    let a = acquire(&c, 1, RingFullPolicy::Error, 0).unwrap();
    let b = acquire(&c, 2, RingFullPolicy::Error, 0).unwrap();
    assert_ne!(a, b);
    let e = acquire(&c, 3, RingFullPolicy::Error, 0).unwrap_err();
    assert!(e.to_string().contains("ring full: all 2 slots"), "{e}");
    let st = Stats::default();
    let e = c
        .acquire(3, 1, RingFullPolicy::Wait, 2_000, &st)
        .unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert_eq!(st.timeouts.load(Ordering::Relaxed), 1);
    assert!(st.wait_ns.load(Ordering::Relaxed) >= 2_000_000);
    // neither step was touched
    assert_eq!(
        c.slot_states()
            .iter()
            .filter_map(|s| s.seq())
            .collect::<Vec<_>>()
            .len(),
        2
    );
    assert!(matches!(c.status(1).unwrap(), StepStatus::Pending { .. }));
    assert!(matches!(c.status(2).unwrap(), StepStatus::Pending { .. }));
}

#[test]
fn a_parked_submit_takes_the_slot_a_release_frees() {
    let c = Arc::new(ring(1, false));
    let s = acquire(&c, 1, RingFullPolicy::Error, 0).unwrap();
    c.publish(1, s, Ok(()));
    let c2 = c.clone();
    let t = std::thread::spawn(move || acquire(&c2, 2, RingFullPolicy::Wait, 20_000_000));
    std::thread::sleep(Duration::from_millis(20));
    assert!(!t.is_finished(), "the submit must wait for the slot");
    c.release(1, Ok(())).unwrap();
    assert_eq!(t.join().unwrap().unwrap(), s);
    assert!(matches!(c.status(2).unwrap(), StepStatus::Pending { .. }));
}

#[test]
fn close_wakes_parked_threads() {
    let c = Arc::new(ring(1, false));
    acquire(&c, 1, RingFullPolicy::Error, 0).unwrap();
    let (c2, c3) = (c.clone(), c.clone());
    let submit = std::thread::spawn(move || acquire(&c2, 2, RingFullPolicy::Wait, u64::MAX / 2));
    let waiter = std::thread::spawn(move || c3.park_until_done(1, None));
    std::thread::sleep(Duration::from_millis(20));
    c.close();
    let e = submit.join().unwrap().unwrap_err();
    assert!(
        e.to_string().contains("closed while ple_submit waited"),
        "{e}"
    );
    assert_eq!(waiter.join().unwrap(), Parked::Closing);
    assert!(c.closing());
}

#[test]
fn a_failed_step_frees_its_slot_and_keeps_its_error_until_released() {
    let c = ring(2, false);
    let s = acquire(&c, 1, RingFullPolicy::Error, 0).unwrap();
    c.publish(1, s, Err(Error::State("boom".into())));
    assert_eq!((c.done(), c.last_failed()), (1, 1));
    assert_eq!(c.slot_states()[s], SlotState::Free);
    assert!(matches!(c.status(1).unwrap(), StepStatus::Failed(Error::State(m)) if m == "boom"));
    // a consumer gets the error and the record is gone
    let e = c.claim(1, Ok(())).unwrap_err();
    assert_eq!(e.to_string(), Error::State("boom".into()).to_string());
    assert_eq!(c.status_for_wait(1).unwrap().map(|_| ()), None);
    // releasing a failed step succeeds and forgets the error
    let s = acquire(&c, 2, RingFullPolicy::Error, 0).unwrap();
    c.publish(2, s, Err(Error::State("again".into())));
    c.release(2, Ok(())).unwrap();
    assert!(c.status_for_wait(2).unwrap().is_none());
}

#[test]
fn a_cancelled_submit_gives_its_slot_back() {
    let c = ring(1, false);
    let s = acquire(&c, 1, RingFullPolicy::Error, 0).unwrap();
    c.cancel(1, s, None);
    assert_eq!(c.slot_states(), vec![SlotState::Free]);
    let s = acquire(&c, 2, RingFullPolicy::Error, 0).unwrap();
    c.cancel(
        2,
        s,
        Some(Error::State("the worker thread has stopped".into())),
    );
    assert!(matches!(c.status(2).unwrap(), StepStatus::Failed(_)));
    assert_eq!(c.done(), 0, "a cancelled step is never published");
}

#[test]
fn slot_by_seq_takes_exactly_seq_mod_slots() {
    let c = ring(3, true);
    assert_eq!(acquire(&c, 4, RingFullPolicy::Error, 0).unwrap(), 1);
    assert_eq!(acquire(&c, 6, RingFullPolicy::Error, 0).unwrap(), 0);
    // slot 2 is free, but step 7 belongs in slot 1
    let e = acquire(&c, 7, RingFullPolicy::Error, 0).unwrap_err();
    assert!(
        e.to_string()
            .contains("ring full: slot 1 (seq % 3) holds step 4"),
        "{e}"
    );
    // a step claimed early (device waits) is left alone by its publish
    let tokens = c.claim_early(4, 1).unwrap();
    c.publish(4, 1, Ok(()));
    assert_eq!(c.slot_states()[1], SlotState::Consuming { seq: 4, tokens });
    let e = c.claim_early(6, 1).unwrap_err();
    let want = format!(
        "step 6 is not in ring slot 1 (seq % 3): the slot holds step 4 ({tokens} tokens), being consumed"
    );
    assert!(e.to_string().contains(&want), "{e}");
    c.end_claim(4, 1, tokens, true);
    assert_eq!(acquire(&c, 7, RingFullPolicy::Error, 0).unwrap(), 1);
}

#[test]
fn graph_replays_free_the_ready_steps_they_consumed() {
    let consumed = Arc::new(AtomicU64::new(0));
    let c2 = consumed.clone();
    let c = Completion::new(
        2,
        true,
        Some(Box::new(move || c2.load(Ordering::SeqCst))),
        true,
    );
    for seq in [1, 2] {
        let s = acquire(&c, seq, RingFullPolicy::Error, 0).unwrap();
        c.publish(seq, s, Ok(()));
    }
    // not in graph mode: a replay's word means nothing
    consumed.store(2, Ordering::SeqCst);
    assert!(acquire(&c, 3, RingFullPolicy::Error, 0).is_err());
    // a refused prepare changes nothing
    let e = c
        .rebase_graph(1, || Err(Error::State("no".into())))
        .unwrap_err();
    assert!(e.to_string().contains("no"));
    assert_eq!(c.graph_base(), 0);
    c.rebase_graph(1, || Ok(())).unwrap();
    assert_eq!(c.graph_base(), 1);
    assert_eq!(acquire(&c, 3, RingFullPolicy::Error, 0).unwrap(), 1);
    assert!(
        c.status_for_wait(1).unwrap().is_none(),
        "consumed by a replay"
    );
}

#[test]
fn clone_error_keeps_kind_and_message() {
    let e = Error::io("reading", std::io::Error::other("disk"));
    let c = clone_error(&e);
    assert_eq!(c.to_string(), e.to_string());
    assert_eq!(c.kind(), e.kind());
}

#[test]
fn reclaim_frees_exactly_the_ready_steps_replays_consumed() {
    let mut r = Ring {
        slots: vec![
            SlotState::Ready { seq: 8, tokens: 1 },
            SlotState::Ready { seq: 5, tokens: 1 },
            SlotState::Pending { seq: 6, tokens: 1 },
            SlotState::Ready { seq: 7, tokens: 1 },
            SlotState::Ready { seq: 4, tokens: 1 },
        ],
        failed: VecDeque::new(),
        last_seq: 8,
        next_slot: 0,
        skipped: VecDeque::from([(2, 3)]),
    };
    let before = r.slots.clone();
    r.reclaim_graph_consumed(0, 100); // not in graph mode: nothing is a replay's
    assert_eq!(r.slots, before);
    r.reclaim_graph_consumed(5, 7);
    assert_eq!(
        r.slots,
        vec![
            SlotState::Ready { seq: 8, tokens: 1 }, // not consumed yet
            SlotState::Free,
            SlotState::Pending { seq: 6, tokens: 1 }, // never Ready: untouched
            SlotState::Free,
            SlotState::Ready { seq: 4, tokens: 1 }, // before the base: not a replay's
        ]
    );
    assert!(r.left_ring(5) && r.left_ring(7) && r.left_ring(1));
    assert!(!r.left_ring(8) && !r.left_ring(9) && !r.left_ring(0));
    assert!(
        !r.left_ring(2) && !r.left_ring(3),
        "skipped seqs were never submitted"
    );
    r.note_submitted(12);
    assert_eq!(r.last_seq, 12);
    assert!(!r.left_ring(10) && r.skipped.back() == Some(&(9, 11)));
}
