//! `ple synth-checkpoint` (hidden): a generated safetensors checkpoint, for tests and benchmarks.

use clap::Args;
use ple_core::error::Result;
use std::path::PathBuf;

/// `ple synth-checkpoint <dir>` (hidden): writes a generated safetensors checkpoint (tests, bench).
#[derive(Args, Debug)]
pub struct SynthCheckpointArgs {
    pub dir: PathBuf,
    /// nvfp4, fp8, bf16 or f32.
    #[arg(long, default_value = "nvfp4")]
    pub format: String,
    /// ngram_vocab_size_base (the table has about 16 × base rows).
    #[arg(long, default_value_t = 1000)]
    pub base: u64,
    /// split_ngram_parts.
    #[arg(long, default_value_t = 128)]
    pub shards: u32,
    #[arg(long, default_value_t = 8)]
    pub shards_per_file: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write the hash tensors.
    #[arg(long)]
    pub hash_tensors: bool,
    /// One model.safetensors, no index.
    #[arg(long)]
    pub single_file: bool,
    /// Do not write config.json.
    #[arg(long)]
    pub no_config: bool,
    /// ngram_size (the model's: 3).
    #[arg(long, default_value_t = ple_core::model::NGRAM_SIZE)]
    pub ngram_size: u32,
    /// heads_per_ngram (the model's: 8).
    #[arg(long, default_value_t = ple_core::model::HEADS_PER_NGRAM)]
    pub heads_per_ngram: u32,
    /// Elements per head: ple_embed_dim = (ngram_size - 1) × heads_per_ngram × head_dim (the
    /// model's: 160).
    #[arg(long, default_value_t = ple_core::model::HEAD_DIM as u32)]
    pub head_dim: u32,
}

/// Writes a generated checkpoint (see [`ple_testkit::synth::write_checkpoint`]).
pub fn run(a: SynthCheckpointArgs) -> Result<()> {
    let format = ple_core::model::RowFormat::parse(&a.format)?;
    let mut spec = ple_testkit::synth::CheckpointSpec::new(format, a.base, a.shards, a.seed);
    spec.shards_per_file = a.shards_per_file;
    spec.single_file = a.single_file;
    spec.write_config = !a.no_config;
    spec.config.ngram_size = a.ngram_size;
    spec.config.heads_per_ngram = a.heads_per_ngram;
    let heads = ple_core::model::heads_of(a.ngram_size, a.heads_per_ngram);
    spec.config.ple_embed_dim = u32::try_from(heads * a.head_dim as u64).map_err(|_| {
        ple_core::Error::InvalidArgument(format!(
            "{heads} heads × head_dim {} too wide",
            a.head_dim
        ))
    })?;
    spec.config.validate()?;
    if let Err(m) = format.check_head_dim(a.head_dim as usize) {
        return Err(ple_core::Error::InvalidArgument(m));
    }
    if a.hash_tensors {
        spec = spec.with_hash_tensors();
    }
    let t0 = std::time::Instant::now();
    let info = ple_testkit::synth::write_checkpoint(&a.dir, &spec)?;
    println!(
        "ple synth-checkpoint: {} ({}): {} files, {} shards × {} rows, table {} bytes, {:.1} s",
        a.dir.display(),
        format.name(),
        info.files.len(),
        info.num_shards,
        info.rows_per_shard,
        info.table_bytes,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
