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

/// The message of a caught panic (one home: the core's `panic_text`).
pub(crate) use ple_core::error::panic_text as panic_message;

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

/// `Error::InvalidArgument` naming `what` if `p` is NULL.
pub(crate) fn nonnull<T>(p: *const T, what: &str) -> Result<()> {
    if p.is_null() {
        ple_core::invalid!("{what} is NULL")
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Pointer conversions. Every raw pointer an export receives becomes a Rust reference or slice
// here, and nowhere else. Each helper checks NULL (and lengths); its `# Safety` section is the
// one precondition the export's caller (C) must meet, repeated in the export's own docs.
// ---------------------------------------------------------------------------------------------

/// The caller's struct behind `p`, borrowed for the call.
///
/// # Safety
/// `p` is NULL or points to an initialised `T` that nobody writes during the call.
pub(crate) unsafe fn struct_arg<'a, T>(p: *const T, what: &str) -> Result<&'a T> {
    nonnull(p, what)?;
    // SAFETY: non-NULL (checked), and valid and unaliased by the caller's contract above.
    Ok(unsafe { &*p })
}

/// Writes `value` through the caller's out-pointer `p`.
///
/// # Safety
/// `p` is NULL or valid for a write of one `T` (alignment included).
pub(crate) unsafe fn write_out<T>(p: *mut T, value: T, what: &str) -> Result<()> {
    nonnull(p, what)?;
    // SAFETY: non-NULL (checked), writable by the caller's contract; `write` drops nothing old.
    unsafe { p.write(value) };
    Ok(())
}

/// The caller's array of `len` elements at `p` (`len == 0` gives an empty slice; `p` may then
/// be NULL).
///
/// # Safety
/// If `len > 0`, `p` is NULL or points to `len` initialised, aligned `T` that nobody writes
/// during the call.
pub(crate) unsafe fn slice_arg<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    nonnull(p, what)?;
    // SAFETY: non-NULL (checked) and `len` readable elements by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The caller's writable array of `len` elements at `p` (`len == 0`: empty, `p` may be NULL).
///
/// # Safety
/// If `len > 0`, `p` is NULL or points to `len` aligned, writable `T` that nobody else reads or
/// writes during the call.
pub(crate) unsafe fn slice_out<'a, T>(p: *mut T, len: usize, what: &str) -> Result<&'a mut [T]> {
    if len == 0 {
        return Ok(&mut []);
    }
    nonnull(p, what)?;
    // SAFETY: non-NULL (checked), `len` writable elements, unaliased by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// Reads a C string argument as a path (NULL, empty or not UTF-8: `InvalidArgument`).
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that lives for the call.
pub(crate) unsafe fn path_arg(p: *const c_char, what: &str) -> Result<PathBuf> {
    nonnull(p, what)?;
    // SAFETY: non-NULL (checked) and NUL-terminated by the caller's contract.
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
/// defaults: fields the caller's older struct lacks keep their defaults. Returns the caller's
/// `struct_size` (a field that starts in an older struct's tail padding was copied from that
/// padding: callers reset such fields when the size does not cover them).
///
/// # Safety
/// `src` is NULL or points to at least `struct_size` readable bytes whose first field is a
/// `usize` `struct_size`. `T` is a `#[repr(C)]` struct of plain data starting with `struct_size`.
pub(crate) unsafe fn read_versioned<T: Copy>(
    src: *const T,
    dst: &mut T,
    min_size: usize,
    what: &str,
) -> Result<usize> {
    nonnull(src, what)?;
    // SAFETY: non-NULL, and its first field is the usize struct_size (caller's contract).
    let size = unsafe { (src as *const usize).read_unaligned() };
    let full = std::mem::size_of::<T>();
    if size < min_size || size > full {
        return ple_core::invalid!(
            "{what}.struct_size is {size}, expected between {min_size} and {full} (initialise it with the *_default() function)"
        );
    }
    // SAFETY: the caller's struct holds `size` bytes (its own struct_size), `size <= full`, so
    // the copy stays inside both; they are distinct objects (dst is ours).
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut T as *mut u8, size) };
    // keep our own size so later reads see all fields
    // SAFETY: dst is a valid T whose first field is the usize struct_size.
    unsafe { *(dst as *mut T as *mut usize) = full };
    Ok(size)
}

/// Copies a result struct into a caller's versioned struct, up to the size the caller declares.
///
/// # Safety
/// `dst` is NULL or points to a writable struct whose first field, a `usize`, holds the number
/// of bytes it has (`struct_size`). `T` is a `#[repr(C)]` struct of plain data starting with
/// `struct_size`.
pub(crate) unsafe fn write_versioned<T: Copy>(src: &T, dst: *mut T, what: &str) -> Result<()> {
    nonnull(dst, what)?;
    // SAFETY: non-NULL, first field is the usize struct_size (caller's contract).
    let size = unsafe { (dst as *const usize).read_unaligned() };
    let full = std::mem::size_of::<T>();
    let head = std::mem::size_of::<usize>();
    if size < head || size > full {
        return ple_core::invalid!(
            "{what}.struct_size is {size}, expected between {head} and {full} (set it to sizeof)"
        );
    }
    // SAFETY: both hold at least `size` bytes (`size <= full`; the caller's by its
    // struct_size); the caller's struct_size field itself is not overwritten.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (src as *const T as *const u8).add(head),
            (dst as *mut u8).add(head),
            size - head,
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
