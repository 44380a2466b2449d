//! The all-cached step of `ple bench steady`: a decode step whose rows are all in the row cache
//! against the same step on a handle without a cache (MMAP, warm page cache); once repeated back
//! to back (the data in the CPU's caches and TLB) and once over distinct decode steps in turn
//! (as a decode loop meets them).

use super::report::pct;
use super::workload::Workload;
use crate::commands::bench::steps::{Stages, Step};
use ple_core::error::Result;
use ple_core::stats;
use ple_core::step::{OpenOptions, Pipeline};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Instant;

/// Latencies of `n` runs of `steps` in turn from `*next` on `p` (submit → wait), ns, appended to
/// `lat`; returns the cache misses they took.
fn repeat(
    p: &Pipeline,
    steps: &[Step],
    next: &mut usize,
    seq: &mut u64,
    n: usize,
    lat: &mut Vec<u64>,
) -> Result<u64> {
    let c0 = p.counters();
    for _ in 0..n {
        *seq += 1;
        let st = &steps[*next % steps.len()];
        *next += 1;
        let t = Instant::now();
        p.submit(&st.batch(), *seq)?;
        p.wait(*seq, 0)?;
        lat.push(stats::ns(t.elapsed()));
        p.release_step(*seq)?;
    }
    Ok(p.counters().cache_misses - c0.cache_misses)
}

/// Alternating rounds (pairs) of the all-cached comparison.
const ROUNDS: usize = 10;
/// Steps per handle per round.
const PER_ROUND: usize = 30;
/// Distinct decode steps the second comparison takes in turn.
const DISTINCT: usize = 64;

/// What one all-cached comparison measured.
struct Compared {
    cached: f64,
    mmap: f64,
    misses: u64,
    /// Each round's cached p50 over its MMAP p50.
    pairs: Vec<f64>,
    pair_median: f64,
}

/// `steps` in turn on the cached handle `p` and on `plain` (MMAP, no cache), in alternating
/// rounds (so a shared machine's drift hits both alike), after one warm-up pass over them on
/// each (their rows cached from then on, and in the page cache).
fn compare(
    p: &Pipeline,
    plain: &Pipeline,
    steps: &[Step],
    seqs: &mut (u64, u64),
) -> Result<Compared> {
    let (mut junk, mut at) = (Vec::new(), (0usize, 0usize));
    let warm = steps.len().max(3);
    repeat(p, steps, &mut at.0, &mut seqs.0, warm, &mut junk)?;
    repeat(plain, steps, &mut at.1, &mut seqs.1, warm, &mut junk)?;
    let (mut lc, mut lm, mut pairs, mut misses) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for _ in 0..ROUNDS {
        let (mut c, mut m) = (Vec::new(), Vec::new());
        misses += repeat(p, steps, &mut at.0, &mut seqs.0, PER_ROUND, &mut c)?;
        repeat(plain, steps, &mut at.1, &mut seqs.1, PER_ROUND, &mut m)?;
        pairs.push(pct(&c, 50.0) / pct(&m, 50.0).max(1e-9));
        lc.extend(c);
        lm.extend(m);
    }
    let mut sorted = pairs.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Compared {
        cached: pct(&lc, 50.0),
        mmap: pct(&lm, 50.0),
        misses,
        pair_median: (sorted[ROUNDS / 2 - 1] + sorted[ROUNDS / 2]) / 2.0,
        pairs,
    })
}

impl Compared {
    fn line(&self, what: &str) -> String {
        format!(
            "all-cached {what}: p50 {:.1} µs with the cache ({} misses in {} runs) vs {:.1} µs MMAP warm ({ROUNDS} alternating rounds of {PER_ROUND}): {:.2}×; per pair (round p50 over round p50) median {:.2}×, {} (target ≤ 1.0×)",
            self.cached,
            self.misses,
            ROUNDS * PER_ROUND,
            self.mmap,
            self.cached / self.mmap.max(1e-9),
            self.pair_median,
            self.pairs
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        )
    }
}

