//! The C ABI. Thin: every export checks its arguments, converts them to safe Rust values, calls the
//! core, and maps the result to a status code. One macro (`ffi_guard!`) wraps every body so no
//! panic crosses into C and every error leaves its text for `ple_last_error_message()`.
//!
//! Conventions for every function below: pointer arguments are checked for NULL; a status `< 0`
//! means failure and `ple_last_error_message()` then holds the cause; handles are opaque and owned
//! by the caller between `ple_open` and `ple_close`.
#![allow(non_camel_case_types, clippy::missing_safety_doc)]

use crate::error::{Error, Result};
use crate::logging;
use crate::pipeline::Pipeline;
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_void};
use std::path::PathBuf;
use std::sync::Arc;

/// Status codes (`ple_status`).
pub mod status {
    /// Success.
    pub const PLE_OK: i32 = 0;
    /// A bad argument: NULL pointer, wrong struct size, out-of-range value, malformed batch.
    pub const PLE_E_INVALID_ARGUMENT: i32 = -1;
    /// An I/O call failed (open, read, write, mmap, fsync, rename).
    pub const PLE_E_IO: i32 = -2;
    /// A file is malformed or does not match its metadata / source checkpoint.
    pub const PLE_E_FORMAT: i32 = -3;
    /// A wait ran past its timeout.
    pub const PLE_E_TIMEOUT: i32 = -4;
    /// The call does not fit the handle's state (sequence number never submitted, reused or consumed).
    pub const PLE_E_STATE: i32 = -5;
    /// CUDA was requested but no CUDA driver could be loaded.
    pub const PLE_E_CUDA_UNAVAILABLE: i32 = -6;
    /// A CUDA driver call failed.
    pub const PLE_E_CUDA: i32 = -7;
    /// Valid request that this build, table or device does not support.
    pub const PLE_E_UNSUPPORTED: i32 = -8;
    /// An internal panic was caught at the boundary (a bug in libple; please report it).
    pub const PLE_E_PANIC: i32 = -9;
    /// An allocation failed.
    pub const PLE_E_OUT_OF_MEMORY: i32 = -10;
}
pub use status::*;

/// Status code returned by every fallible libple call: `PLE_OK` (0) or a negative `PLE_E_*`.
pub type ple_status = i32;

/// Major version of this header and library.
pub const PLE_VERSION_MAJOR: u32 = 0;
/// Minor version (the ABI changes with it while the major version is 0).
pub const PLE_VERSION_MINOR: u32 = 1;
/// Patch version.
pub const PLE_VERSION_PATCH: u32 = 0;
/// ABI version: `major * 10000 + minor * 100 + patch`, as returned by `ple_abi_version()`.
pub const PLE_ABI_VERSION: u32 =
    PLE_VERSION_MAJOR * 10000 + PLE_VERSION_MINOR * 100 + PLE_VERSION_PATCH;

/// Row ids per token (16 heads).
pub const PLE_NUM_HEADS: u32 = 16;
/// Elements of one token's PLE embedding (16 heads x 160).
pub const PLE_EMBED_DIM: u32 = 2560;

/// Row format `nvfp4`: 80 code bytes + 10 E4M3 block scales per row.
pub const PLE_FORMAT_NVFP4: i32 = 1;
/// Row format `fp8`: 160 E4M3 bytes per row.
pub const PLE_FORMAT_FP8: i32 = 2;
/// Row format `bf16`: 160 little-endian bf16 per row.
pub const PLE_FORMAT_BF16: i32 = 3;

/// Output element type: IEEE float32.
pub const PLE_DTYPE_F32: i32 = 0;
/// Output element type: IEEE float16.
pub const PLE_DTYPE_F16: i32 = 1;
/// Output element type: bfloat16.
pub const PLE_DTYPE_BF16: i32 = 2;

/// `ple_dequant_*` flag: add into `out` instead of overwriting it.
pub const PLE_FUSE_ACCUMULATE: u32 = 1;

