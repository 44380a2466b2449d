//! `ple bench steady`: a serving workload at steady state, for sizing the row cache.
//!
//! `--requests` requests decode through long documents (continuous batching): each step carries
//! one token of every request past its prompt, plus up to `--prefill-chunk` prompt tokens of
//! requests that just started (chunked prefill); a request that reaches the end of its document
//! is replaced by a new one with a fresh document. Documents come from the test kit's English
//! corpus streams, or from `--trace FILE` (one document per line, space-separated token ids; the
//! first `--prompt-tokens` of each are its prompt). Requests start staggered through their
//! documents, so the run begins at steady state with a cold cache.
//!
//! Per interval and overall it prints the handle's cache hit rate, storage KiB per token and
//! reads per step as measured, the storage a direct read of each miss would move (`--sector`
//! aligned), step latency p50/p99, RSS and page-cache growth of the table; beside them the same
//! row-id sequence replayed through an exact LRU of as many rows as the cache holds, an exact LRU
//! of the 4 KiB pages the same memory holds, and each row-cache policy (at `--sizes` too).

mod hit_path;
mod plot;
mod reference;
mod report;
mod run;
mod shard;
mod shards;
mod workload;

use crate::parse::{parse_bytes, parse_io_mode, parse_shard};
use clap::Args;
use ple_core::error::Result;
use std::path::PathBuf;

/// `ple bench steady <table_dir> [--json FILE] [options]`
#[derive(Args, Debug, Clone)]
pub struct SteadyArgs {
    pub table_dir: PathBuf,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Gather threads of the handle (0 = number of CPUs).
    #[arg(long, default_value_t = 0)]
    pub threads: u32,
    #[command(flatten)]
    pub opts: SteadyOptions,
}

/// The workload, the cache and the references of `ple bench steady` (also accepted by the old
/// spelling `ple bench <table_dir> --steady`).
#[derive(Args, Debug, Clone)]
pub struct SteadyOptions {
    /// Requests decoding at once.
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// Steps to run (with --seconds: whichever ends first).
    #[arg(long, default_value_t = 2000)]
    pub steps: u64,
    /// Seconds to run.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Row cache of the handle (bytes; K, M, G suffixes are powers of 1024; 0 = none).
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    pub cache_bytes: u64,
    /// Prompt tokens of each document (prefilled in chunks).
    #[arg(long, default_value_t = 1024)]
    pub prompt_tokens: usize,
    /// Tokens each request decodes after its prompt (generated documents).
    #[arg(long, default_value_t = 512)]
    pub decode_tokens: usize,
    /// Most prompt tokens per step.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Replay these documents: one per line, space-separated token ids.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Steps per report line.
    #[arg(long, default_value_t = 200)]
    pub interval: u64,
    /// More memory sizes to replay the references and policies at (e.g. 16M,64M,1G).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
    pub sizes: Vec<u64>,
    /// Alignment of the modelled direct read of a missed row, bytes.
    #[arg(long, default_value_t = 512)]
    pub sector: u64,
    /// Write a plot of hit rate and latency over the run here (SVG).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Skip the replayed references (the run's own figures only).
    #[arg(long)]
    pub no_reference: bool,
    /// Only replay the row-id sequence through the references and policies (no steps run, no
    /// rows read): sizes caches over long sequences quickly. The hit% column is then the
    /// default policy's replay at --cache-bytes.
    #[arg(long)]
    pub replay_only: bool,
    /// I/O mode of the handle: auto, mmap or direct (the all-cached comparison at the end always
    /// uses a second, MMAP handle).
    #[arg(long, default_value = "auto", value_parser = parse_io_mode)]
    pub io_mode: ple_core::step::IoMode,
    /// MMAP: cap the table's page-cache residency at this many bytes (`resident_bytes_max`;
    /// K, M, G suffixes; 0 = no cap).
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    pub resident_max: u64,
    /// Run as head shard K of N (a tensor-parallel rank, e.g. `--shard 1/4`), then the same
    /// steps on the whole table with N times the row cache (the N ranks' memory), and print the
    /// rank's rows, reads and KiB per token beside the whole table's (1/N expected).
    #[arg(long, value_name = "K/N", value_parser = parse_shard)]
    pub shard: Option<ple_core::shard::Shard>,
    /// With --shard: the rank's run only, not the whole table's after it (several ranks at once,
    /// `scripts/bench-tp-procs.sh`).
    #[arg(long, requires = "shard")]
    pub no_whole: bool,
    /// Run the N head shards of a tensor-parallel group in turn over the same steps, each with
    /// --cache-bytes / N of row cache, and print each shard's storage reads, cache hits and step
    /// time, and the most reads of any shard over the fewest (also replayed for contiguous
    /// blocks of heads).
    #[arg(long, value_name = "N", conflicts_with_all = ["shard", "replay_only"])]
    pub shards: Option<u32>,
}

/// Runs the steady-state benchmark.
pub fn run(a: &SteadyArgs) -> Result<()> {
    run::run(a)
}
