//! `ple bench <table_dir> [--json FILE]`: the step pipeline on realistic steps, warm and cold,
//! in both I/O modes, against baselines measured in the same run.
//!
//! Steps: a 2,048-token prefill chunk, and decode steps of 1, 8, 64 and 256 requests × 1 and 4
//! tokens, over English token streams ([`ple_testkit::corpus`]). Each step is `submit` → `wait` →
//! `release_step` on a handle with default options and `io_mode` MMAP, or DIRECT.
//!
//! - **warm**: each shape's steps are run once untimed (pages cached and mapped), then timed.
//! - **cold**: the table's pages are evicted first (`MADV_DONTNEED` on every mapping of it in the
//!   process, then `POSIX_FADV_DONTNEED` on the file; residency is checked with mincore).
//!
//! Baselines: (a) the same cold steps with prefetch off (`PLE_PREFETCH_NEVER`: MADV_RANDOM faults
//! only); (b) default readahead: the same cold decode gathers from a second mapping advised
//! MADV_NORMAL, for read amplification; (c) the memory floor: the same gathers (same pool) from an
//! anonymous in-RAM copy of the rows touched, kept at their file offsets so addresses and TLB reach
//! match (4 KiB pages: MADV_NOHUGEPAGE); (d) the storage floor ([`floor`]): random O_DIRECT reads
//! through io_uring at QD 1/64/128, 512 B and 4 KiB, beside fio's figures; (e) the seed
//! deployment's method on the same cold decode rows: a `posix_fadvise(WILLNEED)` per distinct page,
//! then the gather, from a MADV_RANDOM mapping.
//!
//! `ple bench <table_dir> --engine` runs the engine loop instead ([`engine`]); `ple bench steady`
//! is the serving workload at steady state ([`steady`]).

mod cold;
mod cpu_split;
mod engine;
mod floor;
pub(crate) mod memory;
mod report;
pub mod steady;
pub(crate) mod steps;
mod warm;

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches, Subcommand};
use ple_core::error::Result;
use ple_core::format::table::TableMeta;
use ple_core::stats;
use ple_core::step::{IoMode, OpenOptions, Pipeline};
use ple_testkit::corpus::Corpus;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Instant;
use steps::{Shape, Step, ids_of, make_steps};

/// `ple bench <table_dir> [--json FILE]`, `ple bench <table_dir> --engine`, `ple bench steady ...`
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub cmd: Option<BenchCmd>,
    #[arg(required = true)]
    pub table_dir: Option<PathBuf>,
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
    pub engine: engine::EngineArgs,
    #[command(flatten)]
    pub old_steady: OldSteady,
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// A serving workload at steady state through the row cache, beside exact LRU references
    /// (row cache sizing).
    Steady(steady::SteadyArgs),
}

impl BenchArgs {
    /// The table: clap requires it unless a subcommand is given, and [`run`] runs the
    /// subcommand first.
    pub(crate) fn dir(&self) -> &Path {
        self.table_dir
            .as_deref()
            .expect("clap requires <TABLE_DIR> without a subcommand")
    }
}

/// The old spelling of `ple bench steady`: `ple bench <table_dir> --steady [options]`. Its
/// options are accepted here but not listed in `ple bench --help`.
#[derive(Debug, Clone)]
pub struct OldSteady {
    steady: bool,
    opts: steady::SteadyOptions,
}