/// Prefetch policy: issue WILLNEED when a step has at least `prefetch_min_rows` rows, unless a
/// residency sample (mincore of one page per 1,024 rows, at most 16) finds its pages cached.
pub const PLE_PREFETCH_AUTO: i32 = 0;
/// Prefetch policy: always issue WILLNEED before gathering.
pub const PLE_PREFETCH_ALWAYS: i32 = 1;
/// Prefetch policy: never prefetch (MADV_RANDOM faults only).
pub const PLE_PREFETCH_NEVER: i32 = 2;

/// Ring policy: `ple_submit` into a slot whose rows were not consumed blocks until they are.
pub const PLE_RING_WAIT: i32 = 0;
/// Ring policy: `ple_submit` into a slot whose rows were not consumed fails with `PLE_E_STATE`.
pub const PLE_RING_ERROR: i32 = 1;

/// GPU wait mode: device wait where supported (stream memory op, else spin kernel), else host.
pub const PLE_WAIT_AUTO: i32 = 0;
/// GPU wait mode: the host blocks in `ple_wait`, then enqueues the kernel.
pub const PLE_WAIT_HOST: i32 = 1;
/// GPU wait mode: `cuStreamWaitValue64` on the engine's stream (needs 64-bit stream mem ops).
pub const PLE_WAIT_STREAM_OP: i32 = 2;
/// GPU wait mode: a one-thread spin kernel on a device-mapped flag, with a timeout.
pub const PLE_WAIT_SPIN_KERNEL: i32 = 3;

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

/// Options for `ple_open`. Always initialise with `ple_options_default()`, then change fields:
/// `struct_size` lets later versions add fields without breaking callers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ple_options {
    /// `sizeof(ple_options)` as the caller compiled it (set by `ple_options_default`).
    pub struct_size: usize,
    /// Largest `num_tokens` one step may carry (default 8192). Sizes the staging slots.
    pub max_tokens_per_step: u32,
    /// Steps that may be submitted but not yet consumed (ring slots, default 2, 1..=64).
    pub max_in_flight: u32,
    /// Gather threads in the handle's private pool (0 = number of CPUs, default 0).
    pub num_threads: u32,
    /// `PLE_PREFETCH_AUTO` (default), `_ALWAYS` or `_NEVER`.
    pub prefetch_policy: i32,
    /// AUTO prefetches steps with at least this many rows (default 512).
    pub prefetch_min_rows: u32,
    /// `PLE_RING_WAIT` (default) or `PLE_RING_ERROR`: what `ple_submit` does when the ring is full.
    pub ring_full_policy: i32,
    /// Default timeout of `ple_wait` (and of the ring wait), microseconds (default 300 s).
    pub wait_timeout_us: u64,
    /// Tracked mode: tokens remembered per request, for context and speculative rollback (default 64, >= ngram_size - 1).
    pub history_window: u32,
    /// CUDA device ordinal, or -1 for CPU only (default -1).
    pub cuda_device: i32,
    /// `PLE_WAIT_AUTO` (default), `_HOST`, `_STREAM_OP` or `_SPIN_KERNEL`.
    pub wait_mode: i32,
    /// For tables made by the Python tool (`*.packed_u8`): path of the checkpoint's `config.json`
    /// (NULL: look beside the table). Ignored for libple tables.
    pub config_json_path: *const c_char,
    /// If not NULL: the checkpoint directory the table must have been packed from; opening fails
    /// with `PLE_E_FORMAT` when its fingerprint differs.
    pub checkpoint_dir: *const c_char,
}

/// Options for `ple_pack`. Initialise with `ple_pack_options_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ple_pack_options {
    /// `sizeof(ple_pack_options)` as the caller compiled it.
    pub struct_size: usize,
    /// Non-zero: replace an existing table packed from another checkpoint (default 0: refuse).
    pub force: i32,
    /// Bytes per write buffer (default 8 MiB; bounds the packer's memory).
    pub buffer_bytes: u64,
}

