//! The step pipeline: submit → worker (hash, prefetch, gather, upload) → `done = seq` → wait.

mod gpu;
pub mod options;
pub mod pipeline;

pub use options::{IoMode, OpenOptions, PrefetchPolicy, RingFullPolicy, WaitMode};
pub use pipeline::Pipeline;

#[cfg(test)]
mod io_tests;
