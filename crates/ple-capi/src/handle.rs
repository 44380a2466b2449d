//! `ple_handle`: the registry of open handles, open/close, table facts and counters.

use crate::boundary::{
    nonnull, panic_message, path_arg, read_versioned, write_out, write_versioned,
};
use crate::status::ple_status;
use crate::types::{ple_options, ple_stats, ple_table_info};
use ple_core::step::Pipeline;
use ple_core::{Error, Result};
use std::ffi::c_char;
use std::sync::Arc;

/// Opaque handle to an open table and its step pipeline. Create with `ple_open`, free with
/// `ple_close`. A handle's value is an id, never an address: libple never dereferences it, never
/// hands the same value out twice in a process, and answers a closed or foreign value with
/// `PLE_E_INVALID_ARGUMENT`.
///
/// Thread safety: every call may come from any thread. `ple_submit` calls on one handle are
/// serialised internally (submit from one thread to keep the order of your seqs); `ple_wait`,
/// `ple_stats`, `ple_table_info`, `ple_ngram_ids` may run concurrently with anything, and
/// `ple_close` with any of them (see `ple_close`).
pub struct ple_handle {
    _private: u8,
}

/// Open handles: handle value → its pipeline. Every call looks its handle up here, never
/// dereferencing it, so a closed or foreign pointer is an error (not undefined behaviour), and a
/// call racing with `ple_close` keeps the pipeline alive until it returns.
type Registry = std::collections::HashMap<usize, Arc<Pipeline>>;
static HANDLES: std::sync::LazyLock<std::sync::Mutex<Registry>> =
    std::sync::LazyLock::new(Default::default);

/// The value of the first handle. Handle values are ids, not addresses: `HANDLE_BASE + 16 n` for
/// the n-th `ple_open` of the process, never reused, so a stale pointer kept after `ple_close`
/// never names a later handle. On 64-bit targets the values are non-canonical addresses: a
/// caller that dereferences one faults at once instead of reading someone else's memory.
const HANDLE_BASE: usize = if usize::BITS >= 64 {
    0x7e1e_0000_0000_0000_u64 as usize
} else {
    0x8000_0000
};
static NEXT_HANDLE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A handle value never handed out before (see [`HANDLE_BASE`]).
fn new_handle_id() -> Result<usize> {
    let n = NEXT_HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    n.checked_mul(16)
        .and_then(|o| HANDLE_BASE.checked_add(o))
        .ok_or_else(|| Error::State("this process has used up its handle ids".into()))
}

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
///
/// # Safety
/// `options` is NULL or points to writable memory for one `ple_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_options_default(options: *mut ple_options) -> ple_status {
    ffi_guard!({
        let d = crate::types::options_to_c(&ple_core::step::OpenOptions::default());
        // SAFETY: `options` is NULL or writable (this function's contract).
        unsafe { write_out(options, d, "options") }
    })
}

/// Opens the packed table in directory `table_dir` read-only, validates it, and starts its step
/// pipeline (how each `io_mode` reads: docs/ARCHITECTURE.md). Blocks until the handle is ready.
/// `options` may be NULL for the defaults. On success `*out_handle` owns the handle (free it with
/// `ple_close`); on failure it is set to NULL.
///
/// Before anything is allocated, the staging the options ask for (`max_in_flight ×
/// max_tokens_per_step × 16 × row_bytes` bytes) is compared with the memory the machine can give
/// (MemAvailable, or the cgroup's `memory.max` headroom when smaller): more is refused with
/// `PLE_E_OUT_OF_MEMORY` and a message naming the bytes needed. `cuda_device >= 0` on a machine
/// without a CUDA driver returns `PLE_E_CUDA_UNAVAILABLE`.
///
/// # Safety
/// `table_dir` is NULL or a NUL-terminated string; `options` is NULL or an initialised
/// `ple_options` (from `ple_options_default`) whose path fields are NULL or NUL-terminated
/// strings; `out_handle` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_open(
    table_dir: *const c_char,
    options: *const ple_options,
    out_handle: *mut *mut ple_handle,
) -> ple_status {
    ffi_guard!({
        // SAFETY: (this and the calls below) the pointers meet this function's contract.
        unsafe { write_out(out_handle, std::ptr::null_mut(), "out_handle")? };
        // SAFETY: as above.
        let dir = unsafe { path_arg(table_dir, "table_dir")? };
        let mut c = crate::types::options_to_c(&ple_core::step::OpenOptions::default());
        if !options.is_null() {
            // callers built before the appended fields (the first is `cache_bytes`) pass the
            // shorter size of libple 0.1.0's struct; later fields keep their defaults
            let min = std::mem::offset_of!(ple_options, cache_bytes);
            // SAFETY: as above.
            let size = unsafe { read_versioned(options, &mut c, min, "options")? };
            // shard_count starts in the tail padding of the struct before it: a caller's struct
            // has the shard fields only if it holds both
            if size < std::mem::offset_of!(ple_options, shard_index) + size_of::<u32>() {
                c.shard_count = 1;
                c.shard_index = 0;
            }
        }
        // SAFETY: the path fields of `c` are NULL or NUL-terminated (this function's contract).
        let opts = unsafe { crate::types::options_from_c(&c)? };
        crate::log::init();
        let pipeline = Arc::new(Pipeline::open(&dir, opts)?);
        let id = new_handle_id()?;
        handles().insert(id, pipeline);
        // SAFETY: as above.
        unsafe { write_out(out_handle, id as *mut ple_handle, "out_handle") }
    })
}

