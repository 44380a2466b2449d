//! `ple synth-table` (hidden): a generated table, for tests and benchmarks; `--full` writes a
//! dense one of the real model's shape ([`dense_full`]).

mod dense_full;

use clap::Args;
use ple_core::error::Result;
use std::path::PathBuf;

/// `ple synth-table <dir>` (hidden; for tests and benchmarks): writes a generated table.
#[derive(Args, Debug)]
pub struct SynthTableArgs {
    pub dir: PathBuf,
    /// nvfp4, fp8, bf16 or f32.
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
    /// The real model's full shape and hash parameters, every row written with pseudo-random
    /// bytes (seeded by `--seed`) at device speed (O_DIRECT where the file system takes it).
    #[arg(long, conflicts_with = "full_sparse")]
    pub full: bool,
}

pub fn run(a: SynthTableArgs) -> Result<()> {
    let format = ple_core::model::RowFormat::parse(&a.format)?;
    let meta = if a.full_sparse {
        ple_testkit::synth::write_sparse_full_table(&a.dir, format)?
    } else if a.full {
        dense_full::write_dense_full_table(&a.dir, format, a.seed)?
    } else {
        ple_testkit::synth::write_table(
            &a.dir,
            format,
            &ple_testkit::synth::small_config(a.base, a.shards),
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
