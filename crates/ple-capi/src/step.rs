//! Steps: submit, wait, host views, CPU dequant, row ids, request release.
//!
//! Timeouts (every blocking call of a step, and what bounds it):
//! - `ple_wait(h, seq, timeout_us)`: `timeout_us` (0 = poll, `UINT64_MAX` = forever);
//! - the wait inside `ple_packed_rows`, `ple_release_step`, `ple_dequant_cpu` (and
//!   `ple_dequant_fuse` with host waits): the handle's `wait_timeout_us`;
//! - `ple_submit` on a full ring (`PLE_RING_WAIT`): the handle's `wait_timeout_us`;
//! - all of them end early with `PLE_E_STATE` when the handle is closed.

use crate::boundary::{nonnull, read_versioned, slice_arg, slice_out, struct_arg, write_out};
use crate::handle::{handle_ref, ple_handle};
use crate::status::ple_status;
use crate::types::{
    PLE_TOKEN_BATCH_SIZE_V1, out_args, ple_batch, ple_dtype, ple_fuse_flags, ple_token_batch,
};
use ple_core::Result;
use std::ffi::c_void;

/// Converts a C batch to the core's borrowed view, checking pointers and lengths.
///
/// # Safety
/// `b` is NULL or a `ple_batch` whose arrays hold the lengths it states (see `ple_batch`) and
/// stay unchanged for `'a`.
pub(crate) unsafe fn batch_arg<'a>(
    b: *const ple_batch,
    ngram_size: u32,
) -> Result<ple_core::lookup::context::Batch<'a>> {
    // SAFETY: (this and the slices below) the batch meets this function's contract.
    let b = unsafe { struct_arg(b, "batch")? };
    let n = b.num_tokens as usize;
    let r = b.num_requests as usize;
    nonnull(b.query_start, "batch.query_start")?;
    let ctx_len = r * (ngram_size as usize).saturating_sub(1);
    Ok(ple_core::lookup::context::Batch {
        // SAFETY: as above.
        tokens: unsafe { slice_arg(b.tokens, n, "batch.tokens")? },
        // SAFETY: as above.
        positions: unsafe { slice_arg(b.positions, n, "batch.positions")? },
        // SAFETY: as above.
        request_ids: unsafe { slice_arg(b.request_ids, r, "batch.request_ids")? },
        // SAFETY: as above (`query_start` has `num_requests + 1` entries, never 0).
        query_start: unsafe { slice_arg(b.query_start, r + 1, "batch.query_start")? },
        context: if b.context.is_null() {
            None
        } else {
            // SAFETY: as above.
            Some(unsafe { slice_arg(b.context, ctx_len, "batch.context")? })
        },
    })
}

/// Submits one engine step. Validates the batch (errors are returned here, nothing is guessed),
/// copies it (the caller's arrays are free again when the call returns), updates tracked request
/// history, and returns without waiting for the rows, which are read in the background (the
/// pipeline: docs/ARCHITECTURE.md); `ple_wait(seq)` tells when they are ready. `seq` must be
/// greater than every earlier `seq` of this handle (0 is not a valid seq).
///
/// With every ring slot holding a step not yet consumed, `PLE_RING_WAIT` blocks up to the
/// handle's `wait_timeout_us` (then `PLE_E_TIMEOUT`) and `PLE_RING_ERROR` fails at once with
/// `PLE_E_STATE`; a `ple_close` meanwhile ends the wait with `PLE_E_STATE`. Tracked mode refuses a
/// batch that would track more than `PLE_MAX_TRACKED_REQUESTS` requests (`PLE_E_STATE`).
///
/// # Safety
/// `batch` is NULL or a `ple_batch` whose arrays hold the lengths it states.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_submit(
    handle: *mut ple_handle,
    batch: *const ple_batch,
    seq: u64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        // SAFETY: `batch` meets this function's contract.
        let b = unsafe { batch_arg(batch, h.ngram_size())? };
        h.submit(&b, seq)
    })
}

/// Waits until step `seq` is complete (`done >= seq`), spinning briefly then sleeping.
///
/// `timeout_us`: 0 polls (returns at once: `PLE_OK` if the step is complete, `PLE_E_TIMEOUT` if
/// not; a poll is not counted in `ple_counters.timeouts`); `UINT64_MAX` waits forever; any other
/// value waits at most that many microseconds. The handle's `wait_timeout_us` plays no part here.
/// Returns `PLE_OK`, the step's own error if it failed, `PLE_E_TIMEOUT`, `PLE_E_STATE` for a seq
/// never submitted, or `PLE_E_STATE` when `ple_close` ends the wait. A step already consumed
/// (`ple_dequant_*`) or released (`ple_release_step`) is still a submitted step: `PLE_OK` once it
/// is complete, or its own error while its failure is recorded (a consuming call that reported
/// the failure forgets it). So after `ple_dequant_fuse` in a device-wait mode, `ple_wait(seq)`
/// tells the engine whether the step the kernel consumed succeeded.
///
/// # Safety
/// Safe for any argument values (the handle is looked up, never dereferenced).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_wait(
    handle: *const ple_handle,
    seq: u64,
    timeout_us: u64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        match timeout_us {
            0 => h.poll(seq),
            t => h.wait(seq, t),
        }
    })
}

