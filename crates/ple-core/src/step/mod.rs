//! The step pipeline: submit → worker (hash, prefetch, gather, upload) → `done = seq` → wait.
//!
//! Two types with interfaces, and the loop between them:
//! - `ring`: `Completion`, the slot ring's protocol (acquire, publish, park, claim, free, cancel,
//!   graph reclaim); no I/O, no step data.
//! - [`reader`]: [`Reader`], the read engine (table, hasher, pool, row cache, direct and cold
//!   reads) behind one `read_step`; usable without the worker.
//! - `worker`: the worker thread, reading each step with the `Reader` and publishing it through
//!   the `Completion`.
//!
//! [`pipeline`] is the handle (open, submit; `reaper` its bounded close); `consume` its consumer
//! side (waits, host views, dequant, graph entry points); `ids` the calls by the engine's own
//! row ids and the read-ahead calls; `shared` what the worker and the consumers share; `plan`
//! the I/O plan resolved at open; `gate` the progress words (submitted, done, closing) the
//! read-ahead runner reads; `ahead` read ahead (its queue and runner); `trim` the residency
//! cap's trim thread; [`options`].

mod ahead;
mod consume;
mod gate;
mod headroom;
mod ids;
pub mod options;
pub mod pipeline;
mod plan;
pub mod reader;
pub mod reaper;
mod ring;
mod shared;
mod trim;
mod worker;

pub use options::{ColdReads, IoMode, OpenOptions, PrefetchPolicy, RingFullPolicy, WaitMode};
pub use pipeline::Pipeline;
pub use plan::IoInfo;
pub use reader::{ReadScratch, Reader};

#[cfg(test)]
mod io_tests;
