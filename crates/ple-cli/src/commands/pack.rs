//! `ple pack`: a checkpoint's PLE shards (or a GGUF's PLE tensor) into a row-addressable table.

use clap::Args;
use ple_core::error::Result;
use std::path::PathBuf;

/// `ple pack <checkpoint_dir> <out_dir> [--force]`
#[derive(Args, Debug)]
pub struct PackArgs {
    /// Checkpoint directory (model.safetensors.index.json + shards, or model.safetensors), or a
    /// llama.cpp Qwen4Exp GGUF file (F32, F16 or BF16 `per_layer_token_embd`).
    pub checkpoint_dir: PathBuf,
    /// Output table directory.
    pub out_dir: PathBuf,
    /// Replace an existing table packed from another checkpoint (or rebuild an identical one).
    #[arg(long)]
    pub force: bool,
    /// Bytes of the output buffer (memory is about twice this).
    #[arg(long, default_value_t = 8 << 20, hide = true)]
    pub buffer_bytes: usize,
    /// Do not reserve the row file's size before writing (tests the write path on a full disk).
    #[arg(long, hide = true)]
    pub no_preallocate: bool,
    /// Print `progress DONE TOTAL` lines on stderr instead of a progress bar (tests).
    #[arg(long, hide = true)]
    pub progress_lines: bool,
    /// Write a shard table: only the rows of head shard K of N (e.g. `--shard 1/4`), for a rank
    /// that opens the table with `shard_index K, shard_count N`.
    #[arg(long, value_name = "K/N", value_parser = crate::parse::parse_shard)]
    pub shard: Option<ple_core::shard::Shard>,
    /// Pack only the PLE layer with this `ple_layer_index` (its position in config.json's
    /// `ple_layer_ids`), into OUT itself. Default: every layer (OUT/layer-K/ each, and
    /// OUT/layers.json, when the checkpoint has several).
    #[arg(long, value_name = "K")]
    pub layer: Option<u64>,
}

pub fn run(a: PackArgs) -> Result<()> {
    ple::log::init();
    let opts = ple_core::format::pack::PackOptions {
        force: a.force,
        buffer_bytes: a.buffer_bytes,
        preallocate: !a.no_preallocate,
        shard: a.shard.unwrap_or_default(),
        layer: a.layer,
    };
    let r = crate::progress::pack_with_bar(&a.checkpoint_dir, &a.out_dir, &opts, a.progress_lines)?;
    let secs = r.elapsed.as_secs_f64();
    let mbps = if secs > 0.0 {
        r.bytes_written as f64 / secs / 1e6
    } else {
        0.0
    };
    let shard = match opts.shard.is_whole() {
        true => String::new(),
        false => format!(" ({})", opts.shard.describe()),
    };
    println!(
        "ple pack: {} rows{shard}, {} bytes, {secs:.2} s, {mbps:.1} MB/s, reused: {} -> {}",
        r.total_rows,
        r.table_bytes,
        if r.reused { "yes" } else { "no" },
        a.out_dir.display()
    );
    Ok(())
}