/// Progress callback of `ple_pack`: bytes written so far and in all. Return 0 to go on, non-zero to
/// cancel (the pack then fails with `PLE_E_STATE` and leaves no table behind).
pub type ple_progress_fn =
    Option<extern "C" fn(done_bytes: u64, total_bytes: u64, user_data: *mut c_void) -> i32>;

/// Log callback: `level` 1 = error, 2 = warn, 3 = info, 4 = debug, 5 = trace; `message` is valid
/// only during the call. May be called from libple's worker threads.
pub type ple_log_fn =
    Option<extern "C" fn(level: i32, message: *const c_char, user_data: *mut c_void)>;

/// One engine step's tokens. All arrays are read during the call only (`ple_submit` copies them).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ple_batch {
    /// `[num_tokens]` token ids, each in `[0, vocab_size)`.
    pub tokens: *const i32,
    /// `[num_tokens]` position of each token in its request's sequence (consecutive inside a span).
    pub positions: *const i32,
    /// Tokens in the step (1..=max_tokens_per_step).
    pub num_tokens: u32,
    /// `[num_requests]` request ids (unique within a batch).
    pub request_ids: *const u64,
    /// `[num_requests + 1]` offsets into `tokens`: first 0, last `num_tokens`, non-decreasing; request
    /// `i` owns tokens `[query_start[i], query_start[i+1])`.
    pub query_start: *const u32,
    /// Requests in the step.
    pub num_requests: u32,
    /// NULL (tracked mode: libple remembers each request's tokens), or `[num_requests][ngram_size - 1]`
    /// (stateless mode): the tokens just before each span, oldest first, EOS where the sequence has none.
    pub context: *const i32,
}

/// Facts about an open table, filled by `ple_table_info()` (named `ple_info` in C).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ple_table_info {
    /// Set by the caller to `sizeof(ple_info)`.
    pub struct_size: usize,
    /// `PLE_FORMAT_NVFP4`, `_FP8` or `_BF16`.
    pub format: i32,
    /// Bytes per row (90, 160 or 320).
    pub row_bytes: u32,
    /// Rows in the file (padded).
    pub total_rows: u64,
    /// Rows the hash can address (sum of head sizes).
    pub addressed_rows: u64,
    /// Heads (16) and elements per head (160).
    pub num_heads: u32,
    pub head_dim: u32,
    /// N-gram order (3) and vocabulary size.
    pub ngram_size: u32,
    pub vocab_size: u32,
    /// EOS / BOS token id.
    pub eos_token_id: i32,
    /// The global dequantisation scale (1.0 for bf16).
    pub global_scale: f32,
    /// Size of the row file in bytes.
    pub file_size: u64,
    /// 1 if device-side waiting is available on the handle's GPU, else 0.
    pub device_wait_supported: i32,
    /// Name of the source checkpoint (NUL-terminated, truncated to fit).
    pub source_name: [c_char; 256],
    /// Hex fingerprint of the source checkpoint's index and shard headers (NUL-terminated).
    pub source_fingerprint: [c_char; 72],
}

