//! The libple engine: everything the C library does, in safe Rust with no C types.
//!
//! Folders follow the data path (see `docs/ARCHITECTURE.md`):
//! [`format`](mod@format) (checkpoint → pack → table), [`lookup`] (hash, request context), [`io`]
//! (by mode: MMAP's page advice and gather, DIRECT's reads, the row cache), [`step`] (the
//! submit → worker → done = seq → wait pipeline), [`dequant`] (CPU and GPU), and [`stats`];
//! [`sync`] holds the one poisoned-lock recovery. The C ABI (`ple-capi`) wraps this crate;
//! nothing here knows a status code.

#![warn(unreachable_pub)]

pub mod dequant;
pub mod error;
pub mod format;
pub mod io;
pub mod lookup;
pub mod model;
pub mod shard;
pub mod stats;
pub mod step;
pub mod sync;
pub mod sys;

pub use error::{Error, ErrorKind, Result};

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
// The unit tests name the generator `crate::synth`.
#[cfg(test)]
use testkit::synth;
