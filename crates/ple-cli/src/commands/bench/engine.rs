//! `ple bench <table> --engine`: an engine loop (time in the layers before PLE, submit, wait,
//! time after it) over English prompts in chunks, then decode steps of 1 + `drafts` tokens per
//! request, each run paired off/on read-ahead (`Pipeline::prefetch_ahead`) on a fresh DIRECT
//! handle with a row cache (reopened: the cache starts empty; the file's pages are dropped with
//! POSIX_FADV_DONTNEED), the prompts swapped between the two in every other pair. On: every
//! chunk of a prompt is read ahead at admission; the drafts of the next decode step are read
//! ahead after the current step is submitted. Prints the exposed wait (submit + `wait`) per
//! chunk beside its floor, max(0, the chunk's reads at the device's QD64 IOPS − the compute
//! before it), the TTFT, the decode steps' wait, and the p99 of a cached step submitted while
//! read-ahead runs against the same step idle.

use super::BenchArgs;
use super::steps::{Shape, Step, make_steps};
use clap::Args;
use ple_core::error::Result;
use ple_core::step::{IoMode, OpenOptions, Pipeline};
use ple_testkit::corpus::Corpus;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

mod p99;

/// Options of `ple bench <table_dir> --engine`.
#[derive(Args, Debug)]
#[command(next_help_heading = "Engine loop (--engine)")]
pub struct EngineArgs {
    /// Run the engine loop with read-ahead off/on instead of the step shapes.
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
    /// --engine: row cache of the DIRECT handles (MiB).
    #[arg(long, default_value_t = 256)]
    pub engine_cache_mib: u64,
    /// --engine p99 check: steps timed, idle and busy each.
    #[arg(long, default_value_t = 10000)]
    pub p99_steps: usize,
    /// --engine p99 check: rounds of idle then busy steps they are timed in (1: one idle block,
    /// then one busy block).
    #[arg(long, default_value_t = 50)]
    pub p99_rounds: usize,
    /// --engine p99 check: the engine's time between two of its steps (ms: the layers' compute
    /// of a fast decode step).
    #[arg(long, default_value_t = 5.0)]
    pub p99_gap_ms: f64,
    /// --engine p99 check: distinct cached 8 × 1 decode steps cycled through (1: the same step
    /// every time, whose rows then stay in the CPU's own caches between steps unless the
    /// reader's work evicts them).
    #[arg(long, default_value_t = 256)]
    pub p99_distinct: usize,
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(super) fn open(a: &BenchArgs) -> Result<Pipeline> {
    let o = OpenOptions {
        num_threads: a.threads,
        io_mode: IoMode::Direct,
        cache_bytes: a.engine.engine_cache_mib << 20,
        max_tokens_per_step: a.engine.chunk_tokens as u32,
        ..OpenOptions::default()
    };
    let p = Pipeline::open(a.dir(), o)?;
    let fd = p.table().file().as_raw_fd();
    let _ = ple_core::sys::fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
    Ok(p)
}

/// One step through the engine loop: compute before, submit + wait (returned), compute after.
fn engine_step(
    p: &Pipeline,
    st: &Step,
    seq: u64,
    before: Duration,
    after: Duration,
) -> Result<Duration> {
    std::thread::sleep(before);
    let t = Instant::now();
    p.submit(&st.batch(), seq)?;
    p.wait(seq, u64::MAX)?;
    let w = t.elapsed();
    p.release_step(seq)?;
    std::thread::sleep(after);
    Ok(w)
}

/// The table's hash parameters and corpus, and the device's 512 B IOPS at QD64 (printed).
fn probe(a: &BenchArgs) -> Result<(Corpus, i32, f64)> {
    let probe = Pipeline::open(
        a.dir(),
        OpenOptions {
            io_mode: IoMode::Mmap,
            cache_bytes: 0,
            ..OpenOptions::default()
        },
    )?;
    let meta = probe.table().meta();
    let corpus = Corpus::new(meta.hash.vocab_size, meta.hash.eos_token_id);
    let size = probe.table().bytes().len() as u64;
    let iops = super::floor::qd64_iops(probe.table().rows_path(), size, 512, 20_000).unwrap_or(0.0);
    println!(
        "device: {iops:.0} IOPS (512 B random O_DIRECT reads at QD64, libple's own io_uring probe)"
    );
    Ok((corpus, meta.hash.eos_token_id, iops))
}

fn ms_f(x: f64) -> Duration {
    Duration::from_secs_f64(x / 1e3)
}

/// The off/on pairs' figures, each averaged over the pairs; index 0 off, 1 on.
struct Pairs {
    /// Exposed wait per prompt chunk (ms).
    waits: [Vec<f64>; 2],
    ttft: [f64; 2],
    /// Wait per decode step (ms).
    dec: [f64; 2],
    /// Per prompt chunk: its new rows at the device's IOPS less the compute before it (ms).
    floors: Vec<f64>,
}

impl Pairs {
    /// The floor of each chunk: the rows it must read (its distinct rows not in an earlier
    /// chunk) at the device's IOPS, less the compute before it.
    fn set_floors(
        &mut self,
        p: &Pipeline,
        prompt: &[Step],
        iops: f64,
        e: &EngineArgs,
    ) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for (k, st) in prompt.iter().enumerate() {
            let u = super::steps::ids_of(p, st)?
                .into_iter()
                .filter(|&id| seen.insert(id))
                .count();
            let read_ms = u as f64 / iops.max(1.0) * 1e3;
            let compute = if k == 0 {
                e.prefill_before_ms
            } else {
                e.prefill_before_ms + e.prefill_after_ms
            };
            self.floors[k] = (read_ms - compute).max(0.0);
        }
        Ok(())
    }

