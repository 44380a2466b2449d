//! The step pipeline: submit → worker (hash, prefetch, gather, upload) → `done = seq` → wait.

mod gpu;
pub mod options;
pub mod pipeline;

pub use options::{OpenOptions, PrefetchPolicy, RingFullPolicy, WaitMode};
pub use pipeline::Pipeline;
