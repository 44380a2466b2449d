//! What a table is packed from: a checkpoint directory (`checkpoint.rs`, fingerprinted by
//! `fingerprint.rs`) or a llama.cpp Qwen4Exp GGUF file (`gguf_source.rs`,
//! `docs/FORMAT.md#gguf-sources`). This is the one place that tells the two apart, so neither
//! reader depends on the other.

use crate::error::{Error, Result};
use crate::format::checkpoint::{Checkpoint, PleLayer};
use crate::format::{fingerprint, gguf, gguf_source};
use std::path::Path;

/// Whether `path` is a GGUF file (a regular file that starts with the GGUF magic).
fn is_gguf(path: &Path) -> bool {
    path.is_file() && gguf::is_gguf(path)
}

/// The PLE table of the source at `path` (its only PLE layer).
pub fn open(path: &Path) -> Result<Checkpoint> {
    open_layer(path, None)
}

/// The PLE layers of the source at `path` (`docs/FORMAT.md#several-ple-layers`); a GGUF has one.
pub fn layers(path: &Path) -> Result<Vec<PleLayer>> {
    if is_gguf(path) {
        // the tensor and the keys are checked when it is opened
        return Ok(vec![PleLayer {
            index: 0,
            prefix: gguf_source::PLE_TENSOR.to_string(),
            decoder_layer: None,
        }]);
    }
    Checkpoint::layers(path)
}

/// The PLE layer whose `ple_layer_index` is `layer` (`None`: the only one) of the source at `path`.
pub fn open_layer(path: &Path, layer: Option<u64>) -> Result<Checkpoint> {
    if is_gguf(path) {
        if let Some(k) = layer.filter(|&k| k != 0) {
            return Err(Error::Format(format!(
                "{}: a GGUF carries one PLE layer (index 0), not layer {k}",
                path.display()
            )));
        }
        return gguf_source::open(path);
    }
    Checkpoint::open_layer(path, layer)
}

/// The fingerprint a table packed from the source at `path` records
/// (`docs/FORMAT.md#checkpoint-fingerprint`).
pub fn fingerprint(path: &Path) -> Result<String> {
    if is_gguf(path) {
        return gguf_source::open(path).map(|ck| ck.fingerprint);
    }
    fingerprint::fingerprint(path)
}
