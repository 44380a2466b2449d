//! The p99 check of `ple bench --engine`: cached 8 × 1 decode steps submitted while read-ahead
//! runs against the same steps idle. The steps cycle through `--p99-distinct` consecutive decode
//! steps of 8 requests, all in the row cache (a warm-up runs each once; the timed steps' cache
//! misses are printed), so that, as in an engine's decode loop, a step's rows were last touched
//! a cycle ago, not 5 ms ago: with one step repeated, its rows and index lines stay in the
//! CPU's own caches between idle steps, which any other work (the reader's) evicts. The two are
//! timed in `--p99-rounds` alternating blocks (idle, then busy) so that the machine's other
//! load, whose tails dwarf the reader's on a shared VM, falls on both alike. Steps come `--p99-gap-ms` apart (the engine's compute between them). A busy block
//! queues read-ahead of new text a piece at a time, whenever the queue is drained, right after a
//! step (where an engine asks for its next drafts), so every step of it is submitted with rows
//! queued or in flight; the queue is drained before the next idle block.

use super::super::BenchArgs;
use super::super::steps::{Shape, Stages, Step, make_steps};
use super::{ms, open};
use ple_core::error::Result;
use ple_core::step::Pipeline;
use ple_testkit::corpus::Corpus;
use std::time::{Duration, Instant};

/// Tokens of new text per piece of read-ahead (16 rows each): ~14 ms of reads at 72k IOPS.
const PIECE_TOKENS: usize = 64;
/// Pieces generated at a time (one stream each time).
const PIECES: usize = 64;
/// Longest wait for the queue to drain after a busy block.
const DRAIN: Duration = Duration::from_secs(120);

/// The nearest-rank 99th (or `q`-th) percentile of `v` (not empty).
fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

/// New text for the reader, a piece at a time (no piece repeats another's rows but by chance).
struct Pieces<'a> {
    corpus: &'a Corpus,
    eos: i32,
    next_seed: u64,
    left: Vec<Step>,
}

impl Pieces<'_> {
    fn next(&mut self) -> Step {
        if self.left.is_empty() {
            let shape = Shape {
                name: "ahead".into(),
                reqs: 1,
                toks: PIECE_TOKENS,
                steps: PIECES,
            };
            self.left = make_steps(self.corpus, &shape, self.next_seed, self.eos);
            self.left.reverse();
            self.next_seed += 1;
        }
        self.left.pop().expect("a shape of PIECES steps")
    }
}

/// One timed step: submit + wait (µs); then `after` (what the engine does once a step's rows
/// are in: read-ahead of the next drafts) and the gap.
fn time_step(
    p: &Pipeline,
    st: &Step,
    seq: u64,
    gap: Duration,
    mut after: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let t = Instant::now();
    p.submit(&st.batch(), seq)?;
    p.wait(seq, u64::MAX)?;
    let us = ms(t.elapsed()) * 1e3;
    p.release_step(seq)?;
    after()?;
    std::thread::sleep(gap);
    Ok(us)
}

pub(super) fn cached_p99(a: &BenchArgs, corpus: &Corpus, eos: i32) -> Result<()> {
    let e = &a.engine;
    let p = open(a)?;
    let shape = Shape {
        name: "p99".into(),
        reqs: 8,
        toks: 1,
        steps: e.p99_distinct.max(1),
    };
    let steps = make_steps(corpus, &shape, 900, eos);
    let step = |seq: u64| &steps[seq as usize % steps.len()];
    let mut pieces = Pieces {
        corpus,
        eos,
        next_seed: 999,
        left: Vec::new(),
    };
    let rounds = e.p99_rounds.max(1);
    let gap = Duration::from_secs_f64(e.p99_gap_ms.max(0.0) / 1e3);
    let per = e.p99_steps.div_ceil(rounds).max(1);
    let mut seq = 0u64;
    for _ in 0..steps.len().max(10) {
        seq += 1;
        // warm-up: the steps' rows into the cache (no gap: nothing is timed)
        time_step(&p, step(seq), seq, Duration::ZERO, || Ok(()))?;
    }
    let c_timed = p.counters();
    let (mut idle, mut busy) = (Vec::new(), Vec::new());
    // busy steps that found the reader busy (its collision count moved over the step and the
    // gap after it) and those that did not
    let (mut hit, mut clear) = (Vec::new(), Vec::new());
    let (mut idle_st, mut busy_st) = (Stages::default(), Stages::default());
    for _ in 0..rounds {
        let c0 = p.counters();
        for _ in 0..per {
            seq += 1;
            idle.push(time_step(&p, step(seq), seq, gap, || Ok(()))?);
        }
        let c1 = p.counters();
        idle_st.add(&c0, &c1);
        if p.wait_ahead_idle(Duration::ZERO) {
            p.prefetch_ahead(&pieces.next().batch())?;
        }
        for _ in 0..per {
            seq += 1;
            let k = p.ahead_collisions();
            let us = time_step(&p, step(seq), seq, gap, || {
                if p.wait_ahead_idle(Duration::ZERO) {
                    p.prefetch_ahead(&pieces.next().batch())?;
                }
                Ok(())
            })?;
            busy.push(us);
            match p.ahead_collisions() > k {
                true => hit.push(us),
                false => clear.push(us),
            }
        }
        busy_st.add(&c1, &p.counters());
        if !p.wait_ahead_idle(DRAIN) {
            println!("(read-ahead not drained after {DRAIN:?}: the next idle block is not idle)");
        }
    }
    let c = p.counters();
    let misses = c.cache_misses - c_timed.cache_misses;
    let (i99, b99) = (pct(&mut idle, 0.99), pct(&mut busy, 0.99));
    println!(
        "cached 8x1 step ({} distinct, {misses} cache misses) every {:.1} ms, {rounds} rounds of {per} idle then {per} busy steps: p99 idle {i99:.1} µs, while read-ahead runs {b99:.1} µs, ratio {:.3} (target <= 1.2); p50 {:.1} / {:.1} µs; ahead rows read meanwhile {}",
        steps.len(),
        ms(gap),
        b99 / i99.max(1e-9),
        pct(&mut idle, 0.5),
        pct(&mut busy, 0.5),
        c.ahead_read
    );
    let of = |v: &mut Vec<f64>| match v.is_empty() {
        true => "-".to_string(),
        false => format!("p50 {:.1} µs, p99 {:.1} µs", pct(v, 0.5), pct(v, 0.99)),
    };
    println!(
        "  busy steps that found the reader reading: {} of {} ({:.2}%), {}; the others: {}",
        hit.len(),
        busy.len(),
        100.0 * hit.len() as f64 / busy.len().max(1) as f64,
        of(&mut hit),
        of(&mut clear)
    );
    println!(
        "  stage means, idle: {}; busy: {}",
        idle_st.means(),
        busy_st.means()
    );
    Ok(())
}
