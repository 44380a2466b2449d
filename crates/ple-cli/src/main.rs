//! The `ple` command-line tool. Each subcommand is one function in [`cli`].

mod bench;
mod cli;
mod demo;
mod steady;
mod synth_full;

use clap::{Parser, Subcommand};

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
    Pack(cli::PackArgs),
    /// Show a table's metadata and validation result.
    Inspect(cli::InspectArgs),
    /// Print the 16 row ids of each token of one sequence starting at position 0.
    Lookup(cli::LookupArgs),
    /// Benchmark a table: prefill and decode steps, warm and cold, against baselines.
    Bench(Box<cli::BenchArgs>),
    /// End to end on a generated table: pack, open, replay an engine, verify, report.
    Demo(cli::DemoArgs),
    /// Write a generated table (for tests and benchmarks).
    #[command(hide = true)]
    SynthTable(cli::SynthTableArgs),
    /// Write a generated safetensors checkpoint (tests and benchmarks).
    #[command(hide = true)]
    SynthCheckpoint(cli::SynthCheckpointArgs),
}

fn main() {
    // libple's log records on stderr, level from PLE_LOG (as libple.so does for a C host)
    env_logger::Builder::from_env(env_logger::Env::new().filter("PLE_LOG")).init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Pack(a) => cli::pack(a),
        Cmd::Inspect(a) => cli::inspect(a),
        Cmd::Lookup(a) => cli::lookup(a),
        Cmd::Bench(a) => cli::bench(*a),
        Cmd::Demo(a) => cli::demo(a),
        Cmd::SynthTable(a) => cli::synth_table(a),
        Cmd::SynthCheckpoint(a) => cli::synth_checkpoint(a),
    };
    if let Err(e) = r {
        eprintln!("ple: {e}");
        std::process::exit(1);
    }
}
