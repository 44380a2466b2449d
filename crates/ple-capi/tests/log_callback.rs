//! Log callbacks never run while libple holds a lock, nor on the thread that logged
//! (docs/RELIABILITY.md, "C API and pipeline"). In their own test binary: the callback is
//! process-wide, and other tests' messages would reach it.

#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use ple::*;
use std::ffi::{c_char, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Tests that set the callback run one at a time.
static LOG_TESTS: Mutex<()> = Mutex::new(());

static CB_HANDLE: AtomicUsize = AtomicUsize::new(0);
static CB_CALLS: AtomicU64 = AtomicU64::new(0);

/// Calls back into libple on the handle in `CB_HANDLE`: a wait, a close, a re-registration.
extern "C" fn reentrant_cb(_level: i32, _msg: *const c_char, _user: *mut c_void) {
    CB_CALLS.fetch_add(1, Ordering::SeqCst);
    let h = CB_HANDLE.load(Ordering::SeqCst) as *mut ple_handle;
    if !h.is_null() {
        // SAFETY: libple looks handles up; a closed one is an error, not undefined behaviour.
        unsafe {
            let _ = ple_wait(h, 1, 100_000);
            ple_close(h);
        }
    }
    // SAFETY: registering this same function again is allowed from within the callback.
    unsafe {
        let _ = ple_set_log_callback(Some(reentrant_cb), 5, std::ptr::null_mut());
    }
}

extern "C" fn slow_cb(_level: i32, _msg: *const c_char, _user: *mut c_void) {
    CB_CALLS.fetch_add(1, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
}

fn unset_callback() {
    // SAFETY: removing the callback.
    unsafe { ple_set_log_callback(None, 2, std::ptr::null_mut()) };
}

#[test]
fn a_log_callback_may_call_libple_on_the_handle_that_logged() {
    let _g = LOG_TESTS.lock().unwrap_or_else(|p| p.into_inner());
    let (_d, dir) = table();
    for round in 0..20 {
        let h = open(&dir, &options(|o| o.max_in_flight = 8));
        CB_HANDLE.store(h as usize, Ordering::SeqCst);
        CB_CALLS.store(0, Ordering::SeqCst);
        // SAFETY: a valid callback that is safe from any thread.
        let s = unsafe { ple_set_log_callback(Some(reentrant_cb), 5, std::ptr::null_mut()) };
        assert_eq!(s, PLE_OK);
        let hv = h as usize;
        within(
            Duration::from_secs(20),
            "steps, then close, with a re-entrant callback",
            move || {
                let h = hv as *mut ple_handle;
                for seq in 1..=8 {
                    let _ = submit(h, seq, 64, seq * 1000);
                }
                // closing with steps queued logs "step abandoned" from the worker; a stale close
                // logs a warning from this thread
                // SAFETY: `h` is open (or already closed by the callback: then ignored).
                unsafe {
                    ple_close(h);
                    ple_close(h);
                }
            },
        );
        within(
            Duration::from_secs(20),
            "removing the callback",
            unset_callback,
        );
        assert!(
            CB_CALLS.load(Ordering::SeqCst) > 0,
            "round {round}: no message reached the callback"
        );
        CB_HANDLE.store(0, Ordering::SeqCst);
    }
}

#[test]
fn a_slow_log_callback_does_not_slow_the_caller() {
    let _g = LOG_TESTS.lock().unwrap_or_else(|p| p.into_inner());
    CB_CALLS.store(0, Ordering::SeqCst);
    // SAFETY: a valid callback that is safe from any thread.
    let s = unsafe { ple_set_log_callback(Some(slow_cb), 4, std::ptr::null_mut()) };
    assert_eq!(s, PLE_OK);
    let bogus = 0x10usize as *mut ple_handle;
    let t = Instant::now();
    for _ in 0..5 {
        // each logs a debug message ("not an open handle")
        // SAFETY: not a handle: looked up and ignored.
        unsafe { ple_close(bogus) };
    }
    let took = t.elapsed();
    // removing the callback waits for the queued messages (5 × 300 ms)
    unset_callback();
    assert!(
        took < Duration::from_millis(250),
        "5 logging calls took {took:?} with a 300 ms callback"
    );
    assert_eq!(
        CB_CALLS.load(Ordering::SeqCst),
        5,
        "every message was delivered before removal"
    );
}

static COUNT_CALLS: AtomicU64 = AtomicU64::new(0);

extern "C" fn counting_cb(_level: i32, _msg: *const c_char, _user: *mut c_void) {
    COUNT_CALLS.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn registering_again_at_a_lower_level_stops_the_more_verbose_messages() {
    let _g = LOG_TESTS.lock().unwrap_or_else(|p| p.into_inner());
    let bogus = 0x10usize as *mut ple_handle;
    let closes_logged = |max_level: i32| {
        COUNT_CALLS.store(0, Ordering::SeqCst);
        // SAFETY: a valid callback that is safe from any thread.
        let s = unsafe { ple_set_log_callback(Some(counting_cb), max_level, std::ptr::null_mut()) };
        assert_eq!(s, PLE_OK);
        // SAFETY: not a handle: looked up and ignored, with a debug message.
        unsafe { ple_close(bogus) };
        // registering again (as removing) waits until the queued messages are delivered
        unset_callback();
        COUNT_CALLS.load(Ordering::SeqCst)
    };
    assert_eq!(closes_logged(4), 1, "PLE_LOG_DEBUG takes the debug message");
    assert_eq!(
        closes_logged(2),
        0,
        "PLE_LOG_WARN after PLE_LOG_DEBUG takes no debug message"
    );
    assert_eq!(closes_logged(4), 1, "and PLE_LOG_DEBUG again takes it");
}