/// Cumulative counters of a handle, filled by `ple_stats()` (named `ple_counters` in C). Times are nanoseconds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ple_stats {
    /// Set by the caller to `sizeof(ple_counters)`.
    pub struct_size: usize,
    /// Steps completed, prefill and decode apart: a step is prefill when some request's span in it
    /// has more than 8 tokens, so speculative verification of up to 8 tokens counts as decode.
    pub prefill_steps: u64,
    pub decode_steps: u64,
    /// Tokens and rows gathered, prefill and decode apart.
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
    pub prefill_rows: u64,
    pub decode_rows: u64,
    /// Distinct 4 KiB pages the steps' rows touched (per step, summed).
    pub unique_pages: u64,
    /// Pages covered by WILLNEED prefetch ranges.
    pub pages_prefetched: u64,
    /// Steps that issued a prefetch.
    pub prefetch_steps: u64,
    /// Page faults taken by the worker and pool threads while gathering (getrusage RUSAGE_THREAD).
    pub major_faults: u64,
    pub minor_faults: u64,
    /// Bytes the worker threads caused to be read from storage (`/proc/thread-self/io` read_bytes).
    pub storage_read_bytes: u64,
    /// Time spent per stage, summed over steps.
    pub hash_ns: u64,
    pub prefetch_ns: u64,
    pub gather_ns: u64,
    pub copy_ns: u64,
    /// Time callers spent blocked in `ple_wait` / host waits.
    pub wait_ns: u64,
    /// Submit-to-done latency summed, prefill and decode apart.
    pub prefill_step_ns: u64,
    pub decode_step_ns: u64,
    /// Waits that timed out; steps that failed.
    pub timeouts: u64,
    pub failed_steps: u64,
    /// On demand at the `ple_stats` call: table pages resident in the page cache (mincore), total table pages.
    pub resident_pages: u64,
    pub table_pages: u64,
    /// On demand: MemAvailable from /proc/meminfo, bytes.
    pub mem_available_bytes: u64,
    /// Time steps spent between `ple_submit` and the worker starting them, summed: queueing
    /// behind earlier steps, and the worker thread's wake-up (part of the submit-to-done times).
    pub queue_ns: u64,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn clear_last_error() {
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
    e.status()
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
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
        clear_last_error();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<()> { $body })) {
            Ok(Ok(())) => PLE_OK,
            Ok(Err(e)) => report(&e),
            Err(p) => report(&Error::Panic(panic_message(&*p))),
        }
    }};
}

fn nonnull<T>(p: *const T, what: &str) -> Result<()> {
    if p.is_null() {
        crate::invalid!("{what} is NULL")
    } else {
        Ok(())
    }
}

/// Reads a C string argument as a path.
unsafe fn path_arg(p: *const c_char, what: &str) -> Result<PathBuf> {
    nonnull(p, what)?;
    let s = unsafe { CStr::from_ptr(p) };
    let s = s
        .to_str()
        .map_err(|_| Error::InvalidArgument(format!("{what} is not valid UTF-8")))?;
    if s.is_empty() {
        return crate::invalid!("{what} is empty");
    }
    Ok(PathBuf::from(s))
}

/// Copies a caller's versioned struct (first field `struct_size`) over `dst`, which holds the
/// defaults: fields the caller's older struct lacks keep their defaults.
unsafe fn read_versioned<T: Copy>(
    src: *const T,
    dst: &mut T,
    min_size: usize,
    what: &str,
) -> Result<()> {
    let size = unsafe { *(src as *const usize) };
    let full = std::mem::size_of::<T>();
    if size < min_size || size > full {
        return crate::invalid!(
            "{what}.struct_size is {size}, expected between {min_size} and {full} (initialise it with the *_default() function)"
        );
    }
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut T as *mut u8, size) };
    // keep our own size so later reads see all fields
    unsafe { *(dst as *mut T as *mut usize) = full };
    Ok(())
}

/// Copies a result struct into a caller's versioned struct, up to the size the caller declares.
unsafe fn write_versioned<T: Copy>(src: &T, dst: *mut T, what: &str) -> Result<()> {
    nonnull(dst, what)?;
    let size = unsafe { *(dst as *const usize) };
    let full = std::mem::size_of::<T>();
    if size < std::mem::size_of::<usize>() || size > full {
        return crate::invalid!(
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

/// Looks up an open handle. Never dereferences the pointer.
fn handle_ref(h: *const ple_handle) -> Result<Arc<Pipeline>> {
    nonnull(h, "handle")?;
    handles().get(&(h as usize)).cloned().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "handle {h:p} is not open (closed, or not from ple_open)"
        ))
    })
}

