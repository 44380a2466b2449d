//! The packer's entry (`ple pack`, `ple_pack`): what a source holds decides what is packed: its
//! only PLE layer, one chosen layer (`pack_table.rs`), or every layer as a set
//! (`pack_layers.rs`, `docs/FORMAT.md#several-ple-layers`).

use crate::error::Result;
use crate::format::files::non_empty;
use crate::format::pack_layers::{pack_layers, replace_set};
pub use crate::format::pack_table::{MAX_BUFFER_BYTES, MIN_BUFFER_BYTES, PackOptions, PackReport};
use crate::format::pack_table::{pack_one, shard_meta};
use crate::format::source::Source;
use std::path::Path;

/// Packs `checkpoint` (a checkpoint directory or a GGUF file) into `out`: its only PLE layer, the
/// layer `opts.layer`, or every layer (`out/layer-K/`, `docs/FORMAT.md#several-ple-layers`).
/// `progress(done, total)` returns false to cancel.
pub fn pack(
    checkpoint: &Path,
    out: &Path,
    opts: &PackOptions,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<PackReport> {
    non_empty(checkpoint, "checkpoint directory")?;
    non_empty(out, "output directory")?;
    if opts.buffer_bytes < MIN_BUFFER_BYTES {
        return crate::invalid!("buffer_bytes {} < {MIN_BUFFER_BYTES}", opts.buffer_bytes);
    }
    let src = Source::scan(checkpoint)?;
    let layers = src.layers()?;
    if opts.layer.is_none() && layers.len() > 1 {
        return pack_layers(checkpoint, &src, &layers, out, opts, progress);
    }
    let ck = src.open_layer(opts.layer)?;
    shard_meta(ck.table_meta()?, opts.shard)?; // servable, before a set in `out` is replaced
    replace_set(out, opts.force)?;
    pack_one(&ck, out, opts, progress)
}
