//! The step pipeline: submit → worker (hash, prefetch, gather, upload) → `done = seq` → wait.
//!
//! [`pipeline`] (open, submit, the handle's API) · `consume` (waits, host views, dequant) ·
//! `ring` (slots and step status) · `shared` (what all threads share: park, publish, free) ·
//! `worker` (the worker thread) · `gpu` (graph and device entry points) · [`options`].

mod ahead;
mod consume;
mod gpu;
mod headroom;
pub mod options;
pub mod pipeline;
pub mod reaper;
mod ring;
mod shared;
mod worker;

pub use options::{ColdReads, IoMode, OpenOptions, PrefetchPolicy, RingFullPolicy, WaitMode};
pub use pipeline::Pipeline;
pub use shared::IoInfo;

#[cfg(test)]
mod io_tests;