// ---------------------------------------------------------------------------------------------
// Version, errors, logging
// ---------------------------------------------------------------------------------------------

/// The library version as "MAJOR.MINOR.PATCH" (static storage; never NULL).
#[unsafe(no_mangle)]
pub extern "C" fn ple_version_string() -> *const c_char {
    static V: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(s) => s,
            Err(_) => c"?",
        };
    V.as_ptr()
}

/// The ABI version of the loaded library (`PLE_ABI_VERSION` of the header it was built with).
/// Compare with the header's `PLE_ABI_VERSION` at start-up.
#[unsafe(no_mangle)]
pub extern "C" fn ple_abi_version() -> u32 {
    PLE_ABI_VERSION
}

/// The cause of the last failed libple call on this thread, in words ("" if the last call
/// succeeded). The pointer stays valid until the next libple call on the same thread.
#[unsafe(no_mangle)]
pub extern "C" fn ple_last_error_message() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A static name for a status code ("PLE_OK", "PLE_E_IO", ...; "unknown status" otherwise).
#[unsafe(no_mangle)]
pub extern "C" fn ple_status_name(status: ple_status) -> *const c_char {
    let s: &CStr = match status {
        PLE_OK => c"PLE_OK",
        PLE_E_INVALID_ARGUMENT => c"PLE_E_INVALID_ARGUMENT",
        PLE_E_IO => c"PLE_E_IO",
        PLE_E_FORMAT => c"PLE_E_FORMAT",
        PLE_E_TIMEOUT => c"PLE_E_TIMEOUT",
        PLE_E_STATE => c"PLE_E_STATE",
        PLE_E_CUDA_UNAVAILABLE => c"PLE_E_CUDA_UNAVAILABLE",
        PLE_E_CUDA => c"PLE_E_CUDA",
        PLE_E_UNSUPPORTED => c"PLE_E_UNSUPPORTED",
        PLE_E_PANIC => c"PLE_E_PANIC",
        PLE_E_OUT_OF_MEMORY => c"PLE_E_OUT_OF_MEMORY",
        _ => c"unknown status",
    };
    s.as_ptr()
}

/// Routes libple's log messages to `callback` (NULL removes it). `max_level` (1..5) is the most
/// verbose level delivered. Without a callback, messages go to stderr at the level named by the
/// `PLE_LOG` environment variable (default warn), unless the process installed its own Rust logger.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_set_log_callback(
    callback: ple_log_fn,
    max_level: i32,
    user_data: *mut c_void,
) -> ple_status {
    ffi_guard!({
        let level = match max_level {
            1 => log::LevelFilter::Error,
            2 => log::LevelFilter::Warn,
            3 => log::LevelFilter::Info,
            4 => log::LevelFilter::Debug,
            5 => log::LevelFilter::Trace,
            _ => return crate::invalid!("max_level {max_level} not in 1..=5"),
        };
        logging::set_callback(callback, user_data, level);
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Open / close / info
// ---------------------------------------------------------------------------------------------

/// Fills `options` with the defaults (and `struct_size`). Returns `PLE_E_INVALID_ARGUMENT` on NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_options_default(options: *mut ple_options) -> ple_status {
    ffi_guard!({
        nonnull(options, "options")?;
        unsafe { options.write(crate::pipeline::OpenOptions::default().to_c()) };
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
        let mut c = crate::pipeline::OpenOptions::default().to_c();
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
        let opts = unsafe { crate::pipeline::OpenOptions::from_c(&c)? };
        logging::init();
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
        let i = h.table_info();
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
        let s = h.stats();
        unsafe { write_versioned(&s, stats, "stats") }
    })
}

// ---------------------------------------------------------------------------------------------
// Steps
// ---------------------------------------------------------------------------------------------

/// Converts a C batch to the core's borrowed view, checking pointers and lengths.
unsafe fn batch_arg<'a>(b: *const ple_batch, ngram_size: u32) -> Result<crate::context::Batch<'a>> {
    nonnull(b, "batch")?;
    let b = unsafe { &*b };
    let n = b.num_tokens as usize;
    let r = b.num_requests as usize;
    if n > 0 {
        nonnull(b.tokens, "batch.tokens")?;
        nonnull(b.positions, "batch.positions")?;
    }
    if r > 0 {
        nonnull(b.request_ids, "batch.request_ids")?;
    }
    nonnull(b.query_start, "batch.query_start")?;
    let slice = |p: *const i32, len: usize| {
        if len == 0 {
            &[][..]
        } else {
            unsafe { std::slice::from_raw_parts(p, len) }
        }
    };
    Ok(crate::context::Batch {
        tokens: slice(b.tokens, n),
        positions: slice(b.positions, n),
        request_ids: if r == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(b.request_ids, r) }
        },
        query_start: unsafe { std::slice::from_raw_parts(b.query_start, r + 1) },
        context: if b.context.is_null() {
            None
        } else {
            Some(unsafe { std::slice::from_raw_parts(b.context, r * (ngram_size as usize - 1)) })
        },
    })
}

