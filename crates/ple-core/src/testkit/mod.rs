//! Test helpers inside the crate (tokio's `test-util` shape): compiled into this crate's own
//! unit tests, and for other crates behind the `testkit` feature, which `ple-testkit` enables
//! and re-exports. Not part of the library's API: nothing outside tests, benchmarks and the demo
//! may use it.
//!
//! [`synth`]: generated tables and checkpoints whose rows are a pure function of the row id;
//! [`step`]: a stateless step of one-token requests.

pub mod step;
pub mod synth;
