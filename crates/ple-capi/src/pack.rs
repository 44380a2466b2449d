//! `ple_pack`: checkpoint → packed table.

use crate::boundary::{path_arg, read_versioned, write_out};
use crate::status::ple_status;
use crate::types::{ple_pack_options, ple_progress_fn};
use std::ffi::{c_char, c_void};

/// Fills `options` with the packing defaults.
///
/// # Safety
/// `options` is NULL or points to writable memory for one `ple_pack_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_pack_options_default(options: *mut ple_pack_options) -> ple_status {
    ffi_guard!({
        let d = crate::types::pack_options_to_c(&ple_core::format::pack::PackOptions::default());
        // SAFETY: `options` is NULL or writable (this function's contract).
        unsafe { write_out(options, d, "options") }
    })
}

/// Packs the checkpoint in `checkpoint_dir` (or the llama.cpp GGUF file `checkpoint_dir` names:
/// docs/FORMAT.md, "GGUF sources") into a table in `out_dir` (created if needed; a checkpoint
/// with several PLE layers gets one table per layer, `out_dir/layer-K/`, indexed by
/// `out_dir/layers.json`: docs/FORMAT.md, "Several PLE layers"), blocking
/// until it is written and synced. An identical existing table is reused; one from another
/// checkpoint is refused unless `options->force`. Crash-safe: an interrupted pack never leaves a
/// table that opens, and handles open on a table it replaces keep reading the old rows (how:
/// docs/FORMAT.md, "The packed table"). Another pack writing into `out_dir` at the same time is
/// refused with `PLE_E_STATE`. `progress` (may be NULL) is called from the calling thread, between
/// writes, while libple holds no lock: it may call any libple function.
///
/// # Safety
/// `checkpoint_dir` and `out_dir` are NULL or NUL-terminated strings; `options` is NULL or an
/// initialised `ple_pack_options`; `progress`, if not NULL, may be called with `user_data`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ple_pack(
    checkpoint_dir: *const c_char,
    out_dir: *const c_char,
    options: *const ple_pack_options,
    progress: ple_progress_fn,
    user_data: *mut c_void,
) -> ple_status {
    ffi_guard!({
        // SAFETY: (these three) the pointers meet this function's contract.
        let ck = unsafe { path_arg(checkpoint_dir, "checkpoint_dir")? };
        // SAFETY: as above.
        let out = unsafe { path_arg(out_dir, "out_dir")? };
        let mut c =
            crate::types::pack_options_to_c(&ple_core::format::pack::PackOptions::default());
        if !options.is_null() {
            // callers built before the shard fields pass the shorter size of 0.1.0's struct
            let min = std::mem::offset_of!(ple_pack_options, shard_count);
            // SAFETY: as above.
            unsafe { read_versioned(options, &mut c, min, "options")? };
        }
        let opts = crate::types::pack_options_from_c(&c)?;
        crate::log::init();
        let mut cb = |done: u64, total: u64| -> bool {
            match progress {
                Some(f) => f(done, total, user_data) == 0,
                None => true,
            }
        };
        ple_core::format::pack::pack(&ck, &out, &opts, &mut cb).map(|_| ())
    })
}
