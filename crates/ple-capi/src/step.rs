//! Steps: submit, wait, host views, CPU dequant, row ids, request release.

use crate::boundary::nonnull;
use crate::handle::{handle_ref, ple_handle};
use crate::status::ple_status;
use crate::types::{out_args, ple_batch, ple_dtype, ple_fuse_flags};
use ple_core::Result;
use std::ffi::c_void;

/// Converts a C batch to the core's borrowed view, checking pointers and lengths.
pub(crate) unsafe fn batch_arg<'a>(
    b: *const ple_batch,
    ngram_size: u32,
) -> Result<ple_core::lookup::context::Batch<'a>> {
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
    Ok(ple_core::lookup::context::Batch {
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
/// A step already consumed (`ple_dequant_*`) or released (`ple_release_step`) is still a submitted
/// step: `PLE_OK` once it is complete, or its own error while its failure is recorded (a consuming
/// call that reported the failure forgets it). So after `ple_dequant_fuse` in a device-wait mode,
/// `ple_wait(seq)` tells the engine whether the step the kernel consumed succeeded.
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
    out_dtype: ple_dtype,
    out_stride: usize,
    flags: ple_fuse_flags,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        nonnull(out, "out")?;
        // SAFETY: the caller guarantees `out` holds the step's output (see above).
        let args = out_args(out_dtype, out_stride, flags)?;
        unsafe { h.dequant_cpu(seq, out as *mut u8, args) }
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
