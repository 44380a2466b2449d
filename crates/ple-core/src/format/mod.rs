//! The offline path and the files it reads and writes, in data-path order: safetensors headers →
//! checkpoint or GGUF (and its fingerprint; `source` tells them apart) → pack → packed table; the Python-tool table adapter apart.
//! Layouts: `docs/FORMAT.md`.

pub mod checkpoint;
pub mod files;
pub mod fingerprint;
pub mod gguf;
pub mod gguf_source;
mod open;
pub mod pack;
pub mod pack_layers;
pub mod pack_table;
pub mod python_table;
pub mod safetensors;
pub mod source;
pub mod table;
