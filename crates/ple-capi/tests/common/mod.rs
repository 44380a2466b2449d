//! Helpers shared by the C API's integration tests.
#![allow(dead_code, reason = "each test binary uses some of the helpers")]

use ple::*;
use std::ffi::{CStr, CString};
use std::time::Duration;

pub fn table() -> (tempfile::TempDir, CString) {
    let d = tempfile::tempdir().unwrap();
    ple_testkit::synth::write_table(
        d.path(),
        ple_core::model::RowFormat::Nvfp4,
        &ple_testkit::synth::small_config(1000, 4),
        3,
    )
    .unwrap();
    let dir = CString::new(d.path().to_str().unwrap()).unwrap();
    (d, dir)
}

pub fn options(f: impl FnOnce(&mut ple_options)) -> ple_options {
    // SAFETY: ple_options is plain data; ple_options_default fills every field.
    let mut o: ple_options = unsafe { std::mem::zeroed() };
    // SAFETY: `o` is a valid, writable ple_options.
    assert_eq!(unsafe { ple_options_default(&mut o) }, PLE_OK);
    o.max_tokens_per_step = 64;
    o.num_threads = 1;
    f(&mut o);
    o
}

pub fn open(dir: &CString, o: &ple_options) -> *mut ple_handle {
    let mut h = std::ptr::null_mut();
    // SAFETY: valid C string, options and out pointer.
    let s = unsafe { ple_open(dir.as_ptr(), o, &mut h) };
    assert_eq!(s, PLE_OK, "{}", last_error());
    h
}

pub fn last_error() -> String {
    // SAFETY: ple_last_error_message never returns NULL and the text lives until the next call.
    unsafe { CStr::from_ptr(ple_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// One decode step of `n` tokens: request ids `first_req..first_req + n`, one token each,
/// position 0. Owns the arrays a `ple_batch` borrows.
pub struct DecodeBatch {
    toks: Vec<i32>,
    pos: Vec<i32>,
    ids: Vec<u64>,
    qs: Vec<u32>,
}

impl DecodeBatch {
    pub fn new(n: u32, first_req: u64) -> Self {
        DecodeBatch {
            toks: (0..n as i32).map(|i| 1 + i % 100).collect(),
            pos: vec![0; n as usize],
            ids: (0..n as u64).map(|i| first_req + i).collect(),
            qs: (0..=n).collect(),
        }
    }

    /// The batch, borrowing `self`'s arrays (valid while `self` lives).
    pub fn batch(&self) -> ple_batch {
        ple_batch {
            tokens: self.toks.as_ptr(),
            positions: self.pos.as_ptr(),
            num_tokens: self.toks.len() as u32,
            request_ids: self.ids.as_ptr(),
            query_start: self.qs.as_ptr(),
            num_requests: self.ids.len() as u32,
            context: std::ptr::null(),
        }
    }
}

/// Submits [`DecodeBatch::new(n, first_req)`](DecodeBatch::new) as `seq`.
pub fn submit(h: *mut ple_handle, seq: u64, n: u32, first_req: u64) -> ple_status {
    let b = DecodeBatch::new(n, first_req);
    // SAFETY: every array lives until the call returns and has the lengths the batch states.
    unsafe { ple_submit(h, &b.batch(), seq) }
}

/// Asks [`DecodeBatch::new(n, first_req)`](DecodeBatch::new)'s rows ahead.
pub fn prefetch_ahead(h: *mut ple_handle, n: u32, first_req: u64) -> ple_status {
    let b = DecodeBatch::new(n, first_req);
    // SAFETY: as in `submit`.
    unsafe { ple_prefetch_ahead(h, &b.batch()) }
}

pub fn info_status(h: *mut ple_handle) -> ple_status {
    // SAFETY: ple_info is plain data; struct_size set below.
    let mut i: ple_table_info = unsafe { std::mem::zeroed() };
    i.struct_size = std::mem::size_of::<ple_table_info>();
    // SAFETY: `h` is looked up, never dereferenced; `i` is writable.
    unsafe { ple_table_info(h, &mut i) }
}

/// Runs `f` on a thread and fails the test if it does not finish within `limit` (a hang).
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: still running after {limit:?} (a hang)"))
}
