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

/// An open handle, closed when dropped.
pub struct Handle(pub *mut ple_handle);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from ple_open and is closed once, here.
        unsafe { ple_close(self.0) };
    }
}

/// `ple_open` of `dir` with `o`: the handle, or the status and message of the failure.
pub fn try_open(dir: &CString, o: &ple_options) -> Result<Handle, (ple_status, String)> {
    let mut h = std::ptr::null_mut();
    // SAFETY: the path, options and out pointer are valid for the call.
    match unsafe { ple_open(dir.as_ptr(), o, &mut h) } {
        PLE_OK => Ok(Handle(h)),
        s => Err((s, last_error())),
    }
}

/// The handle's counters (`ple_stats`).
pub fn stats(h: &Handle) -> ple_stats {
    // SAFETY: ple_stats (the C struct) is plain integers: all-zero is a valid value.
    let mut s: ple_stats = unsafe { std::mem::zeroed() };
    s.struct_size = std::mem::size_of::<ple_stats>();
    // SAFETY: `h` is open and `s` a writable ple_counters with struct_size set.
    assert_eq!(unsafe { ple_stats(h.0, &mut s) }, PLE_OK);
    s
}

/// The handle's table facts (`ple_table_info`).
pub fn info(h: &Handle) -> ple_table_info {
    // SAFETY: ple_info is plain data: all-zero is a valid value.
    let mut i: ple_table_info = unsafe { std::mem::zeroed() };
    i.struct_size = std::mem::size_of::<ple_table_info>();
    // SAFETY: `h` is open and `i` a writable ple_info with struct_size set.
    assert_eq!(unsafe { ple_table_info(h.0, &mut i) }, PLE_OK);
    i
}

/// One stateless step: `reqs` requests of `toks` tokens each from `stream` (request `r` at
/// `(at + r·997) mod (len − toks)`), each with its two context tokens (EOS before the stream).
/// Owns the arrays a `ple_batch` borrows.
pub struct Step {
    pub tokens: Vec<i32>,
    pub positions: Vec<i32>,
    pub ids: Vec<u64>,
    pub qs: Vec<u32>,
    pub ctx: Vec<i32>,
}

impl Step {
    pub fn new(stream: &[i32], at: usize, reqs: usize, toks: usize) -> Step {
        let mut s = Step {
            tokens: vec![],
            positions: vec![],
            ids: vec![],
            qs: vec![0],
            ctx: vec![],
        };
        for r in 0..reqs {
            let p = (at + r * 997) % (stream.len() - toks);
            s.tokens.extend_from_slice(&stream[p..p + toks]);
            s.positions.extend((p..p + toks).map(|x| x as i32));
            s.ids.push(r as u64 + 1);
            s.qs.push(s.tokens.len() as u32);
            let at = |q: usize| if q < 2 { 248_044 } else { stream[q - 2] };
            s.ctx.push(at(p));
            s.ctx.push(at(p + 1));
        }
        s
    }

    /// The batch, borrowing `self`'s arrays (valid while `self` lives).
    pub fn batch(&self) -> ple_batch {
        ple_batch {
            tokens: self.tokens.as_ptr(),
            positions: self.positions.as_ptr(),
            num_tokens: self.tokens.len() as u32,
            request_ids: self.ids.as_ptr(),
            query_start: self.qs.as_ptr(),
            num_requests: self.ids.len() as u32,
            context: self.ctx.as_ptr(),
        }
    }
}

/// Submits `st` as `seq` on `h`; fails the test unless `PLE_OK`.
pub fn submit_step(h: &Handle, st: &Step, seq: u64) {
    let b = st.batch();
    // SAFETY: the batch borrows `st`, alive across the call; the handle is open.
    let r = unsafe { ple_submit(h.0, &b, seq) };
    assert_eq!(r, PLE_OK, "{}", last_error());
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
