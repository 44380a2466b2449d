//! Where a DIRECT row read's CPU goes: libple's own code (user time) or the kernel (system
//! time), on the worker thread that hashes, reads and copies a decode step's rows.
//!
//! The kernel splits a thread's exact CPU total between user and system by its tick samples, so
//! each split is measured over one continuous run of about a second of decode 8×1 steps of fresh
//! random tokens (every row read from storage, `O_DIRECT`): on a DIRECT handle without a row
//! cache, and on one with a 64 MiB cache filled first, so that every miss also evicts a row (the
//! steady state of a long run).

use super::Ctx;
use super::steps::Step;
use ple_core::error::Result;
use ple_core::io::cache::{Policy, RowCache};
use ple_core::step::{IoMode, Pipeline};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The row cache of the second run.
const CACHE_BYTES: u64 = 64 << 20;

/// One split run.
#[derive(Clone, Debug)]
pub(crate) struct CpuSplit {
    pub(crate) handle: &'static str,
    pub(crate) steps: u64,
    pub(crate) rows: u64,
    pub(crate) reads: u64,
    pub(crate) user_ns: u64,
    pub(crate) sys_ns: u64,
    pub(crate) wall_s: f64,
}

impl CpuSplit {
    /// (user, system) µs per row read.
    pub(crate) fn per_row_us(&self) -> (f64, f64) {
        let r = self.rows.max(1) as f64;
        (self.user_ns as f64 / 1e3 / r, self.sys_ns as f64 / 1e3 / r)
    }

    pub(crate) fn json(&self) -> Value {
        let (u, s) = self.per_row_us();
        json!({"handle": self.handle, "steps": self.steps, "rows": self.rows,
               "reads": self.reads, "worker_user_ns": self.user_ns,
               "worker_sys_ns": self.sys_ns, "wall_s": self.wall_s,
               "user_us_per_row": u, "sys_us_per_row": s})
    }
}

/// `st` with fresh pseudo-random tokens and context (`k` picks them): its rows are, but for
/// chance repeats, rows no step read before. Context tokens that are EOS stay (they stand for
/// positions before the sequence, which must be EOS).
fn fresh(st: &Step, k: u64, vocab: u32, eos: i32) -> Step {
    let mut s = st.clone();
    let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let ctx = s.context.iter_mut().filter(|t| **t != eos);
    for t in s.tokens.iter_mut().chain(ctx) {
        x = ple_core::model::splitmix64(x);
        *t = (x % vocab as u64) as i32;
    }
    s
}

/// Both runs, about `seconds` each; empty where DIRECT does not open here.
pub(crate) fn measure(ctx: &Ctx, seconds: f64) -> Result<Vec<CpuSplit>> {
    let mut out = Vec::new();
    for (handle, cache) in [("no row cache", 0), ("64 MiB row cache, full", CACHE_BYTES)] {
        let mut o = ctx.opts.clone();
        o.io_mode = IoMode::Direct;
        o.cache_bytes = cache;
        let Ok(p) = Pipeline::open(ctx.a.dir(), o) else {
            return Ok(out);
        };
        out.push(run(ctx, &p, handle, cache, seconds)?);
    }
    Ok(out)
}

fn run(
    ctx: &Ctx,
    p: &Pipeline,
    handle: &'static str,
    cache: u64,
    seconds: f64,
) -> Result<CpuSplit> {
    let (vocab, eos) = (ctx.meta.hash.vocab_size, ctx.meta.hash.eos_token_id);
    let decode = &ctx.steps[ctx.shape("decode 8x1")];
    let (mut seq, mut k) = (0u64, 0u64);
    let mut step = |st: &Step| -> Result<u64> {
        seq += 1;
        k += 1;
        let st = fresh(st, k, vocab, eos);
        p.submit(&st.batch(), seq)?;
        p.wait(seq, 0)?;
        p.release_step(seq)?;
        Ok(st.tokens.len() as u64 * 16)
    };
    // fill the cache (a third more rows than it holds, in prefill-sized steps), or one step:
    // the worker's ring is made for its thread and its buffer registered
    let capacity = cache as f64 / RowCache::row_cost(ctx.rb, Policy::default());
    let mut filled = 0u64;
    step(&decode[0])?;
    while (filled as f64) < capacity * 1.3 {
        filled += step(&ctx.steps[0][0])?;
    }
    let worker_cpu = |p: &Pipeline| p.run_on_worker(|_, _| ple_core::sys::thread_user_sys_ns());
    let (c0, (u0, s0)) = (p.counters(), worker_cpu(p)?);
    let (t0, mut n, mut rows) = (Instant::now(), 0u64, 0u64);
    while t0.elapsed() < Duration::from_secs_f64(seconds) {
        rows += step(&decode[n as usize % decode.len()])?;
        n += 1;
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let ((u1, s1), c1) = (worker_cpu(p)?, p.counters());
    Ok(CpuSplit {
        handle,
        steps: n,
        rows,
        reads: c1.storage_reads - c0.storage_reads,
        user_ns: u1 - u0,
        sys_ns: s1 - s0,
        wall_s,
    })
}
