//! libple: serves the n-gram ("PLE") embedding table of Qwen3.8-Flash-Next-style models from NVMe
//! to the GPU, with a C ABI (`include/ple.h`). See `README.md` and `../shared/docs/SPEC.md`.
//!
//! One module per concern: [`checkpoint`] reading, [`pack`]ing, the [`table`], the [`hash`], the
//! request [`context`], [`prefetch`], [`gather`], the step [`pipeline`], [`cuda`], [`dequant`],
//! [`stats`], and the C boundary [`ffi`].

pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod context;
pub mod dequant;
pub mod error;
pub mod ffi;
pub mod gather;
pub mod logging;
pub mod model;
pub mod pack;
pub mod pipeline;
mod pipeline_hash_seam;
pub mod prefetch;
pub mod stats;
pub mod synth;
pub mod table;

pub use error::{Error, Result};