/// Submits one engine step. Validates the batch (errors are returned here, nothing is guessed),
/// copies it, updates tracked request history, and returns; a worker then hashes, prefetches,
/// gathers and publishes `done = seq`. `seq` must be greater than every earlier `seq` of this
/// handle (0 is not a valid seq).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_submit(
    handle: *mut ple_handle,
    batch: *const ple_batch,
    seq: u64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        let b = unsafe { batch_arg(batch, h.ngram_size())? };
        h.submit(&b, seq)
    })
}

/// Blocks until step `seq` is complete (`done >= seq`), spinning briefly then sleeping.
/// `timeout_us`: microseconds, 0 = the handle's default (`wait_timeout_us`), `UINT64_MAX` = forever.
/// Returns `PLE_OK`, the step's own error, `PLE_E_TIMEOUT`, or `PLE_E_STATE` for a seq never submitted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_wait(
    handle: *const ple_handle,
    seq: u64,
    timeout_us: u64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        h.wait(seq, timeout_us)
    })
}

/// Host view of step `seq`'s packed rows: `*rows` points at `[*num_tokens][16][row_bytes]`, valid
/// until the step is consumed (`ple_dequant_*` or `ple_release_step`). Waits for the step first.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_packed_rows(
    handle: *const ple_handle,
    seq: u64,
    rows: *mut *const u8,
    num_tokens: *mut u32,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        nonnull(rows, "rows")?;
        nonnull(num_tokens, "num_tokens")?;
        let (p, n) = h.packed_rows(seq)?;
        unsafe {
            *rows = p;
            *num_tokens = n;
        }
        Ok(())
    })
}

/// Releases step `seq`'s staging slot without dequantising it (the `ple_dequant_*` calls release it
/// themselves). Releasing a step twice, or one that was never submitted, returns `PLE_E_STATE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_release_step(handle: *mut ple_handle, seq: u64) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        h.release_step(seq)
    })
}

/// Dequantises step `seq`'s rows into host memory `out`: `[num_tokens]` rows of 2560 elements of
/// `out_dtype` (`PLE_DTYPE_*`), row `t` at `out + t * out_stride` elements (`out_stride >= 2560`).
/// `flags`: `PLE_FUSE_ACCUMULATE` adds into `out`. Waits for the step, then releases its slot.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_dequant_cpu(
    handle: *mut ple_handle,
    seq: u64,
    out: *mut c_void,
    out_dtype: i32,
    out_stride: usize,
    flags: u32,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        nonnull(out, "out")?;
        // SAFETY: the caller guarantees `out` holds the step's output (see above).
        unsafe { h.dequant_cpu(seq, out as *mut u8, out_dtype, out_stride, flags) }
    })
}

