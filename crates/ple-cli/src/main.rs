//! The `ple` command-line tool. Each subcommand is a module of [`commands`] that owns its
//! arguments (a `#[derive(clap::Args)]` struct) and its `run()`; this file only parses and
//! dispatches.

mod commands;
mod parse;
mod progress;

use clap::{Parser, Subcommand};
use commands::{bench, demo, inspect, lookup, pack, synth_checkpoint, synth_table};

#[derive(Parser)]
#[command(
    name = "ple",
    version,
    about = "Pack, inspect, query and benchmark PLE n-gram embedding tables"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Pack a checkpoint's PLE shards into a row-addressable table.
    Pack(pack::PackArgs),
    /// Show a table's metadata and validation result.
    Inspect(inspect::InspectArgs),
    /// Print the 16 row ids of each token of one sequence starting at position 0.
    Lookup(lookup::LookupArgs),
    /// Benchmark a table: prefill and decode steps, warm and cold, against baselines.
    Bench(Box<bench::BenchArgs>),
    /// End to end on a generated table: pack, open, replay an engine, verify, report.
    Demo(demo::DemoArgs),
    /// Write a generated table (for tests and benchmarks).
    #[command(hide = true)]
    SynthTable(synth_table::SynthTableArgs),
    /// Write a generated safetensors checkpoint (tests and benchmarks).
    #[command(hide = true)]
    SynthCheckpoint(synth_checkpoint::SynthCheckpointArgs),
}

fn main() {
    // libple's log records on stderr, level from PLE_LOG (as libple.so does for a C host)
    env_logger::Builder::from_env(env_logger::Env::new().filter("PLE_LOG")).init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Pack(a) => pack::run(a),
        Cmd::Inspect(a) => inspect::run(a),
        Cmd::Lookup(a) => lookup::run(a),
        Cmd::Bench(a) => bench::run(*a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::SynthTable(a) => synth_table::run(a),
        Cmd::SynthCheckpoint(a) => synth_checkpoint::run(a),
    };
    if let Err(e) = r {
        eprintln!("ple: {e}");
        std::process::exit(1);
    }
}
