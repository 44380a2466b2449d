//! The `ple` subcommands (the binary in `src/bin/ple.rs` only parses and dispatches).

use clap::Args;
use ple_core::error::{Error, Result};
use std::path::PathBuf;

/// `ple pack <checkpoint_dir> <out_dir> [--force]`
#[derive(Args, Debug)]
pub struct PackArgs {
    /// Checkpoint directory (model.safetensors.index.json + shards, or model.safetensors).
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
    #[arg(long, value_name = "K/N", value_parser = parse_shard)]
    pub shard: Option<ple_core::shard::Shard>,
}

/// `K/N` → shard K of N (1 <= N <= 16, K < N).
pub fn parse_shard(s: &str) -> std::result::Result<ple_core::shard::Shard, String> {
    let (k, n) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}' is not K/N (shard K of N, e.g. 1/4)"))?;
    let num = |x: &str| x.trim().parse::<u32>().map_err(|e| format!("'{s}': {e}"));
    ple_core::shard::Shard::new(num(k)?, num(n)?).map_err(|e| e.to_string())
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
    /// Also check that the table was packed from this checkpoint (fingerprint).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
}

/// `ple synth-checkpoint <dir>` (hidden): writes a generated safetensors checkpoint (tests, bench).
#[derive(Args, Debug)]
pub struct SynthCheckpointArgs {
    pub dir: PathBuf,
    /// nvfp4, fp8 or bf16.
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
    /// Repetitions of each measured step shape (more: steadier percentiles, longer run).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Gather threads of the handle (0 = number of CPUs).
    #[arg(long, default_value_t = 0)]
    pub threads: u32,
    /// Skip the cold (page cache evicted) measurements.
    #[arg(long)]
    pub warm_only: bool,
    #[command(flatten)]
    pub steady: crate::steady::SteadyArgs,
    /// The engine loop with read-ahead off/on (`bench/engine.rs`).
    #[arg(long)]
    pub engine: bool,
    /// --engine: tokens per prompt, per prefill chunk; pairs of off/on runs.
    #[arg(long, default_value_t = 16384)]
    pub engine_prompt_tokens: usize,
    #[arg(long, default_value_t = 2048)]
    pub chunk_tokens: usize,
    #[arg(long, default_value_t = 2)]
    pub pairs: usize,
    /// --engine: compute before and after PLE per prefill chunk and per decode step (ms).
    #[arg(long, default_value_t = 2.0)]
    pub prefill_before_ms: f64,
    #[arg(long, default_value_t = 600.0)]
    pub prefill_after_ms: f64,
    #[arg(long, default_value_t = 2.0)]
    pub decode_before_ms: f64,
    #[arg(long, default_value_t = 20.0)]
    pub decode_after_ms: f64,
    /// --engine: decode steps, requests per step, drafts per request.
    #[arg(long, default_value_t = 32)]
    pub decode_steps: usize,
    #[arg(long, default_value_t = 8)]
    pub decode_requests: usize,
    #[arg(long, default_value_t = 4)]
    pub drafts: usize,
    /// --engine: row cache of the DIRECT handles (MiB); steps timed for the p99 check.
    #[arg(long, default_value_t = 256)]
    pub engine_cache_mib: u64,
    #[arg(long, default_value_t = 400)]
    pub p99_steps: usize,
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
    /// The real model's full shape and hash parameters, every row written with pseudo-random
    /// bytes (seeded by `--seed`) at device speed (O_DIRECT where the file system takes it).
    #[arg(long, conflicts_with = "full_sparse")]
    pub full: bool,
}