/// Dequantises step `seq`'s rows into the engine's device buffer `out` (a `CUdeviceptr`) with one
/// kernel enqueued on the engine's `cuda_stream` (a `CUstream`/`cudaStream_t`; libple only
/// enqueues on it). The step is ordered before the kernel by the handle's wait mode. Layout, dtype,
/// stride and flags as in `ple_dequant_cpu`. Needs a handle opened with `cuda_device >= 0`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_dequant_fuse(
    handle: *mut ple_handle,
    cuda_stream: *mut c_void,
    seq: u64,
    out: *mut c_void,
    out_dtype: i32,
    out_stride: usize,
    flags: u32,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        nonnull(out, "out")?;
        h.dequant_fuse(cuda_stream, seq, out as u64, out_dtype, out_stride, flags)
    })
}

/// Computes the 16 row ids of every token of `batch` into `out_ids` (`[num_tokens * 16]`), with no
/// side effects: tracked history is read, not changed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_ngram_ids(
    handle: *const ple_handle,
    batch: *const ple_batch,
    out_ids: *mut i64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        let b = unsafe { batch_arg(batch, h.ngram_size())? };
        nonnull(out_ids, "out_ids")?;
        let n = b.tokens.len() * h.num_heads();
        let out = if n == 0 {
            &mut [][..]
        } else {
            unsafe { std::slice::from_raw_parts_mut(out_ids, n) }
        };
        h.ngram_ids(&b, out)
    })
}

/// Forgets a request's tracked history (tracked mode). Unknown ids are not an error.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_release_request(
    handle: *mut ple_handle,
    request_id: u64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        h.release_request(request_id);
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Packing
// ---------------------------------------------------------------------------------------------

/// Fills `options` with the packing defaults.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_pack_options_default(options: *mut ple_pack_options) -> ple_status {
    ffi_guard!({
        nonnull(options, "options")?;
        unsafe { options.write(crate::pack::PackOptions::default().to_c()) };
        Ok(())
    })
}

