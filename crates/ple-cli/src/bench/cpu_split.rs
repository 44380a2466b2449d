//! Where a DIRECT row read's CPU goes: libple's own code (user time) or the kernel (system
//! time), on the worker thread that hashes, reads and copies a decode step's rows.
//!
//! The kernel splits a thread's exact CPU total between user and system by its tick samples, so
//! the split is measured over one continuous run of about a second of cold decode 8×1 steps on a
//! DIRECT handle without a row cache (every row read from storage, `O_DIRECT`).

use super::Ctx;
use ple_core::error::Result;
use ple_core::step::{IoMode, Pipeline};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// One split run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuSplit {
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
        json!({"steps": self.steps, "rows": self.rows, "reads": self.reads,
               "worker_user_ns": self.user_ns, "worker_sys_ns": self.sys_ns,
               "wall_s": self.wall_s, "user_us_per_row": u, "sys_us_per_row": s})
    }
}

/// Runs the 8×1 decode steps (cycling) on a DIRECT handle with no row cache for about
/// `seconds`; None where DIRECT does not open here.
pub(crate) fn measure(ctx: &Ctx, seconds: f64) -> Result<Option<CpuSplit>> {
    let mut o = ctx.opts.clone();
    o.io_mode = IoMode::Direct;
    o.cache_bytes = 0;
    let Ok(p) = Pipeline::open(&ctx.a.table_dir, o) else {
        return Ok(None);
    };
    let steps = &ctx.steps[ctx.shape("decode 8x1")];
    let worker_cpu = |p: &Pipeline| p.run_on_worker(|_, _| ple_core::sys::thread_user_sys_ns());
    // one step first: the worker's ring is made for its thread and its buffer registered
    let mut seq = 1;
    p.submit(&steps[0].batch(), seq)?;
    p.wait(seq, 0)?;
    p.release_step(seq)?;
    let (c0, (u0, s0)) = (p.counters(), worker_cpu(&p)?);
    let (t0, mut n, mut rows) = (Instant::now(), 0u64, 0u64);
    while t0.elapsed() < Duration::from_secs_f64(seconds) {
        let st = &steps[n as usize % steps.len()];
        seq += 1;
        p.submit(&st.batch(), seq)?;
        p.wait(seq, 0)?;
        p.release_step(seq)?;
        n += 1;
        rows += st.tokens.len() as u64 * 16;
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let ((u1, s1), c1) = (worker_cpu(&p)?, p.counters());
    Ok(Some(CpuSplit {
        steps: n,
        rows,
        reads: c1.storage_reads - c0.storage_reads,
        user_ns: u1 - u0,
        sys_ns: s1 - s0,
        wall_s,
    }))
}
