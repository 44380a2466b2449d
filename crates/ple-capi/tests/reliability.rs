//! Reliability contracts of the C API (docs/RELIABILITY.md, "C API and pipeline"): callbacks
//! never run under a libple lock, every blocking call wakes on close, handles are never
//! confused after close, options are bounded by the machine, a step is consumed only by a call
//! that succeeds, and `ple_wait(.., 0)` polls. (The log-callback contracts: `log_callback.rs`.)

#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use ple::*;
use std::ffi::c_void;
use std::time::{Duration, Instant};

#[test]
fn ten_thousand_closed_handles_stay_invalid() {
    let (_d, dir) = table();
    let o = options(|o| o.max_in_flight = 1);
    let mut seen = std::collections::HashSet::new();
    let mut prev: *mut ple_handle = std::ptr::null_mut();
    for i in 0..10_000 {
        let h = open(&dir, &o);
        assert!(
            seen.insert(h as usize),
            "cycle {i}: handle value {h:p} was handed out before"
        );
        if !prev.is_null() {
            // a stale second close of the previous handle must not close this one
            // SAFETY: ple_close looks the value up; a closed one is ignored.
            unsafe { ple_close(prev) };
            assert_eq!(
                info_status(h),
                PLE_OK,
                "cycle {i}: stale close closed a new handle"
            );
            assert_eq!(info_status(prev), PLE_E_INVALID_ARGUMENT);
        }
        // SAFETY: `h` is open.
        unsafe { ple_close(h) };
        assert_eq!(info_status(h), PLE_E_INVALID_ARGUMENT);
        prev = h;
    }
    for &h in &seen {
        assert_eq!(info_status(h as *mut ple_handle), PLE_E_INVALID_ARGUMENT);
    }
}

#[test]
fn close_wakes_a_submit_parked_on_a_full_ring() {
    let (_d, dir) = table();
    // one slot, ring wait forever: the second submit parks until the first step is consumed
    let o = options(|o| {
        o.max_in_flight = 1;
        o.wait_timeout_us = u64::MAX;
    });
    let h = open(&dir, &o) as usize;
    assert_eq!(submit(h as *mut _, 1, 4, 1), PLE_OK);
    // SAFETY: `h` is open.
    assert_eq!(unsafe { ple_wait(h as *mut _, 1, 10_000_000) }, PLE_OK);
    let parked = std::thread::spawn(move || {
        let t = Instant::now();
        (submit(h as *mut _, 2, 4, 100), t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    within(
        Duration::from_secs(10),
        "ple_close with a parked submit",
        move || {
            // SAFETY: `h` is open.
            unsafe { ple_close(h as *mut _) }
        },
    );
    let (s, took) = parked.join().unwrap();
    assert_eq!(s, PLE_E_STATE, "parked submit after close");
    assert!(
        took < Duration::from_secs(5),
        "the parked submit took {took:?}"
    );
}

#[test]
fn wait_zero_polls() {
    let (_d, dir) = table();
    let h = open(&dir, &options(|_| {}));
    // SAFETY: (whole block) `h` is open until the ple_close at the end.
    unsafe {
        assert_eq!(submit(h, 1, 8, 1), PLE_OK);
        // a poll never blocks: OK once the step is done, PLE_E_TIMEOUT before
        let t = Instant::now();
        let mut polls = 0u64;
        loop {
            let s = ple_wait(h, 1, 0);
            polls += 1;
            if s == PLE_OK {
                break;
            }
            assert_eq!(s, PLE_E_TIMEOUT, "{}", last_error());
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "step 1 never completed"
            );
        }
        // a seq never submitted is a state error, not a poll result
        assert_eq!(ple_wait(h, 7, 0), PLE_E_STATE);
        assert!(polls >= 1);
        ple_close(h);
    }
}

#[test]
fn absurd_staging_is_refused_at_open_with_the_bytes_needed() {
    let (_d, dir) = table();
    let o = options(|o| {
        o.max_tokens_per_step = 1 << 20;
        o.max_in_flight = 64;
    });
    let need: u64 = (1 << 20) * 16 * 90 * 64;
    let t = Instant::now();
    let mut h = std::ptr::null_mut();
    // SAFETY: valid C string, options and out pointer.
    let s = unsafe { ple_open(dir.as_ptr(), &o, &mut h) };
    let m = last_error();
    assert_eq!(s, PLE_E_OUT_OF_MEMORY, "{m}");
    assert!(h.is_null());
    assert!(m.contains(&need.to_string()), "{m}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "refusal took {:?}",
        t.elapsed()
    );
}

#[test]
fn a_failed_dequant_leaves_the_step_intact() {
    let (_d, dir) = table();
    let h = open(&dir, &options(|_| {}));
    const DIM: usize = 2560; // the test table: 16 heads of 160
    let mut out = vec![0f32; 8 * DIM];
    // SAFETY: (whole block) `h` is open; `out` holds 8 rows of DIM f32.
    unsafe {
        assert_eq!(submit(h, 1, 8, 1), PLE_OK);
        let p = out.as_mut_ptr() as *mut c_void;
        for (stride, dtype, flags) in [
            (usize::MAX, PLE_DTYPE_F32, 0),
            (DIM - 1, PLE_DTYPE_F32, 0),
            (DIM, 99, 0),
            (DIM, PLE_DTYPE_F32, 0x80),
        ] {
            let s = ple_dequant_cpu(h, 1, p, dtype, stride, flags);
            assert_eq!(
                s, PLE_E_INVALID_ARGUMENT,
                "stride {stride} dtype {dtype} flags {flags}"
            );
        }
        let s = ple_dequant_cpu(h, 1, p, PLE_DTYPE_F32, DIM, 0);
        assert_eq!(s, PLE_OK, "retry after refused arguments: {}", last_error());
        assert!(out.iter().any(|&v| v != 0.0), "the retry wrote the rows");
        // consumed now, by the call that succeeded
        assert_eq!(ple_release_step(h, 1), PLE_E_STATE);
        ple_close(h);
    }
}

#[test]
fn tracked_requests_are_bounded_with_a_clear_error() {
    let (_d, dir) = table();
    let h = open(&dir, &options(|o| o.max_tokens_per_step = 8192));
    let max = ple_core::lookup::context::MAX_TRACKED_REQUESTS as u64;
    assert_eq!(max, PLE_MAX_TRACKED_REQUESTS as u64);
    let mut seq = 0;
    let mut next_req = 0;
    // SAFETY: (whole block) `h` is open until the ple_close at the end.
    unsafe {
        while next_req < max {
            let n = (max - next_req).min(8192) as u32;
            seq += 1;
            assert_eq!(submit(h, seq, n, next_req), PLE_OK, "{}", last_error());
            assert_eq!(ple_release_step(h, seq), PLE_OK);
            next_req += n as u64;
        }
        seq += 1;
        assert_eq!(submit(h, seq, 1, next_req), PLE_E_STATE);
        let m = last_error();
        assert!(
            m.contains("ple_release_request") && m.contains(&max.to_string()),
            "{m}"
        );
        // a known request still submits; a released one makes room
        assert_eq!(ple_release_request(h, 0), PLE_OK);
        assert_eq!(submit(h, seq, 1, next_req), PLE_OK, "{}", last_error());
        ple_close(h);
    }
}
