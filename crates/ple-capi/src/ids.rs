//! Rows by the engine's own ids: `ple_submit_ids`, `ple_prefetch_ahead_ids`.

use crate::boundary::slice_arg;
use crate::handle::{handle_ref, ple_handle};
use crate::status::ple_status;
use crate::types::{PLE_IDS_PREFILL, ple_ids_flags};

/// The `num_tokens × num_heads` ids at `ids`.
///
/// # Safety
/// `ids` is NULL or points to `num_tokens × num_heads` readable `int64_t`.
unsafe fn ids_arg<'a>(
    ids: *const i64,
    num_tokens: u32,
    num_heads: usize,
) -> ple_core::Result<&'a [i64]> {
    let n = (num_tokens as usize)
        .checked_mul(num_heads)
        .ok_or_else(|| ple_core::Error::InvalidArgument("num_tokens too large".into()))?;
    // SAFETY: the caller's contract: `n` readable ids at `ids` (NULL is refused inside).
    unsafe { slice_arg(ids, n, "ids") }
}

/// Submits one engine step given by the row ids the engine computed itself (its own n-gram hash)
/// instead of tokens: `ids` is `[num_tokens][num_heads]` whole-table row ids (`ple_info.num_heads`
/// per token, as `ple_ngram_ids` gives them), head `h`'s id of a token in `[offset[h], offset[h] +
/// size[h])` of the table's hash (`docs/FORMAT.md`). Every id is checked before anything else: one
/// outside its head's rows is `PLE_E_INVALID_ARGUMENT` naming the token, the head and the id, and
/// nothing is read and no ring slot taken. Then the step runs as `ple_submit`'s would, through
/// the same row cache, I/O mode, read-ahead and views (`ple_wait`, `ple_packed_rows`,
/// `ple_dequant_cpu`, `ple_dequant_fuse`), and gives the same rows bit for bit as a batch whose
/// tokens hash to these ids. A head shard's handle reads only its heads' ids (all are checked).
/// Tracked request history is neither read nor changed. `num_tokens`: 1 to
/// `max_tokens_per_step`. `flags`: 0 or `PLE_IDS_PREFILL` (the rows count as prefill rows).
/// `seq` and a full ring as in `ple_submit`. The ids are copied: the array is free again when
/// the call returns.
///
/// # Safety
/// `ids` is NULL or points to `num_tokens × ple_info.num_heads` readable `int64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_submit_ids(
    handle: *mut ple_handle,
    ids: *const i64,
    num_tokens: u32,
    flags: ple_ids_flags,
    seq: u64,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        if flags & !PLE_IDS_PREFILL != 0 {
            return ple_core::invalid!("flags {flags:#x} has bits other than PLE_IDS_PREFILL");
        }
        if num_tokens == 0 {
            return ple_core::invalid!("num_tokens is 0: a step holds at least one token");
        }
        // SAFETY: `ids` meets this function's contract.
        let ids = unsafe { ids_arg(ids, num_tokens, h.num_heads())? };
        h.submit_ids(ids, flags & PLE_IDS_PREFILL != 0, seq)
    })
}

/// `ple_prefetch_ahead` of rows given by the engine's own ids (`[num_tokens][num_heads]`, checked
/// as `ple_submit_ids` checks them; nothing is queued when one is outside its head's rows): they
/// are read into the row cache in the background. Not bounded by `max_tokens_per_step`.
///
/// # Safety
/// `ids` is NULL or points to `num_tokens × ple_info.num_heads` readable `int64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_prefetch_ahead_ids(
    handle: *mut ple_handle,
    ids: *const i64,
    num_tokens: u32,
) -> ple_status {
    ffi_guard!({
        let h = handle_ref(handle)?;
        // SAFETY: `ids` meets this function's contract.
        let ids = unsafe { ids_arg(ids, num_tokens, h.num_heads())? };
        h.prefetch_ahead_ids(ids)
    })
}
