//! Test kit for libple: generated checkpoints and tables ([`synth`]), real-English token streams
//! ([`text`]) and Markov/Zipf corpora built from them ([`corpus`]). Not published; used by the
//! tests, the benchmark and the demo.

pub mod corpus;
pub mod text;

/// The table and checkpoint generators live in the core (`ple_core::testkit`, behind its
/// `testkit` feature) so that the core's own unit tests use the same code without a second copy
/// of the core's types.
pub use ple_core::testkit::{step, synth};
