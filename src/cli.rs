//! The `ple` subcommands (the binary in `src/bin/ple.rs` only parses and dispatches).

use crate::error::{Error, Result};
use clap::Args;
use std::path::PathBuf;

/// `ple pack <checkpoint_dir> <out_dir> [--force]`
#[derive(Args, Debug)]
pub struct PackArgs {
    /// Checkpoint directory (model.safetensors.index.json + shards, or model.safetensors).
    pub checkpoint_dir: PathBuf,
    /// Output table directory.
    pub out_dir: PathBuf,
    /// Replace an existing table packed from another checkpoint.
    #[arg(long)]
    pub force: bool,
}

/// `ple inspect <table_dir> [--json]`
#[derive(Args, Debug)]
pub struct InspectArgs {
    pub table_dir: PathBuf,
    #[arg(long)]
    pub json: bool,
    /// config.json for tables made by the Python tool.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// `ple lookup <table_dir> --tokens 9707,11,... [--json]`
#[derive(Args, Debug)]
pub struct LookupArgs {
    pub table_dir: PathBuf,
    /// Comma-separated token ids of one sequence starting at position 0.
    #[arg(long, value_delimiter = ',', required = true)]
    pub tokens: Vec<i32>,
    #[arg(long)]
    pub json: bool,
}

/// `ple bench <table_dir> [--json FILE]`
#[derive(Args, Debug)]
pub struct BenchArgs {
    pub table_dir: PathBuf,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `ple demo [--work-dir DIR]`
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Where the generated checkpoint, table and reports go.
    #[arg(long, default_value = ".ple-demo")]
    pub work_dir: PathBuf,
}

/// `ple synth-table <dir>` (hidden; for tests and benchmarks): writes a generated table.
#[derive(Args, Debug)]
pub struct SynthTableArgs {
    pub dir: PathBuf,
    /// nvfp4, fp8 or bf16.
    #[arg(long, default_value = "nvfp4")]
    pub format: String,
    /// ngram_vocab_size_base: rows ≈ 16 × base.
    #[arg(long, default_value_t = 1000)]
    pub base: u64,
    /// split_ngram_parts.
    #[arg(long, default_value_t = 128)]
    pub shards: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The real model's full shape and hash parameters, with a sparse (all-zero) row file.
    #[arg(long)]
    pub full_sparse: bool,
}

pub fn synth_table(a: SynthTableArgs) -> Result<()> {
    let format = crate::model::RowFormat::parse(&a.format)?;
    let meta = if a.full_sparse {
        crate::synth::write_sparse_full_table(&a.dir, format)?
    } else {
        crate::synth::write_table(
            &a.dir,
            format,
            &crate::synth::small_config(a.base, a.shards),
            a.seed,
        )?
    };
    println!(
        "{}: {} rows of {} bytes ({})",
        a.dir.display(),
        meta.total_rows,
        meta.row_bytes,
        format.name()
    );
    Ok(())
}

pub fn pack(_a: PackArgs) -> Result<()> {
    Err(Error::Unsupported("ple pack: not implemented yet".into()))
}

pub fn inspect(_a: InspectArgs) -> Result<()> {
    Err(Error::Unsupported(
        "ple inspect: not implemented yet".into(),
    ))
}

pub fn lookup(_a: LookupArgs) -> Result<()> {
    Err(Error::Unsupported("ple lookup: not implemented yet".into()))
}

pub fn bench(_a: BenchArgs) -> Result<()> {
    Err(Error::Unsupported("ple bench: not implemented yet".into()))
}

pub fn demo(_a: DemoArgs) -> Result<()> {
    Err(Error::Unsupported("ple demo: not implemented yet".into()))
}