/// Closes a handle and frees everything it holds. It wakes every call blocked on the handle and
/// returns once those calls have returned and the step in flight has stopped, and within a bound
/// whatever the storage does: a handle whose read the device stalls is freed in the background
/// when that read completes (`ple_counters.abandoned_handles`; the bound and how it is kept:
/// docs/RELIABILITY.md, "C API and pipeline").
///
/// Calls on the handle from other threads that are blocked (`ple_wait`, `ple_submit` on a full
/// ring, the wait inside `ple_dequant_*`, `ple_packed_rows` and `ple_release_step`) return
/// `PLE_E_STATE` promptly; a dequant already copying rows finishes its copy first. Calls made
/// after `ple_close` started get `PLE_E_INVALID_ARGUMENT`. NULL is a no-op, and so is a second
/// `ple_close` of the same pointer: handle values are never reused within a process, so a stale
/// pointer never closes another handle.
///
/// A GPU handle (`cuda_device >= 0`) first releases its device waits and waits (at most 10 s)
/// for its own kernels and copies only; the bound above holds for it only while the engine's
/// streams are idle: freeing its device and pinned memory (`cuMemFree`, `cuMemFreeHost`)
/// synchronises the device in the CUDA driver, so `ple_close` then also waits for the work the
/// engine has queued on the device (docs/GPU.md, "Close").
///
/// # Safety
/// Safe for any value of `handle`: it is looked up, never dereferenced, and a value that is not
/// an open handle is ignored (and logged at debug level). It may be called from a libple callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_close(handle: *mut ple_handle) {
    if handle.is_null() {
        return;
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let removed = handles().remove(&(handle as usize));
        match removed {
            Some(p) => close_pipeline(p),
            None => log::debug!("ple_close({handle:p}): not an open handle; ignored"),
        }
    }));
    if let Err(p) = r {
        log::error!("panic while closing a handle: {}", panic_message(&*p));
    }
}

/// Shuts `p` down and drops it once every other call holding it has returned (they are woken by
/// the shutdown and return within microseconds; a running dequant within its copy time).
fn close_pipeline(mut p: Arc<Pipeline>) {
    p.shutdown();
    let mut pause = std::time::Duration::from_micros(20);
    loop {
        match Arc::try_unwrap(p) {
            // dropping the pipeline joins its worker and pool threads
            Ok(pipeline) => return drop(pipeline),
            Err(still_shared) => p = still_shared,
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(1));
    }
}

/// Copies facts about the open table into `*info` (set `info->struct_size = sizeof(ple_info)`).
///
/// # Safety
/// `info` is NULL or points to a writable struct of `info->struct_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_table_info(
    handle: *const ple_handle,
    info: *mut ple_table_info,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        let i = crate::types::info_with_io_to_c(&h.table_info(), h.io_info());
        // SAFETY: `info` meets this function's contract.
        unsafe { write_versioned(&i, info, "info") }
    })
}

/// Copies the handle's cumulative counters into `*stats` (set `stats->struct_size = sizeof(ple_counters)`).
/// May run concurrently with any call. Cheap enough to read around every step (no system call
/// but a clock read): `resident_pages` and `mem_available_bytes` are 0 here (since 0.2; they are
/// measured by `ple_stats_residency`), `table_pages` is counted.
///
/// # Safety
/// `stats` is NULL or points to a writable struct of `stats->struct_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_stats(handle: *const ple_handle, stats: *mut ple_stats) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        let s = crate::types::counters_to_c(&h.counters());
        // SAFETY: `stats` meets this function's contract.
        unsafe { write_versioned(&s, stats, "stats") }
    })
}

/// `ple_stats` with the table's page-cache residency (`resident_pages`: a `mincore` pass over the
/// row file's mapping) and `mem_available_bytes` (/proc/meminfo) measured at the call, which
/// therefore takes a time that grows with the table's size (tenths of a second for a few GiB:
/// docs/REFERENCE.md, "Limitations"): call it now and then, not every step. New in 0.2.
///
/// # Safety
/// `stats` is NULL or points to a writable struct of `stats->struct_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_stats_residency(
    handle: *const ple_handle,
    stats: *mut ple_stats,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        let s = crate::types::counters_to_c(&h.stats());
        // SAFETY: `stats` meets this function's contract.
        unsafe { write_versioned(&s, stats, "stats") }
    })
}