/// Host view of step `seq`'s packed rows: `*rows` points at `[*num_tokens][16][row_bytes]` (a head
/// shard's handle: `[*num_tokens][ple_info.shard_heads][row_bytes]`, its heads in order: row `j`
/// is head `shard_first_head + j·shard_head_stride`'s), valid
/// until the step is consumed (`ple_dequant_*` or `ple_release_step`). Waits for the step first,
/// up to the handle's `wait_timeout_us`. Does not consume the step.
///
/// # Safety
/// `rows` and `num_tokens` are NULL or writable.
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
        // SAFETY: both are writable (this function's contract).
        unsafe {
            write_out(rows, p, "rows")?;
            write_out(num_tokens, n, "num_tokens")
        }
    })
}

/// Releases step `seq`'s staging slot without dequantising it (the `ple_dequant_*` calls release it
/// themselves). Waits for the step first, up to the handle's `wait_timeout_us`. Releasing a step
/// twice, or one that was never submitted, returns `PLE_E_STATE`; releasing a failed step forgets
/// its error and returns `PLE_OK`.
///
/// # Safety
/// Safe for any argument values (the handle is looked up, never dereferenced).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_release_step(handle: *mut ple_handle, seq: u64) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        h.release_step(seq)
    })
}

/// Dequantises step `seq`'s rows into host memory `out`: `[num_tokens]` rows of `ple_info.embed_dim`
/// elements of `out_dtype`, row `t` at `out + t * out_stride` elements
/// (`out_stride >= embed_dim`). `flags`: `PLE_FUSE_ACCUMULATE` adds into `out`.
///
/// Waits for the step first, up to the handle's `wait_timeout_us` (so a small `wait_timeout_us`
/// bounds this call too: `PLE_E_TIMEOUT`), then dequantises and releases its slot. The step is
/// consumed only when the call returns `PLE_OK`: bad arguments, a timeout or a close leave it in
/// place for a retry. A step that failed returns its own error, and is released by that.
///
/// # Safety
/// `out` is NULL or valid for reads and writes of `(num_tokens - 1) * out_stride + embed_dim`
/// elements of `out_dtype`, aligned for it, and not accessed by anyone else during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_dequant_cpu(
    handle: *mut ple_handle,
    seq: u64,
    out: *mut c_void,
    out_dtype: ple_dtype,
    out_stride: usize,
    flags: ple_fuse_flags,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        nonnull(out, "out")?;
        let args = out_args(out_dtype, out_stride, flags)?;
        // SAFETY: `out` holds the step's output (this function's contract), which is the
        // precondition of `Pipeline::dequant_cpu`.
        unsafe { h.dequant_cpu(seq, out as *mut u8, args) }
    })
}

/// Computes the 16 row ids of every token of `batch` into `out_ids` (`[num_tokens * 16]`), with no
/// side effects: tracked history is read, not changed.
///
/// # Safety
/// `batch` is NULL or a `ple_batch` whose arrays hold the lengths it states; `out_ids` is NULL or
/// writable for `num_tokens * 16` ids.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_ngram_ids(
    handle: *const ple_handle,
    batch: *const ple_batch,
    out_ids: *mut i64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        // SAFETY: `batch` meets this function's contract.
        let b = unsafe { batch_arg(batch, h.ngram_size())? };
        nonnull(out_ids, "out_ids")?;
        let n = b.tokens.len() * h.num_heads();
        // SAFETY: `out_ids` holds `num_tokens * 16` ids (this function's contract).
        let out = unsafe { slice_out(out_ids, n, "out_ids")? };
        h.ngram_ids(&b, out)
    })
}

/// Forgets a request's tracked history (tracked mode). Unknown ids are not an error.
///
/// # Safety
/// Safe for any argument values (the handle is looked up, never dereferenced).
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

