//! One module per `ple` subcommand (wasmtime-cli's `src/commands/` shape): each owns its
//! `#[derive(clap::Args)]` struct and its `run()`.

pub mod bench;
pub mod demo;
pub mod inspect;
pub mod lookup;
pub mod pack;
pub mod synth_checkpoint;
pub mod synth_table;
