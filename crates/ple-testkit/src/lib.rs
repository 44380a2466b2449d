//! Test kit for libple: generated checkpoints and tables ([`synth`]), real-English token streams
//! ([`text`]) and Markov/Zipf corpora built from them ([`corpus`]). Not published; used by the
//! tests, the benchmark and the demo.

pub mod corpus;
pub mod synth;
pub mod text;
