//! libple: serves the n-gram ("PLE") embedding table of Qwen3.8-Flash-Next-style models from NVMe
//! to the GPU, with a C ABI (`include/ple.h`). See `README.md` and `docs/ARCHITECTURE.md`.
//!
//! One module per concern: [`checkpoint`] reading, [`pack`]ing, the [`table`], the [`hash`], the
//! request [`context`], [`prefetch`], [`gather`], the step [`pipeline`], [`cuda`], [`dequant`],
//! [`stats`], and the C boundary [`ffi`].

pub mod bench;
mod bench_corpus;
pub mod checkpoint;
pub mod cli;
pub mod context;
pub mod cuda;
pub mod demo;
pub mod dequant;
pub mod error;
pub mod ffi;
pub mod gather;
pub mod hash;
pub mod logging;
pub mod model;
pub mod pack;
pub mod pipeline;
mod pipeline_gpu;
pub mod prefetch;
pub mod stats;
pub mod synth;
pub mod table;
pub mod text;

pub use error::{Error, Result};