pub fn synth_table(a: SynthTableArgs) -> Result<()> {
    let format = ple_core::model::RowFormat::parse(&a.format)?;
    let meta = if a.full_sparse {
        ple_testkit::synth::write_sparse_full_table(&a.dir, format)?
    } else if a.full {
        crate::synth_full::write_dense_full_table(&a.dir, format, a.seed)?
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

/// Packs with an indicatif progress bar on stderr (bytes, rate, ETA), or `progress DONE TOTAL`
/// lines when `lines` is set.
pub fn pack_with_bar(
    checkpoint: &std::path::Path,
    out: &std::path::Path,
    opts: &ple_core::format::pack::PackOptions,
    lines: bool,
) -> Result<ple_core::format::pack::PackReport> {
    let mut bar: Option<indicatif::ProgressBar> = None;
    let mut cb = |done: u64, total: u64| -> bool {
        if lines {
            eprintln!("progress {done} {total}");
            return true;
        }
        let b = bar.get_or_insert_with(|| {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b
        });
        b.set_position(done);
        true
    };
    let r = ple_core::format::pack::pack(checkpoint, out, opts, &mut cb);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    r
}

pub fn pack(a: PackArgs) -> Result<()> {
    ple::log::init();
    let opts = ple_core::format::pack::PackOptions {
        force: a.force,
        buffer_bytes: a.buffer_bytes,
        preallocate: !a.no_preallocate,
        shard: a.shard.unwrap_or_default(),
    };
    let r = pack_with_bar(&a.checkpoint_dir, &a.out_dir, &opts, a.progress_lines)?;
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

pub fn inspect(a: InspectArgs) -> Result<()> {
    let opts = ple_core::format::table::TableOpenOptions {
        config_json_path: a.config.clone(),
        checkpoint_dir: a.checkpoint.clone(),
    };
    let t = match ple_core::format::table::Table::open(&a.table_dir, &opts) {
        Ok(t) => t,
        Err(e) => {
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({ "table_dir": a.table_dir, "valid": false, "error": e.to_string() })
                );
            } else {
                println!("table:        {}", a.table_dir.display());
                println!("valid:        no");
            }
            return Err(e);
        }
    };
    let m = t.meta();
    let info = ple_core::format::table::table_info(&t);
    if a.json {
        let v = serde_json::json!({
            "table_dir": a.table_dir,
            "valid": true,
            "rows_path": t.rows_path(),
            "file_size": info.file_size,
            "addressed_rows": info.addressed_rows,
            "format_code": info.format,
            "meta": m,
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("serialises"));
        return Ok(());
    }
    println!("table:        {}", a.table_dir.display());
    println!(
        "rows file:    {} ({} bytes)",
        t.rows_path().display(),
        info.file_size
    );
    println!(
        "format:       {} ({} B/row: {} code + {} scale bytes)",
        m.row_format.name(),
        m.row_bytes,
        m.code_bytes,
        m.scale_bytes
    );
    println!(
        "rows:         {} ({} shards × {}), {} addressed by the hash",
        m.total_rows, m.num_shards, m.rows_per_shard, info.addressed_rows
    );
    if let Some(s) = &m.shard {
        println!(
            "head shard:   {}/{}: heads {}..{}, the whole table's rows {}..{} (of {})",
            s.index,
            s.count,
            s.first_head,
            s.first_head + s.heads,
            s.first_row,
            s.first_row + m.total_rows,
            s.whole_total_rows
        );
    }
    println!(
        "heads:        {} × {} elements, ngram_size {}, {} heads per order",
        m.num_heads, m.head_dim, m.ngram_size, m.heads_per_ngram
    );
    println!(
        "tokens:       vocab_size {}, eos {}",
        m.hash.vocab_size, m.hash.eos_token_id
    );
    println!("global scale: {}", m.global_scale);
    println!("multipliers:  {:?}", m.hash.multipliers);
    println!("head sizes:   {:?}", m.hash.head_sizes);
    println!(
        "source:       {} (fingerprint {})",
        m.source.name,
        if m.source.fingerprint.is_empty() {
            "unknown"
        } else {
            &m.source.fingerprint
        }
    );
    println!("valid:        yes");
    Ok(())
}

/// Writes a generated checkpoint (see [`ple_testkit::synth::write_checkpoint`]).
pub fn synth_checkpoint(a: SynthCheckpointArgs) -> Result<()> {
    let format = ple_core::model::RowFormat::parse(&a.format)?;
    let mut spec = ple_testkit::synth::CheckpointSpec::new(format, a.base, a.shards, a.seed);
    spec.shards_per_file = a.shards_per_file;
    spec.single_file = a.single_file;
    spec.write_config = !a.no_config;
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

pub fn lookup(a: LookupArgs) -> Result<()> {
    let t = ple_core::format::table::Table::open(&a.table_dir, &Default::default())?;
    let ids = lookup_ids(t.hash_params(), &a.tokens)?;
    if a.json {
        println!("{}", serde_json::json!({ "ids": ids }));
    } else {
        for (p, (tok, row)) in a.tokens.iter().zip(&ids).enumerate() {
            let row: Vec<String> = row.iter().map(|i| i.to_string()).collect();
            println!("{p}\t{tok}\t{}", row.join(" "));
        }
    }
    Ok(())
}

/// The 16 row ids of each token of one sequence starting at position 0.
pub fn lookup_ids(params: &ple_core::model::HashParams, tokens: &[i32]) -> Result<Vec<Vec<i64>>> {
    if tokens.is_empty() {
        return Err(Error::InvalidArgument("no tokens".into()));
    }
    let hasher = ple_core::lookup::hash::Hasher::new(params)?;
    let positions: Vec<i32> = (0..tokens.len() as i32).collect();
    let b = ple_core::lookup::context::Batch {
        tokens,
        positions: &positions,
        request_ids: &[0],
        query_start: &[0, tokens.len() as u32],
        context: None,
    };
    ple_core::lookup::context::validate_batch(&b, params.vocab_size, u32::MAX)?;
    let tracker =
        ple_core::lookup::context::Tracker::new(params.ngram_size, params.eos_token_id, 2)?;
    let ctx = ple_core::lookup::context::resolve_contexts(
        &b,
        Some(&tracker),
        params.eos_token_id,
        params.ngram_size,
    )?;
    let heads = hasher.num_heads();
    let mut out = vec![0i64; tokens.len() * heads];
    ple_core::lookup::context::compute_ids_i64(&hasher, &b, &ctx, &mut out);
    Ok(out.chunks(heads).map(|c| c.to_vec()).collect())
}

pub fn bench(a: BenchArgs) -> Result<()> {
    if a.engine {
        return crate::bench::engine::run(&a);
    }
    if a.steady.steady {
        return crate::steady::run(&a);
    }
    if a.steady.shard.is_some() {
        return ple_core::invalid!("--shard runs with --steady (the serving workload)");
    }
    crate::bench::run(&a)
}

pub fn demo(a: DemoArgs) -> Result<()> {
    ple::log::init();
    crate::demo::run(&a.work_dir)
}