    /// The prompt's chunks through the engine loop, read ahead at admission when `on`.
    fn prefill(&mut self, p: &Pipeline, prompt: &[Step], on: bool, e: &EngineArgs) -> Result<()> {
        let (pb, pa) = (ms_f(e.prefill_before_ms), ms_f(e.prefill_after_ms));
        let t0 = Instant::now();
        if on {
            for st in prompt {
                p.prefetch_ahead(&st.batch())?;
            }
        }
        for (k, st) in prompt.iter().enumerate() {
            let w = engine_step(p, st, k as u64 + 1, pb, pa)?;
            self.waits[on as usize][k] += ms(w) / e.pairs as f64;
        }
        self.ttft[on as usize] += ms(t0.elapsed() - pa) / e.pairs as f64;
        Ok(())
    }

    /// Decode steps of 1 + drafts tokens per request after the prompt's `base` steps, the next
    /// step's read ahead one step early when `on`.
    fn decode(
        &mut self,
        p: &Pipeline,
        steps: &[Step],
        base: u64,
        on: bool,
        e: &EngineArgs,
    ) -> Result<()> {
        let (db, da) = (ms_f(e.decode_before_ms), ms_f(e.decode_after_ms));
        let mut sum = 0.0;
        for (k, st) in steps.iter().enumerate() {
            std::thread::sleep(db);
            let t = Instant::now();
            p.submit(&st.batch(), base + k as u64 + 1)?;
            if on {
                if let Some(next) = steps.get(k + 1) {
                    p.prefetch_ahead(&next.batch())?;
                }
            }
            p.wait(base + k as u64 + 1, u64::MAX)?;
            if k > 0 {
                sum += ms(t.elapsed());
            }
            p.release_step(base + k as u64 + 1)?;
            std::thread::sleep(da);
        }
        self.dec[on as usize] += sum / (steps.len().max(2) - 1) as f64 / e.pairs as f64;
        Ok(())
    }