/// Converts a C per-token batch to the core's grouped view, checking the version, pointers and
/// lengths.
///
/// # Safety
/// `b` is NULL or a `ple_token_batch` of at least `struct_size` bytes whose arrays hold the
/// lengths it states.
unsafe fn token_batch_arg<'a>(
    b: *const ple_token_batch,
    ngram_size: u32,
) -> Result<ple_core::lookup::tokens::Grouped<'a>> {
    use ple_core::lookup::tokens::{TokenBatch, group_tokens};
    nonnull(b, "batch")?;
    let mut c = ple_token_batch {
        struct_size: 0,
        tokens: std::ptr::null(),
        positions: std::ptr::null(),
        token_request_ids: std::ptr::null(),
        num_tokens: 0,
        context: std::ptr::null(),
    };
    // SAFETY: `b` is not NULL and, by the caller's contract, points at a ple_token_batch of at
    // least `struct_size` bytes; read_versioned checks struct_size before copying that many.
    unsafe { read_versioned(b, &mut c, PLE_TOKEN_BATCH_SIZE_V1, "batch")? };
    let n = c.num_tokens as usize;
    // SAFETY: by the caller's contract each array holds `num_tokens` elements (slice_arg checks
    // NULL); they are read only during this call, the slices' lifetime.
    let (tokens, positions, ids) = unsafe {
        (
            slice_arg(c.tokens, n, "batch.tokens")?,
            slice_arg(c.positions, n, "batch.positions")?,
            slice_arg(c.token_request_ids, n, "batch.token_request_ids")?,
        )
    };
    let g = group_tokens(&TokenBatch {
        tokens,
        positions,
        request_ids: ids,
        context: None,
    })?;
    let context = if c.context.is_null() {
        None
    } else {
        let len = g.num_requests() * (ngram_size as usize - 1);
        // SAFETY: `[num_requests][ngram_size - 1]` long by the caller's contract (num_requests =
        // the distinct ids just counted); read only during this call.
        Some(unsafe { slice_arg(c.context, len, "batch.context")? })
    };
    Ok(g.with_context(context))
}

/// Submits one engine step in per-token form (`ple_token_batch`: tokens in any order, each with
/// its request id and position). As `ple_submit` of the same tokens grouped by request; the
/// step's rows come in the caller's token order. Callers of `ple_submit` are unaffected.
///
/// # Safety
/// `batch` is NULL or a `ple_token_batch` (with `struct_size` set) whose arrays hold the lengths
/// it states.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_submit_tokens(
    handle: *mut ple_handle,
    batch: *const ple_token_batch,
    seq: u64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        // SAFETY: `batch` is as token_batch_arg requires, by this function's contract.
        let g = unsafe { token_batch_arg(batch, h.ngram_size())? };
        h.submit_tokens(&g, seq)
    })
}

/// `ple_ngram_ids` for a per-token batch: the 16 row ids of every token into `out_ids`
/// (`[num_tokens * 16]`) in the caller's token order, with no side effects.
///
/// # Safety
/// `batch` as in `ple_submit_tokens`; `out_ids` is NULL or holds `num_tokens * 16` writable ids.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_ngram_ids_tokens(
    handle: *const ple_handle,
    batch: *const ple_token_batch,
    out_ids: *mut i64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        // SAFETY: `batch` is as token_batch_arg requires, by this function's contract.
        let g = unsafe { token_batch_arg(batch, h.ngram_size())? };
        nonnull(out_ids, "out_ids")?;
        let heads = h.num_heads();
        let b = g.batch();
        let mut grouped = vec![0i64; b.tokens.len() * heads];
        h.ngram_ids(&b, &mut grouped)?;
        let ids = g.to_caller_order(&grouped, heads);
        // SAFETY: `out_ids` is not NULL and holds `num_tokens * 16` ids by the caller's contract
        // (ids.len() is exactly that); it does not overlap `ids`, which this call owns.
        unsafe { std::ptr::copy_nonoverlapping(ids.as_ptr(), out_ids, ids.len()) };
        Ok(())
    })
}

/// Read-ahead: hashes `batch` as `ple_submit` would (stateless context, or tracked history as it
/// stands plus the batch's own earlier tokens) and queues its rows for a background reader, then
/// returns at once. No history changes, no ring slot is taken, no seq is used; the batch may be
/// longer than `max_tokens_per_step` (a whole prompt at request admission, or the drafts of the
/// next verify step). The reader fills the row cache (DIRECT, or MMAP with a cache) or the page
/// cache (MMAP without one) and gives way to submitted steps (how: docs/ARCHITECTURE.md,
/// "Read-ahead"). Rows are never wrong either way: a step reads what the cache lacks. Beyond
/// `options.ahead_max_rows` queued rows the oldest are dropped. Counted in `ple_counters.ahead_*`.
///
/// # Safety
/// `batch` is NULL or a `ple_batch` whose arrays hold the lengths it states (read only during
/// the call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_prefetch_ahead(
    handle: *mut ple_handle,
    batch: *const ple_batch,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        // SAFETY: `batch` meets this function's contract.
        let b = unsafe { batch_arg(batch, h.ngram_size())? };
        h.prefetch_ahead(&b)
    })
}

/// `ple_prefetch_ahead` of a per-token batch (`ple_token_batch`, as `ple_submit_tokens` takes).
///
/// # Safety
/// `batch` is NULL or a `ple_token_batch` (with `struct_size` set) whose arrays hold the lengths
/// it states.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_prefetch_ahead_tokens(
    handle: *mut ple_handle,
    batch: *const ple_token_batch,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        // SAFETY: `batch` is as token_batch_arg requires, by this function's contract.
        let g = unsafe { token_batch_arg(batch, h.ngram_size())? };
        h.prefetch_ahead_tokens(&g)
    })
}
