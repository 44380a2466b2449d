//! The offline path: safetensors checkpoint → packed table (`docs/FORMAT.md`).

pub mod checkpoint;
pub mod pack;
pub mod table;
