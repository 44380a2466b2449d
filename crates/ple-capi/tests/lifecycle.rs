//! 1,000 `ple_open`/`ple_close` cycles (through the C API, with a step in each) leave the
//! process's open files and memory mappings as they were. Alone in its own test binary, so no
//! other test opens files meanwhile (the tests here take `SERIAL` for the same reason).

#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use ple::*;
use std::ffi::CString;
use std::time::{Duration, Instant};

/// Held by each test of this binary: they count the process's files and mappings.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// mode 0: open/close; 1: a step, waited for; 2: a step still in flight at close.
fn cycle(dir: &CString, mode: usize) {
    // SAFETY: valid options, C strings, arrays and out pointers for every call below.
    unsafe {
        let mut o: ple_options = std::mem::zeroed();
        assert_eq!(ple_options_default(&mut o), PLE_OK);
        o.max_tokens_per_step = 64;
        o.num_threads = 2;
        let mut h = std::ptr::null_mut();
        assert_eq!(ple_open(dir.as_ptr(), &o, &mut h), PLE_OK);
        if mode > 0 {
            let toks = [1i32, 2, 3];
            let pos = [0i32, 1, 2];
            let ids = [5u64];
            let qs = [0u32, 3];
            let b = ple_batch {
                tokens: toks.as_ptr(),
                positions: pos.as_ptr(),
                num_tokens: 3,
                request_ids: ids.as_ptr(),
                query_start: qs.as_ptr(),
                num_requests: 1,
                context: std::ptr::null(),
            };
            assert_eq!(ple_submit(h, &b, 1), PLE_OK);
            if mode == 1 {
                assert_eq!(ple_wait(h, 1, 10_000_000), PLE_OK);
            }
        }
        ple_close(h);
    }
}

#[test]
fn open_close_cycles_leak_no_fds_or_mappings() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (_d, dir) = common::table();
    // warm up: thread stacks cached by the C library, logger, lazy statics
    for i in 0..20 {
        cycle(&dir, i % 3);
    }
    let (f0, m0) = (fds(), maps());
    for i in 0..1000 {
        cycle(&dir, i % 3);
    }
    // close joins every thread of the handle, so counts are back at once; allow the C library
    // a moment to unmap exited threads' stacks
    let t = Instant::now();
    let (mut f1, mut m1) = (fds(), maps());
    while (f1 != f0 || m1 != m0) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        (f1, m1) = (fds(), maps());
    }
    assert_eq!(f1, f0, "open fds before/after 1000 open/close cycles");
    assert_eq!(m1, m0, "mappings before/after 1000 open/close cycles");
}

/// `ple_open` with `cuda_device = 0` on a machine without a CUDA driver: PLE_E_CUDA_UNAVAILABLE,
/// a NULL handle, and a message that says what is missing and what to do. (Skipped where a
/// driver loads.)
#[test]
fn cuda_device_without_a_driver_is_cuda_unavailable() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if ple_core::dequant::gpu::probe_driver().is_ok() {
        eprintln!("a CUDA driver loads here: not checking the no-driver error");
        return;
    }
    let (_d, dir) = common::table();
    // SAFETY: valid options, C string and out pointer for the calls below.
    unsafe {
        let mut o: ple_options = std::mem::zeroed();
        assert_eq!(ple_options_default(&mut o), PLE_OK);
        o.max_tokens_per_step = 64;
        o.cuda_device = 0;
        let mut h = std::ptr::dangling_mut::<ple_handle>();
        let s = ple_open(dir.as_ptr(), &o, &mut h);
        let m = std::ffi::CStr::from_ptr(ple_last_error_message())
            .to_string_lossy()
            .into_owned();
        assert_eq!(s, PLE_E_CUDA_UNAVAILABLE, "{m}");
        assert!(h.is_null(), "the handle is set to NULL on failure");
        assert!(m.contains("libcuda"), "{m}");
        assert!(m.contains("cuda_device = -1"), "{m}");
    }
}