impl FromArgMatches for OldSteady {
    fn from_arg_matches(m: &ArgMatches) -> std::result::Result<Self, clap::Error> {
        Ok(OldSteady {
            steady: m.get_flag("steady"),
            opts: steady::SteadyOptions::from_arg_matches(m)?,
        })
    }
    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> std::result::Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for OldSteady {
    fn augment_args(cmd: Command) -> Command {
        let opts = steady::SteadyOptions::augment_args(Command::new("steady"));
        cmd.arg(
            Arg::new("steady")
                .long("steady")
                .action(ArgAction::SetTrue)
                .hide(true),
        )
        .args(opts.get_arguments().map(|a| a.clone().hide(true)))
    }
    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

/// Runs `ple bench`: the subcommand, the engine loop, the old `--steady` spelling, or the step
/// shapes.
pub fn run(a: BenchArgs) -> Result<()> {
    if let Some(BenchCmd::Steady(s)) = &a.cmd {
        return steady::run(s);
    }
    if a.engine.engine {
        return engine::run(&a);
    }
    if a.old_steady.steady {
        eprintln!("ple: `ple bench <table_dir> --steady` is now `ple bench steady <table_dir>`");
        return steady::run(&steady::SteadyArgs {
            table_dir: a.dir().to_path_buf(),
            json: a.json.clone(),
            threads: a.threads,
            opts: a.old_steady.opts.clone(),
        });
    }
    if a.old_steady.opts.shard.is_some() {
        return ple_core::invalid!(
            "--shard runs with the serving workload: `ple bench steady` (formerly --steady)"
        );
    }
    run_shapes(&a)
}

/// What every phase of the bench shares.
pub(crate) struct Ctx<'a> {
    pub(crate) a: &'a BenchArgs,
    pub(crate) opts: OpenOptions,
    /// The MMAP handle (default options otherwise).
    pub(crate) p: Pipeline,
    pub(crate) meta: TableMeta,
    pub(crate) rb: usize,
    pub(crate) file_bytes: u64,
    /// The row file's direct-I/O block (DIRECT reads whole blocks): 512 B on most drives, 4 KiB
    /// on 4Kn drives; 512 where direct I/O does not work on the file.
    pub(crate) block: u64,
    pub(crate) shapes: Vec<Shape>,
    pub(crate) steps: Vec<Vec<Step>>,
    pub(crate) ids: Vec<Vec<Vec<u64>>>,
    /// Per shape: rows and distinct rows over all its steps.
    pub(crate) uniq: Vec<Value>,
    /// The last seq submitted on `p`.
    pub(crate) seq: std::cell::Cell<u64>,
}

impl Ctx<'_> {
    /// `n` scaled by `--scale`, at least 1.
    pub(crate) fn sc(&self, n: usize) -> usize {
        ((n as f64 * self.a.scale).round() as usize).max(1)
    }
    /// Index of the shape named `name`.
    pub(crate) fn shape(&self, name: &str) -> usize {
        self.shapes
            .iter()
            .position(|s| s.name == name)
            .expect("bench shape")
    }
}

/// Threads of libple: the worker, the gather pool, the pread pool, io_uring's kernel workers.
const ENGINE_THREADS: [&str; 4] = ["ple-worker", "ple-pool", "ple-pread", "iou-"];

/// CPU time of libple's threads so far (not the caller's: its wait is not the engine's work), ns.
pub(crate) fn engine_cpu_ns() -> u64 {
    ple_core::sys::threads_cpu_ns(&ENGINE_THREADS)
}

/// CPU time of the calling thread and libple's threads so far (baselines run on the caller), ns.
pub(crate) fn caller_and_engine_cpu_ns() -> u64 {
    ple_core::sys::thread_cpu_ns() + engine_cpu_ns()
}

/// Decode shapes: (requests, tokens per request, steps).
const DECODE: [(usize, usize, usize); 8] = [
    (1, 1, 300),
    (8, 1, 300),
    (64, 1, 150),
    (256, 1, 60),
    (1, 4, 300),
    (8, 4, 200),
    (64, 4, 60),
    (256, 4, 25),
];

