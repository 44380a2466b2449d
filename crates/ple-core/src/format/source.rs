//! What a table is packed from: a checkpoint directory (`checkpoint.rs`, fingerprinted by
//! `fingerprint.rs`) or a llama.cpp Qwen4Exp GGUF file (`gguf_source.rs`,
//! `docs/FORMAT.md#gguf-sources`). This is the one place that tells the two apart, so neither
//! reader depends on the other.

use crate::error::{Error, Result};
use crate::format::checkpoint::{Checkpoint, CheckpointDir, PleLayer};
use crate::format::{fingerprint, gguf, gguf_source};
use std::path::{Path, PathBuf};

/// Whether `path` is a GGUF file (a regular file that starts with the GGUF magic).
fn is_gguf(path: &Path) -> bool {
    path.is_file() && gguf::is_gguf(path)
}

/// A source whose headers have been read (once): a checkpoint directory (its safetensors
/// headers, index and config.json) or a GGUF file (opened, and so read, when a layer is opened).
pub enum Source {
    Checkpoint(Box<CheckpointDir>),
    Gguf(PathBuf),
}

impl Source {
    /// Reads the source at `path`: a GGUF file, else a checkpoint directory.
    pub fn scan(path: &Path) -> Result<Source> {
        if is_gguf(path) {
            return Ok(Source::Gguf(path.to_path_buf()));
        }
        CheckpointDir::scan(path).map(|c| Source::Checkpoint(Box::new(c)))
    }

    /// Its PLE layers (`docs/FORMAT.md#several-ple-layers`); a GGUF has one.
    pub fn layers(&self) -> Result<Vec<PleLayer>> {
        match self {
            // the tensor and the keys are checked when it is opened
            Source::Gguf(_) => Ok(vec![PleLayer {
                index: 0,
                prefix: gguf_source::PLE_TENSOR.to_string(),
                decoder_layer: None,
            }]),
            Source::Checkpoint(c) => c.layers(),
        }
    }

    /// The PLE layer whose `ple_layer_index` is `layer` (`None`: the only one), located and
    /// checked.
    pub fn open_layer(&self, layer: Option<u64>) -> Result<Checkpoint> {
        match self {
            Source::Gguf(path) => {
                if let Some(k) = layer.filter(|&k| k != 0) {
                    return Err(Error::Format(format!(
                        "{}: a GGUF carries one PLE layer (index 0), not layer {k}",
                        path.display()
                    )));
                }
                gguf_source::open(path)
            }
            Source::Checkpoint(c) => c.open_layer(layer),
        }
    }
}

/// The PLE table of the source at `path` (its only PLE layer).
pub fn open(path: &Path) -> Result<Checkpoint> {
    Source::scan(path)?.open_layer(None)
}

/// The fingerprint a table packed from the source at `path` records
/// (`docs/FORMAT.md#checkpoint-fingerprint`).
pub fn fingerprint(path: &Path) -> Result<String> {
    if is_gguf(path) {
        return gguf_source::open(path).map(|ck| ck.fingerprint);
    }
    fingerprint::fingerprint(path)
}