    fn print(&self, e: &EngineArgs) {
        let (waits, chunks) = (&self.waits, self.floors.len());
        println!(
            "prefill {} tokens in {}-token chunks, compute {} ms before / {} ms after each; {} pairs",
            e.engine_prompt_tokens,
            e.chunk_tokens,
            e.prefill_before_ms,
            e.prefill_after_ms,
            e.pairs
        );
        println!("chunk  exposed wait off (ms)  on (ms)  on/off  floor (ms)");
        for (k, (off, on)) in waits[0].iter().zip(&waits[1]).enumerate() {
            println!(
                "{k:>5}  {off:>21.2}  {on:>7.2}  {:>6.3}  {:>10.2}",
                on / off.max(1e-9),
                self.floors[k]
            );
        }
        let later = |v: &[f64]| v[1..].iter().sum::<f64>();
        if chunks > 1 {
            println!(
                "chunks after the first: exposed wait on/off = {:.3} (target <= 0.10)",
                later(&waits[1]) / later(&waits[0]).max(1e-9)
            );
        }
        println!("TTFT off {:.1} ms, on {:.1} ms", self.ttft[0], self.ttft[1]);
        println!(
            "decode ({} requests x (1 + {} drafts), {} ms / {} ms compute): wait per step off {:.3} ms, on {:.3} ms, on/off {:.3} (target <= 0.20)",
            e.decode_requests,
            e.drafts,
            e.decode_before_ms,
            e.decode_after_ms,
            self.dec[0],
            self.dec[1],
            self.dec[1] / self.dec[0].max(1e-9)
        );
    }
}

/// The handle's read-ahead and cache counters, once its read-ahead queue is drained (so that
/// asked = read + dropped + cached).
fn print_ahead_counters(p: &Pipeline, pair: usize, on: bool) {
    if !p.wait_ahead_idle(Duration::from_secs(60)) {
        println!("(read-ahead not drained after 60 s: its counters do not add up yet)");
    }
    let c = p.counters();
    println!(
        "pair {pair} read-ahead {}: ttft so far; ahead asked {} read {} dropped {} cached {} hits {}; cache hits {} misses {} (overall hit rate {:.3})",
        if on { "on " } else { "off" },
        c.ahead_asked,
        c.ahead_read,
        c.ahead_dropped,
        c.ahead_cached,
        c.ahead_hits,
        c.cache_hits,
        c.cache_misses,
        c.overall_hit_rate()
    );
}

pub(super) fn run(a: &BenchArgs) -> Result<()> {
    let e = &a.engine;
    let (corpus, eos, iops) = probe(a)?;
    let chunks = e.engine_prompt_tokens.div_ceil(e.chunk_tokens);
    let prompt_shape = Shape {
        name: "prompt".into(),
        reqs: 1,
        toks: e.chunk_tokens,
        steps: chunks,
    };
    let decode_shape = Shape {
        name: "decode".into(),
        reqs: e.decode_requests,
        toks: 1 + e.drafts,
        steps: e.decode_steps,
    };
    let mut r = Pairs {
        waits: [vec![0f64; chunks], vec![0f64; chunks]],
        ttft: [0f64; 2],
        dec: [0f64; 2],
        floors: vec![0f64; chunks],
    };
    for pair in 0..e.pairs {
        let prompts =
            [100, 101].map(|s| make_steps(&corpus, &prompt_shape, s + 2 * pair as u64, eos));
        for on in [false, true] {
            let prompt = &prompts[(on as usize + pair) % 2];
            let p = open(a)?;
            if on && pair == 0 {
                r.set_floors(&p, prompt, iops, e)?;
            }
            r.prefill(&p, prompt, on, e)?;
            let seed = 500 + pair as u64 + 7 * on as u64;
            let steps = make_steps(&corpus, &decode_shape, seed, eos);
            r.decode(&p, &steps, chunks as u64, on, e)?;
            print_ahead_counters(&p, pair, on);
        }
    }
    r.print(e);
    p99::cached_p99(a, &corpus, eos)
}