/// A decode step whose rows are all cached, on the cached handle, against the same step on a
/// handle without a cache (MMAP, warm page cache), in alternating rounds (so a shared machine's
/// drift hits both alike); and the bare per-row costs of both copies.
pub(super) fn hit_path(
    p: &Pipeline,
    wl: &Workload,
    table_dir: &Path,
    opts: &OpenOptions,
) -> Result<Value> {
    let Some(cache) = p.row_cache() else {
        return Ok(Value::Null);
    };
    let st = wl.decode_step();
    if st.tokens.is_empty() {
        return Ok(Value::Null);
    }
    let plain = Pipeline::open(
        table_dir,
        OpenOptions {
            cache_bytes: 0,
            io_mode: ple_core::step::IoMode::Mmap,
            ..opts.clone()
        },
    )?;
    let mut seqs = (1u64 << 40, 0u64);
    let (pc0, mc0) = (p.counters(), plain.counters());
    let one = compare(p, &plain, std::slice::from_ref(&st), &mut seqs)?;
    let stages = |a: &stats::Counters, b: &stats::Counters| {
        let mut s = Stages::default();
        s.add(a, b);
        s.means()
    };
    println!(
        "  mean per step, cached handle: {}; MMAP handle: {}",
        stages(&pc0, &p.counters()),
        stages(&mc0, &plain.counters())
    );
    // as in a decode loop: each step's rows last touched a cycle of steps ago, not in the CPU's
    // caches and TLB as a step repeated back to back is (steps with at least half the first
    // one's tokens: requests end)
    let distinct: Vec<Step> = (0..DISTINCT)
        .map(|k| wl.decode_step_at(k))
        .filter(|s| 2 * s.tokens.len() >= st.tokens.len())
        .collect();
    let fewest = distinct.iter().map(|s| s.tokens.len()).min().unwrap_or(0);
    let many = compare(p, &plain, &distinct, &mut seqs)?;
    // bare copies on this thread: cache lookups vs. rows of the MMAP handle's warm mapping (the
    // same copy from the cached DIRECT handle's own mapping measured 13–15 ns a row, against ~4)
    let mut ids = vec![0i64; st.tokens.len() * 16];
    p.ngram_ids(&st.batch(), &mut ids)?;
    let rb = cache.row_bytes();
    let mut buf = vec![0u8; rb];
    let mut out = vec![0u8; ids.len() * rb];
    let uids: Vec<u64> = ids.iter().map(|&x| x as u64).collect();
    let reps = 200;
    let t = Instant::now();
    let mut found = 0usize;
    for _ in 0..reps {
        for &id in &uids {
            found += cache.lookup(id, &mut buf) as usize;
        }
    }
    let lookup_ns = t.elapsed().as_nanos() as f64 / (reps * uids.len()) as f64;
    let t = Instant::now();
    for _ in 0..reps {
        found += cache.lookup_batch(&uids, &mut out, |_, _| ()) as usize;
    }
    let batch_ns = t.elapsed().as_nanos() as f64 / (reps * uids.len()) as f64;
    let t = Instant::now();
    for _ in 0..reps {
        ple_core::io::gather::gather_serial(plain.table().bytes(), rb, &uids, &mut out)?;
    }
    let mmap_ns = t.elapsed().as_nanos() as f64 / (reps * uids.len()) as f64;
    let n = st.tokens.len();
    println!(
        "{}",
        one.line(&format!("decode step of {n} tokens, one step repeated"))
    );
    println!(
        "{}",
        many.line(&format!(
            "decode steps of {fewest}-{n} tokens, {} distinct in turn",
            distinct.len()
        ))
    );
    println!(
        "hit path, one thread: {lookup_ns:.1} ns per row by lookup, {batch_ns:.1} by lookup_batch (what a step uses), from the cache ({:.0}% found) vs {mmap_ns:.1} ns per row copied from the MMAP handle's warm mapping; the cache on huge pages: {} of {} MiB",
        100.0 * found as f64 / (2 * reps * uids.len()) as f64,
        cache
            .huge_page_bytes()
            .map_or("?".into(), |b| (b >> 20).to_string()),
        cache.allocated_bytes() >> 20
    );
    Ok(json!({
        "tokens": n, "cached_p50_us": one.cached, "mmap_warm_p50_us": one.mmap,
        "misses": one.misses, "lookup_ns_per_row": lookup_ns, "mmap_copy_ns_per_row": mmap_ns,
        "pair_ratios": one.pairs, "pair_ratio_median": one.pair_median,
        "distinct": {
            "steps": distinct.len(), "cached_p50_us": many.cached, "mmap_warm_p50_us": many.mmap,
            "misses": many.misses, "pair_ratios": many.pairs, "pair_ratio_median": many.pair_median,
        },
        "lookup_batch_ns_per_row": batch_ns,
        "cache_huge_page_bytes": cache.huge_page_bytes(),
    }))
}
