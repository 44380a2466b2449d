//! A close with the worker stuck, and the staging pre-touch cap.

use super::*;

#[test]
fn a_close_with_the_worker_stuck_returns_within_100_ms_and_the_reaper_frees_it() {
    let d = make_table(RowFormat::Nvfp4, 300);
    let p = open(d.path(), |_| {});
    let (abandoned, reaped) = (
        crate::step::reaper::abandoned_handles(),
        crate::step::reaper::reaped_handles(),
    );
    let (started_tx, started_rx) = mpsc::channel();
    let work = Work::Run(Box::new(move |_: &Table, _: &rayon::ThreadPool| {
        let _ = started_tx.send(());
        std::thread::sleep(std::time::Duration::from_millis(800)); // a read stalled on the device
    }));
    lock(&p.submit_state)
        .tx
        .as_ref()
        .unwrap()
        .send(work)
        .unwrap();
    started_rx.recv().unwrap();
    let t0 = std::time::Instant::now();
    drop(p);
    let took = t0.elapsed();
    assert!(
        took < std::time::Duration::from_millis(100),
        "close took {took:?}"
    );
    assert!(crate::step::reaper::abandoned_handles() > abandoned);
    let t1 = std::time::Instant::now();
    while crate::step::reaper::reaped_handles() <= reaped {
        assert!(t1.elapsed().as_secs() < 10, "the reaper never finished");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // a worker that stops promptly is joined by the close itself
    let p = open(d.path(), |_| {});
    let abandoned = crate::step::reaper::abandoned_handles();
    drop(p);
    assert_eq!(crate::step::reaper::abandoned_handles(), abandoned);
}

/// Staging beyond the pre-touch cap is not touched at open (its pages are not resident), and
/// within it every slot's first `PRETOUCH_MAX_BYTES / slots` bytes are.
#[test]
fn staging_beyond_the_pretouch_cap_is_not_touched_at_open() {
    let d = make_table(RowFormat::Nvfp4, 500);
    // 4 slots of 65,536 tokens × 16 rows × 90 B = 94,371,840 B each: 360 MiB > the 256 MiB cap
    let p = open(d.path(), |o| {
        o.max_tokens_per_step = 65_536;
        o.max_in_flight = 4;
    });
    let ps = crate::sys::os_page_size();
    let per_slot = PRETOUCH_MAX_BYTES / 4;
    assert_eq!(p.sh.staging.len(), 4);
    for (i, s) in p.sh.staging.iter().enumerate() {
        // SAFETY: no step was submitted: nobody writes the slot; mincore only reads the page
        // tables of the mapping.
        let m: &[u8] = unsafe { &*s.0.get() };
        assert_eq!(m.len(), 65_536 * 16 * 90);
        let (head, _) = crate::sys::residency(&m[..per_slot]);
        assert_eq!(
            head as usize,
            per_slot / ps,
            "slot {i}: the pre-touched part"
        );
        // the rest: untouched (a transparent huge page may round the touched part up by 2 MiB)
        let tail = &m[per_slot + (4 << 20)..];
        let (resident, total) = crate::sys::residency(tail);
        assert_eq!(
            resident, 0,
            "slot {i}: {resident} of {total} pages past the cap resident"
        );
    }
}
