//! The all-cached step of `ple bench steady`: a decode step whose rows are all in the row cache
//! against the same step on a handle without a cache (MMAP, warm page cache).

use super::report::pct;
use super::workload::Workload;
use crate::commands::bench::steps::{Stages, Step};
use ple_core::error::Result;
use ple_core::stats;
use ple_core::step::{OpenOptions, Pipeline};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Instant;

/// Latencies of `n` runs of `st` on `p` (submit → wait), ns, appended to `lat`; returns the
/// cache misses they took.
fn repeat(p: &Pipeline, st: &Step, seq: &mut u64, n: usize, lat: &mut Vec<u64>) -> Result<u64> {
    let c0 = p.counters();
    for _ in 0..n {
        *seq += 1;
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
    let (mut seq, mut seq2) = (1u64 << 40, 0u64);
    let (mut lc, mut lm, mut junk) = (Vec::new(), Vec::new(), Vec::new());
    repeat(p, &st, &mut seq, 3, &mut junk)?; // the rows are cached from here on
    repeat(&plain, &st, &mut seq2, 3, &mut junk)?; // and in the page cache
    let mut misses = 0;
    // each round a pair: the cached handle's p50 over the MMAP handle's
    let mut pairs = Vec::new();
    let (pc0, mc0) = (p.counters(), plain.counters());
    for _ in 0..ROUNDS {
        let (mut c, mut m) = (Vec::new(), Vec::new());
        misses += repeat(p, &st, &mut seq, 30, &mut c)?;
        repeat(&plain, &st, &mut seq2, 30, &mut m)?;
        pairs.push(pct(&c, 50.0) / pct(&m, 50.0).max(1e-9));
        lc.extend(c);
        lm.extend(m);
    }
    let (cached, mmap) = (pct(&lc, 50.0), pct(&lm, 50.0));
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
    let mut sorted = pairs.clone();
    sorted.sort_by(f64::total_cmp);
    let pair_median = (sorted[ROUNDS / 2 - 1] + sorted[ROUNDS / 2]) / 2.0;
    // bare copies on this thread: cache lookups vs. rows of the mapping
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
        ple_core::io::gather::gather_serial(p.table().bytes(), rb, &uids, &mut out)?;
    }
    let mmap_ns = t.elapsed().as_nanos() as f64 / (reps * uids.len()) as f64;
    println!(
        "all-cached decode step of {} tokens: p50 {cached:.1} µs with the cache ({misses} misses in {} runs) vs {mmap:.1} µs MMAP warm ({ROUNDS} alternating rounds of 30): {:.2}×; per pair (round p50 over round p50) median {pair_median:.2}×, {} (target ≤ 1.0×)",
        st.tokens.len(),
        ROUNDS * 30,
        cached / mmap.max(1e-9),
        pairs
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "hit path, one thread: {lookup_ns:.1} ns per row by lookup, {batch_ns:.1} by lookup_batch (what a step uses), from the cache ({:.0}% found) vs {mmap_ns:.1} ns per row copied from the warm mapping; the cache on huge pages: {} of {} MiB",
        100.0 * found as f64 / (2 * reps * uids.len()) as f64,
        cache
            .huge_page_bytes()
            .map_or("?".into(), |b| (b >> 20).to_string()),
        cache.allocated_bytes() >> 20
    );
    Ok(json!({
        "tokens": st.tokens.len(), "cached_p50_us": cached, "mmap_warm_p50_us": mmap,
        "misses": misses, "lookup_ns_per_row": lookup_ns, "mmap_copy_ns_per_row": mmap_ns,
        "pair_ratios": pairs, "pair_ratio_median": pair_median,
        "lookup_batch_ns_per_row": batch_ns,
        "cache_huge_page_bytes": cache.huge_page_bytes(),
    }))
}
