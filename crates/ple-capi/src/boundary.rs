//! The panic boundary, the thread-local error text and the pointer helpers. Every raw pointer an
//! export receives is checked or converted here, under the preconditions written once below.

use crate::status::{ple_status, status_of};
use ple_core::{Error, Result};
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::path::PathBuf;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

pub(crate) fn clear_last_error() {
    LAST_ERROR.with(|e| {
        let mut e = e.borrow_mut();
        if !e.as_bytes().is_empty() {
            *e = CString::default();
        }
    });
}

/// Records an error for `ple_last_error_message` and returns its status.
pub(crate) fn report(e: &Error) -> ple_status {
    let msg = e.to_string();
    log::debug!("returning error: {msg}");
    set_last_error(&msg);
    status_of(e)
}

pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// The panic boundary: runs `body` (returning `Result<()>`), catches any panic, records the error
/// text, and evaluates to a `ple_status`.
macro_rules! ffi_guard {
    ($body:block) => {{
        $crate::boundary::clear_last_error();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> ple_core::Result<()> {
            $body
        })) {
            Ok(Ok(())) => $crate::status::PLE_OK,
            Ok(Err(e)) => $crate::boundary::report(&e),
            Err(p) => $crate::boundary::report(&ple_core::Error::Panic(
                $crate::boundary::panic_message(&*p),
            )),
        }
    }};
}

pub(crate) fn nonnull<T>(p: *const T, what: &str) -> Result<()> {
    if p.is_null() {
        ple_core::invalid!("{what} is NULL")
    } else {
        Ok(())
    }
}

/// Reads a C string argument as a path.
pub(crate) unsafe fn path_arg(p: *const c_char, what: &str) -> Result<PathBuf> {
    nonnull(p, what)?;
    let s = unsafe { CStr::from_ptr(p) };
    let s = s
        .to_str()
        .map_err(|_| Error::InvalidArgument(format!("{what} is not valid UTF-8")))?;
    if s.is_empty() {
        return ple_core::invalid!("{what} is empty");
    }
    Ok(PathBuf::from(s))
}

/// Copies a caller's versioned struct (first field `struct_size`) over `dst`, which holds the
/// defaults: fields the caller's older struct lacks keep their defaults.
pub(crate) unsafe fn read_versioned<T: Copy>(
    src: *const T,
    dst: &mut T,
    min_size: usize,
    what: &str,
) -> Result<()> {
    let size = unsafe { *(src as *const usize) };
    let full = std::mem::size_of::<T>();
    if size < min_size || size > full {
        return ple_core::invalid!(
            "{what}.struct_size is {size}, expected between {min_size} and {full} (initialise it with the *_default() function)"
        );
    }
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut T as *mut u8, size) };
    // keep our own size so later reads see all fields
    unsafe { *(dst as *mut T as *mut usize) = full };
    Ok(())
}

/// Copies a result struct into a caller's versioned struct, up to the size the caller declares.
pub(crate) unsafe fn write_versioned<T: Copy>(src: &T, dst: *mut T, what: &str) -> Result<()> {
    nonnull(dst, what)?;
    let size = unsafe { *(dst as *const usize) };
    let full = std::mem::size_of::<T>();
    if size < std::mem::size_of::<usize>() || size > full {
        return ple_core::invalid!(
            "{what}.struct_size is {size}, expected between 8 and {full} (set it to sizeof)"
        );
    }
    unsafe {
        std::ptr::copy_nonoverlapping(
            (src as *const T as *const u8).add(std::mem::size_of::<usize>()),
            (dst as *mut u8).add(std::mem::size_of::<usize>()),
            size - std::mem::size_of::<usize>(),
        )
    };
    Ok(())
}

/// The cause of the last failed libple call on this thread, in words ("" if the last call
/// succeeded). The pointer stays valid until the next libple call on the same thread.
#[unsafe(no_mangle)]
pub extern "C" fn ple_last_error_message() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
