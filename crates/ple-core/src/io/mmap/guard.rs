//! Row copies from the mapping that turn SIGBUS into an error (MMAP mode).
//!
//! A mapped page the file no longer backs (the row file truncated or rewritten under an open
//! handle) or whose device read failed raises SIGBUS in the thread that touches it. The copy runs
//! in C (`csrc/guard.c`) under `sigsetjmp`, with a SIGBUS handler installed once per process that
//! jumps back for faults inside the mapping the faulting thread is copying from, and passes every
//! other SIGBUS to the handler installed before it (or the default action). A host that installs
//! its own SIGBUS handler after opening a handle without chaining to the previous one disables
//! the guard.

use crate::error::{Error, Result};

unsafe extern "C" {
    fn ple_guard_install() -> libc::c_int;
    fn ple_guard_in_place() -> libc::c_int;
    fn ple_guard_passed_on() -> u64;
    fn ple_guarded_gather(
        base: *const u8,
        map_len: usize,
        rb: usize,
        ids: *const u64,
        n: usize,
        out: *mut u8,
        fault_off: *mut u64,
    ) -> usize;
}

/// Installs the process's SIGBUS handler (idempotent; the first call installs it).
pub fn install() -> Result<()> {
    // SAFETY: `ple_guard_install` takes no arguments; it calls sigaction once (pthread_once).
    if unsafe { ple_guard_install() } != 0 {
        return Err(Error::io(
            "installing the SIGBUS handler",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Whether the process's SIGBUS disposition is libple's handler now (false before the first
/// [`install`], or after a host replaced it).
pub fn in_place() -> bool {
    // SAFETY: reads the disposition with sigaction(NULL new action); no arguments.
    unsafe { ple_guard_in_place() != 0 }
}

/// SIGBUS signals libple's handler passed on to the previous disposition (a signal sent by
/// kill/tgkill, or a fault outside an armed copy) since the process started.
pub fn passed_on() -> u64 {
    // SAFETY: an atomic load; no arguments.
    unsafe { ple_guard_passed_on() }
}

/// Copies rows `ids` (each checked `< src.len() / row_bytes` by the caller) of `row_bytes` from
/// `src` into `out` (row `i` at `out[i * row_bytes..]`). A SIGBUS while reading the mapping fails
/// the copy with `Error::Io` naming the row and its file offset; rows before it are copied.
pub fn copy_rows(src: &[u8], row_bytes: usize, ids: &[u64], out: &mut [u8]) -> Result<()> {
    assert!(out.len() >= ids.len() * row_bytes, "output holds the rows");
    install()?;
    debug_assert!(
        ids.iter()
            .all(|&r| (r as usize + 1) * row_bytes <= src.len())
    );
    let mut fault = 0u64;
    // SAFETY: `src` is `src.len()` readable bytes and every id's row lies inside it (the
    // caller's contract, checked by `check_ids` on every path); `out` holds `ids.len()` rows
    // (asserted); the C copy writes only there and reads only `ids` and those rows. A SIGBUS
    // inside the mapping returns through siglongjmp across C frames only.
    let done = unsafe {
        ple_guarded_gather(
            src.as_ptr(),
            src.len(),
            row_bytes,
            ids.as_ptr(),
            ids.len(),
            out.as_mut_ptr(),
            &mut fault,
        )
    };
    if done == ids.len() {
        return Ok(());
    }
    Err(Error::io(
        format!(
            "reading row {} at offset {} of the mapped row file (fault at offset {fault})",
            ids[done],
            ids[done] * row_bytes as u64
        ),
        std::io::Error::other(
            "SIGBUS: the row file is shorter than when it was opened, or the device failed",
        ),
    ))
}

#[cfg(test)]
mod tests;
