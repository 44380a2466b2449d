//! Warm steps (MMAP handle, pages cached): per shape, one untimed pass, then `passes` rounds of
//! three phases — the pipeline steps, the bare gathers (the same gathers from the mapped table,
//! no pipeline) and the memory floor (c) (from an anonymous copy of the touched rows) — in
//! rotating order, so drift of a shared machine hits all three alike. Percentiles are over all
//! rounds.

use super::Ctx;
use super::memory::AnonCopy;
use super::steps::{Run, accumulate, run_steps, time_gathers};
use ple_core::error::Result;
use serde_json::{Value, json};
use std::sync::Arc;

/// What the warm phase measured.
#[derive(Default)]
pub(crate) struct Warm {
    pub(crate) runs: Vec<Run>,
    /// Per shape: the memory floor's gather latencies, ns.
    pub(crate) floor: Vec<(String, Vec<u64>)>,
    /// Per shape: the bare gathers' latencies, ns.
    pub(crate) bare: Vec<Vec<u64>>,
    /// Per shape: mean stage times.
    pub(crate) stages: Vec<Value>,
}

impl Warm {
    pub(crate) fn json(&self) -> Value {
        use super::steps::pct;
        json!({
            "runs": self.runs.iter().map(|r| r.json()).collect::<Vec<_>>(),
            "memory_floor": self.floor.iter().zip(&self.bare).map(|((n, l), b)| json!({
                "shape": n, "p50_ms": pct(l, 50.0) as f64 / 1e6,
                "p99_ms": pct(l, 99.0) as f64 / 1e6,
                "bare_gather_p50_ms": pct(b, 50.0) as f64 / 1e6,
            })).collect::<Vec<_>>(),
            "stages": self.stages,
        })
    }
}

pub(crate) fn run(ctx: &Ctx) -> Result<Warm> {
    let (p, rb) = (&ctx.p, ctx.rb);
    let passes = ctx.sc(3);
    let copy = Arc::new(AnonCopy::new(
        p.table().bytes(),
        rb,
        ctx.ids.iter().flatten().flatten().copied(),
    )?);
    let mut w = Warm::default();
    let mut seq = ctx.seq.get();
    for ((s, st), v) in ctx.shapes.iter().zip(&ctx.steps).zip(&ctx.ids) {
        run_steps(p, st, &mut seq, &s.name, "warm-up", 0)?;
        // The bare gathers and the floor run on the pipeline's worker thread (and its pool), so
        // the comparison is with the same thread, CPU and caches that gather the steps — on a VM
        // two CPUs can differ by a third in this loop.
        let v = Arc::new(v.clone());
        let on_worker = |from_copy: bool| {
            let (v, copy) = (v.clone(), copy.clone());
            p.run_on_worker(move |t, pool| {
                let src = if from_copy { copy.bytes() } else { t.bytes() };
                time_gathers(src, rb, &v, pool)
            })?
        };
        on_worker(true)?; // fault the copy's page tables in
        let c0 = p.counters();
        let mut run: Option<Run> = None;
        let (mut fl, mut bl) = (Vec::new(), Vec::new());
        for pass in 0..passes {
            for phase in 0..3 {
                match (phase + pass) % 3 {
                    0 => accumulate(&mut run, run_steps(p, st, &mut seq, &s.name, "warm", 0)?),
                    1 => bl.extend(on_worker(false)?.0),
                    _ => fl.extend(on_worker(true)?.0),
                }
            }
        }
        let c1 = p.counters();
        let n = (c1.prefill_steps + c1.decode_steps - c0.prefill_steps - c0.decode_steps).max(1);
        let us = |a: u64, b: u64| (b - a) as f64 / n as f64 / 1e3;
        w.stages.push(json!({
            "shape": s.name,
            "queue_us": us(c0.queue_ns, c1.queue_ns),
            "hash_us": us(c0.hash_ns, c1.hash_ns),
            "pages_and_prefetch_us": us(c0.prefetch_ns, c1.prefetch_ns),
            "gather_us": us(c0.gather_ns, c1.gather_ns),
            "submit_to_done_us": us(c0.prefill_step_ns + c0.decode_step_ns,
                                    c1.prefill_step_ns + c1.decode_step_ns),
            "prefetch_steps": c1.prefetch_steps - c0.prefetch_steps,
        }));
        w.runs.push(run.expect("at least one pass"));
        w.floor.push((s.name.clone(), fl));
        w.bare.push(bl);
    }
    ctx.seq.set(seq);
    Ok(w)
}
