//! `ple_prefetch_ahead` through the C API: a step read ahead gives the same rows as a handle
//! without read-ahead and finds them all in the row cache; the counters add up; NULL handle or
//! batch and a closed handle are statuses.

mod common;
use common::*;
use ple::*;
use std::time::{Duration, Instant};

fn counters(h: *mut ple_handle) -> ple_stats {
    // SAFETY: ple_stats (the C struct) is plain integers: all-zero is a valid value.
    let mut s: ple_stats = unsafe { std::mem::zeroed() };
    s.struct_size = std::mem::size_of::<ple_stats>();
    // SAFETY: `h` is open and `s` a writable ple_counters with struct_size set.
    assert_eq!(unsafe { ple_stats(h, &mut s) }, PLE_OK);
    s
}

fn rows(h: *mut ple_handle, seq: u64, n: usize, rb: usize) -> Vec<u8> {
    // SAFETY: `h` is open; the view is copied before the step is released.
    unsafe {
        assert_eq!(ple_wait(h, seq, u64::MAX), PLE_OK, "{}", last_error());
        let mut p = std::ptr::null();
        let mut t = 0u32;
        assert_eq!(ple_packed_rows(h, seq, &mut p, &mut t), PLE_OK);
        let v = std::slice::from_raw_parts(p, n * 16 * rb).to_vec();
        assert_eq!(ple_release_step(h, seq), PLE_OK);
        v
    }
}

#[test]
fn read_ahead_rows_equal_rows_without_it_and_bad_input_is_a_status() {
    let (_d, dir) = table();
    let with = open(&dir, &options(|o| o.cache_bytes = 4 << 20));
    let plain = open(&dir, &options(|o| o.cache_bytes = 0));
    let rb = ple_core::model::RowFormat::Nvfp4.row_bytes(160);
    // a tracked step of 40 new requests, one token each
    let st = DecodeBatch::new(40, 1);
    let b = st.batch();
    // SAFETY: the batch borrows `st`, alive across the calls; the handles are open.
    unsafe {
        assert_eq!(ple_prefetch_ahead(with, &b), PLE_OK, "{}", last_error());
    }
    let t0 = Instant::now();
    loop {
        let c = counters(with);
        if c.ahead_asked == c.ahead_read + c.ahead_dropped + c.ahead_cached {
            assert_eq!(c.ahead_asked, 40 * 16);
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "queue drained");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: as above.
    unsafe {
        assert_eq!(ple_submit(with, &b, 1), PLE_OK);
        assert_eq!(ple_submit(plain, &b, 1), PLE_OK);
    }
    assert_eq!(rows(with, 1, 40, rb), rows(plain, 1, 40, rb));
    let c = counters(with);
    assert_eq!(c.cache_misses, 0, "every row was read ahead");
    assert_eq!(c.ahead_hits, c.ahead_read);
    // bad input
    // SAFETY: NULL pointers are what is tested; the handle values are looked up.
    unsafe {
        assert_eq!(
            ple_prefetch_ahead(std::ptr::null_mut(), &b),
            PLE_E_INVALID_ARGUMENT
        );
        assert_eq!(
            ple_prefetch_ahead(with, std::ptr::null()),
            PLE_E_INVALID_ARGUMENT
        );
        assert!(last_error().contains("batch"), "{}", last_error());
        assert_eq!(
            ple_prefetch_ahead_tokens(with, std::ptr::null()),
            PLE_E_INVALID_ARGUMENT
        );
        ple_close(with);
        assert_eq!(ple_prefetch_ahead(with, &b), PLE_E_INVALID_ARGUMENT);
        ple_close(plain);
    }
}
