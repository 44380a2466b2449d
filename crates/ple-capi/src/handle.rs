//! `ple_handle`: the registry of open handles, open/close, table facts and counters.

use crate::boundary::{nonnull, panic_message, path_arg, read_versioned, write_versioned};
use crate::status::ple_status;
use crate::types::{ple_options, ple_stats, ple_table_info};
use ple_core::step::Pipeline;
use ple_core::{Error, Result};
use std::ffi::c_char;
use std::sync::Arc;

/// Opaque handle to an open table and its step pipeline. Create with `ple_open`, free with
/// `ple_close`. Thread safety: `ple_submit` calls on one handle must come from one thread at a time
/// (they are serialised internally); `ple_wait`, `ple_stats`, `ple_table_info`, `ple_ngram_ids`
/// may be called from any thread concurrently.
pub struct ple_handle {
    _private: u8,
}

/// Open handles: the address of each `ple_handle` shell → its pipeline. Every call looks its
/// handle up here, so a closed or foreign pointer is an error (not undefined behaviour), and a call
/// racing with `ple_close` keeps the pipeline alive until it returns.
type Registry = std::collections::HashMap<usize, Arc<Pipeline>>;
static HANDLES: std::sync::LazyLock<std::sync::Mutex<Registry>> =
    std::sync::LazyLock::new(Default::default);

fn handles() -> std::sync::MutexGuard<'static, Registry> {
    HANDLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Looks up an open handle. Never dereferences the pointer.
pub(crate) fn handle_ref(h: *const ple_handle) -> Result<Arc<Pipeline>> {
    nonnull(h, "handle")?;
    handles().get(&(h as usize)).cloned().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "handle {h:p} is not open (closed, or not from ple_open)"
        ))
    })
}

/// Fills `options` with the defaults (and `struct_size`). Returns `PLE_E_INVALID_ARGUMENT` on NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_options_default(options: *mut ple_options) -> ple_status {
    ffi_guard!({
        nonnull(options, "options")?;
        unsafe {
            options.write(crate::types::options_to_c(
                &ple_core::step::OpenOptions::default(),
            ))
        };
        Ok(())
    })
}

/// Opens the packed table in directory `table_dir` (read-only mmap, MADV_RANDOM), validates it,
/// and starts its step pipeline. `options` may be NULL for the defaults. On success `*out_handle`
/// owns the handle (free it with `ple_close`); on failure it is set to NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_open(
    table_dir: *const c_char,
    options: *const ple_options,
    out_handle: *mut *mut ple_handle,
) -> ple_status {
    ffi_guard!({
        nonnull(out_handle, "out_handle")?;
        unsafe { *out_handle = std::ptr::null_mut() };
        let dir = unsafe { path_arg(table_dir, "table_dir")? };
        let mut c = crate::types::options_to_c(&ple_core::step::OpenOptions::default());
        if !options.is_null() {
            unsafe {
                read_versioned(
                    options,
                    &mut c,
                    std::mem::size_of::<ple_options>(),
                    "options",
                )?
            };
        }
        let opts = unsafe { crate::types::options_from_c(&c)? };
        crate::log::init();
        let pipeline = Arc::new(Pipeline::open(&dir, opts)?);
        let shell = Box::into_raw(Box::new(ple_handle { _private: 0 }));
        handles().insert(shell as usize, pipeline);
        unsafe { *out_handle = shell };
        Ok(())
    })
}

/// Closes a handle: stops its worker after the step in flight, unmaps the table, frees everything.
/// NULL is a no-op, and so is closing a handle that is already closed (as long as no later
/// `ple_open` has returned the same pointer). Calls still running on other threads finish first;
/// waits on the closed handle return `PLE_E_STATE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_close(handle: *mut ple_handle) {
    if handle.is_null() {
        return;
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let removed = handles().remove(&(handle as usize));
        if let Some(p) = removed {
            p.shutdown();
            drop(p);
            // SAFETY: the shell was created by Box::into_raw in ple_open and is freed only here,
            // once, when its registry entry is removed.
            drop(unsafe { Box::from_raw(handle) });
        } else {
            log::warn!("ple_close({handle:p}): not an open handle; ignored");
        }
    }));
    if let Err(p) = r {
        log::error!("panic while closing a handle: {}", panic_message(&*p));
    }
}

/// Copies facts about the open table into `*info` (set `info->struct_size = sizeof(ple_info)`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_table_info(
    handle: *const ple_handle,
    info: *mut ple_table_info,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        let i = crate::types::info_with_io_to_c(&h.table_info(), h.io_info());
        unsafe { write_versioned(&i, info, "info") }
    })
}

/// Copies the handle's cumulative counters into `*stats` (set `stats->struct_size = sizeof(ple_counters)`).
/// Residency and MemAvailable are measured at the call: one mincore over the whole table, about
/// 0.15 s for a 4 GiB table on the development VM and proportional to the table's size — poll it
/// now and then, not every step (the other counters cost nothing to keep).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_stats(handle: *const ple_handle, stats: *mut ple_stats) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        let s = crate::types::counters_to_c(&h.stats());
        unsafe { write_versioned(&s, stats, "stats") }
    })
}