/// Packs the checkpoint in `checkpoint_dir` into a table in `out_dir` (created if needed), streaming
/// shard by shard, writing to a temporary name and renaming into place, metadata last. An identical
/// existing table is reused; one from another checkpoint is refused unless `options->force`.
/// `progress` (may be NULL) is called from the calling thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_pack(
    checkpoint_dir: *const c_char,
    out_dir: *const c_char,
    options: *const ple_pack_options,
    progress: ple_progress_fn,
    user_data: *mut c_void,
) -> ple_status {
    ffi_guard!({
        let ck = unsafe { path_arg(checkpoint_dir, "checkpoint_dir")? };
        let out = unsafe { path_arg(out_dir, "out_dir")? };
        let mut c = crate::pack::PackOptions::default().to_c();
        if !options.is_null() {
            unsafe {
                read_versioned(
                    options,
                    &mut c,
                    std::mem::size_of::<ple_pack_options>(),
                    "options",
                )?
            };
        }
        let opts = crate::pack::PackOptions::from_c(&c)?;
        logging::init();
        let mut cb = |done: u64, total: u64| -> bool {
            match progress {
                Some(f) => f(done, total, user_data) == 0,
                None => true,
            }
        };
        crate::pack::pack(&ck, &out, &opts, &mut cb).map(|_| ())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_versions_agree_with_cargo() {
        assert_eq!(
            PLE_VERSION_MAJOR.to_string(),
            env!("CARGO_PKG_VERSION_MAJOR")
        );
        assert_eq!(
            PLE_VERSION_MINOR.to_string(),
            env!("CARGO_PKG_VERSION_MINOR")
        );
        assert_eq!(
            PLE_VERSION_PATCH.to_string(),
            env!("CARGO_PKG_VERSION_PATCH")
        );
        let v = unsafe { CStr::from_ptr(ple_version_string()) }
            .to_str()
            .unwrap();
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
        assert_eq!(ple_abi_version(), PLE_ABI_VERSION);
    }

    #[test]
    fn panics_become_status() {
        let s = ffi_guard!({
            if PLE_OK == 0 {
                panic!("boom {}", 42);
            }
            Ok(())
        });
        assert_eq!(s, PLE_E_PANIC);
        let m = unsafe { CStr::from_ptr(ple_last_error_message()) }
            .to_str()
            .unwrap();
        assert!(m.contains("boom 42"), "{m}");
    }

    #[test]
    fn statuses_have_names() {
        for s in [
            PLE_OK,
            PLE_E_INVALID_ARGUMENT,
            PLE_E_IO,
            PLE_E_FORMAT,
            PLE_E_TIMEOUT,
            PLE_E_STATE,
            PLE_E_CUDA_UNAVAILABLE,
            PLE_E_CUDA,
            PLE_E_UNSUPPORTED,
            PLE_E_PANIC,
            PLE_E_OUT_OF_MEMORY,
        ] {
            let n = unsafe { CStr::from_ptr(ple_status_name(s)) }
                .to_str()
                .unwrap();
            assert!(n.starts_with("PLE_"), "{s} -> {n}");
        }
    }
}

#[cfg(test)]
mod header_drift {
    /// The committed `include/ple.h` must be exactly what cbindgen generates from this file.
    #[test]
    fn committed_header_matches_generated() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/ple.h"));
        let committed =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/ple.h"))
                .expect("include/ple.h is missing");
        assert!(
            committed == generated,
            "include/ple.h differs from the header generated from src/ffi.rs: run scripts/update-header.sh and commit it"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// GPU
// ---------------------------------------------------------------------------------------------

/// CUDA Graph mode, step 1. Enqueues on `cuda_stream` (the engine's `CUstream`) "the next graph
/// replay consumes step `base_seq`". Then capture `ple_dequant_fuse_graph` once and replay it
/// once per step: replay k consumes step `base_seq + k`, so submit steps `base_seq`,
/// `base_seq + 1`, ... in order, and consume every one of them by exactly one replay (the worker
/// reuses a ring slot only after a replay consumed its previous step). Call it when no replay is
/// in flight, and again with the next step after a device error. Needs `cuda_device >= 0`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_graph_prepare(
    handle: *mut ple_handle,
    cuda_stream: *mut c_void,
    base_seq: u64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        h.graph_prepare(cuda_stream, base_seq)
    })
}

/// CUDA Graph mode, step 2: enqueues on `cuda_stream` a device wait for the current graph step
/// (a spin kernel with the handle's timeout, whatever `wait_mode` is), its dequantisation into
/// `out` (a `CUdeviceptr` holding `capacity_tokens` tokens at `out_stride` elements of `out_dtype`)
/// and the advance to the next step, with no step number baked in: capture this call into a CUDA
/// graph once, after `ple_graph_prepare`. A step with more than `capacity_tokens` tokens is not
/// written and raises a device error (`ple_check_device`). `flags` as in `ple_dequant_fuse`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_dequant_fuse_graph(
    handle: *mut ple_handle,
    cuda_stream: *mut c_void,
    capacity_tokens: u32,
    out: *mut c_void,
    out_dtype: i32,
    out_stride: usize,
    flags: u32,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        nonnull(out, "out")?;
        h.dequant_fuse_graph(
            cuda_stream,
            capacity_tokens,
            out as u64,
            out_dtype,
            out_stride,
            flags,
        )
    })
}

/// Reports (and clears) the first error the handle's kernels raised on the device since the last
/// call: a device wait that timed out (`PLE_E_TIMEOUT`), a graph step larger than the captured
/// capacity or a ring slot holding another step (`PLE_E_STATE`). The affected kernels wrote
/// nothing. `PLE_OK` when there was none. Synchronise the stream first to see a kernel's error.
/// `ple_dequant_fuse*` also return a pending device error instead of enqueueing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_check_device(handle: *mut ple_handle) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        h.check_device()
    })
}