fn setup(a: &BenchArgs) -> Result<Ctx<'_>> {
    let opts = OpenOptions {
        num_threads: a.threads,
        io_mode: IoMode::Mmap,
        // the step shapes measure storage and the page cache, not the row cache (--steady does)
        cache_bytes: 0,
        ..OpenOptions::default()
    };
    let p = Pipeline::open(a.dir(), opts.clone())?;
    let meta = p.table().meta().clone();
    let eos = meta.hash.eos_token_id;
    let corpus = Corpus::new(meta.hash.vocab_size, eos);
    let sc = |n: usize| ((n as f64 * a.scale).round() as usize).max(1);
    let mut shapes = vec![Shape {
        name: "prefill 1x2048".into(),
        reqs: 1,
        toks: 2048,
        steps: sc(8),
    }];
    for &(r, t, n) in &DECODE {
        shapes.push(Shape {
            name: format!("decode {r}x{t}"),
            reqs: r,
            toks: t,
            steps: sc(n),
        });
    }
    let steps: Vec<Vec<Step>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| make_steps(&corpus, s, i as u64 + 1, eos))
        .collect();
    let ids: Vec<Vec<Vec<u64>>> = steps
        .iter()
        .map(|v| v.iter().map(|st| ids_of(&p, st)).collect::<Result<_>>())
        .collect::<Result<_>>()?;
    let uniq = shapes
        .iter()
        .zip(&ids)
        .map(|(s, v)| {
            let all: usize = v.iter().map(|x| x.len()).sum();
            let mut u: Vec<u64> = v.iter().flatten().copied().collect();
            u.sort_unstable();
            u.dedup();
            json!({"shape": s.name, "rows": all, "distinct_rows": u.len()})
        })
        .collect::<Vec<_>>();
    println!(
        "token streams: {} distinct words of public-domain English, Markov-generated; prefill \
         chunk distinct rows {:.0}%",
        corpus.vocab_used,
        100.0 * uniq[0]["distinct_rows"].as_f64().unwrap_or(0.0)
            / uniq[0]["rows"].as_f64().unwrap_or(1.0)
    );
    // (io_uring only: no pread pool is started to learn a number; without io_uring the floor's
    // probes do not run either)
    let block = ple_core::io::direct::DirectReader::open_uring_only(p.table().rows_path(), 1)
        .map_or(512, |r| r.align());
    Ok(Ctx {
        a,
        opts,
        block,
        file_bytes: p.table().bytes().len() as u64,
        rb: meta.row_bytes as usize,
        p,
        meta,
        shapes,
        steps,
        ids,
        uniq,
        seq: std::cell::Cell::new(0),
    })
}

/// The step shapes, warm and cold, against the baselines.
fn run_shapes(a: &BenchArgs) -> Result<()> {
    let t_start = Instant::now();
    let ctx = setup(a)?;
    let ra_kb = ple_core::sys::read_ahead_kb(ctx.p.table().rows_path());
    println!(
        "ple bench: {} ({} rows × {} B {}, {:.2} GiB), {} pool threads, {} CPUs, MemAvailable \
         {:.1} GiB, device read_ahead_kb {}",
        a.dir().display(),
        ctx.meta.total_rows,
        ctx.rb,
        ctx.meta.row_format.name(),
        ctx.file_bytes as f64 / (1u64 << 30) as f64,
        ctx.p.pool().current_num_threads(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        stats::mem_available_bytes() as f64 / (1u64 << 30) as f64,
        ra_kb.map_or("?".into(), |k| k.to_string()),
    );
    stats::thread_read_bytes_delta();
    let warm = warm::run(&ctx)?;
    let fl = floor::measure(
        ctx.p.table().rows_path(),
        ctx.file_bytes,
        a.scale,
        ctx.block as u32,
    );
    fl.print();
    let cold = if a.warm_only {
        cold::Cold::default()
    } else {
        cold::run(&ctx)?
    };
    let ratios = report::print(&ctx, &warm, &fl, &cold);
    let elapsed = t_start.elapsed();
    println!("\nbench took {:.1} s", elapsed.as_secs_f64());
    if let Some(path) = &a.json {
        let j = json!({
            "table": {
                "dir": a.dir().display().to_string(), "format": ctx.meta.row_format.name(),
                "row_bytes": ctx.rb, "total_rows": ctx.meta.total_rows,
                "file_bytes": ctx.file_bytes,
            },
            "machine": {
                "cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
                "pool_threads": ctx.p.pool().current_num_threads(),
                "mem_available_bytes": stats::mem_available_bytes(), "read_ahead_kb": ra_kb,
            },
            "streams": ctx.uniq,
            "warm": warm.json(),
            "storage_floor": fl.json(),
            "cold": cold.json(),
            "ratios": ratios,
            "elapsed_s": elapsed.as_secs_f64(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&j).expect("json"))
            .map_err(|e| ple_core::Error::io_path("writing", path, e))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
