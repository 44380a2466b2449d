//! The `ple` command-line tool.
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
    Pack,
    /// Show a table's metadata and validation result.
    Inspect,
    /// Print the 16 row ids of each token of a sequence.
    Lookup,
    /// Benchmark a table.
    Bench,
    /// End-to-end demo on a generated table.
    Demo,
}

fn main() {
    let cli = Cli::parse();
    match cli.cmd {
        _ => {
            eprintln!("not implemented yet");
            std::process::exit(2);
        }
    }
}
