//! `ple bench steady --shards N`: the N ranks of a tensor-parallel group, run in turn over the same
//! steps, each a handle opened as head shard K of N with `--cache-bytes / N` of row cache (the
//! memory split evenly). Per shard: its heads, rows, storage reads, cache hits and step time; then
//! the most storage reads of any shard over the fewest (a tensor-parallel step waits for its
//! slowest rank). Beside the measured runs, the same steps' row ids replayed through the row
//! cache's policy at the same size per shard for two head assignments: libple's round-robin one
//! (a check of the replay against the measured runs) and contiguous blocks of heads (what engines
//! that shard contiguously, and libple before round-robin shards, read).

use super::SteadyArgs;
use super::reference::Replay;
use super::workload::Workload;
use crate::commands::bench::steps::Step;
use ple_core::error::Result;
use ple_core::io::cache::Policy;
use ple_core::shard::Shard;
use ple_core::stats;
use ple_core::step::{OpenOptions, Pipeline};
use serde_json::{Value, json};
use std::time::Instant;

/// What one rank's run moved and how long its steps took.
struct Rank {
    /// The I/O mode the handle ran with (AUTO resolved).
    io: String,
    /// The whole table's heads.
    num_heads: usize,
    heads: String,
    rows: u64,
    reads: u64,
    read_bytes: u64,
    hits: u64,
    misses: u64,
    lat_ns: Vec<u64>,
}

impl Rank {
    fn json(&self) -> Value {
        json!({
            "heads": self.heads, "rows": self.rows, "storage_reads": self.reads,
            "storage_read_bytes": self.read_bytes, "cache_hits": self.hits,
            "cache_misses": self.misses, "step_p50_us": pct_us(&self.lat_ns, 50.0),
            "step_p99_us": pct_us(&self.lat_ns, 99.0), "step_mean_us": mean_us(&self.lat_ns),
        })
    }
}

fn pct_us(v: &[u64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    crate::commands::bench::steps::pct(&s, p) as f64 / 1e3
}

fn mean_us(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len().max(1) as f64 / 1e3
}

/// Most over fewest (NaN when the fewest is 0).
fn spread(v: impl Iterator<Item = u64> + Clone) -> f64 {
    let (lo, hi) = (v.clone().min().unwrap_or(0), v.max().unwrap_or(0));
    if lo == 0 {
        f64::NAN
    } else {
        hi as f64 / lo as f64
    }
}

/// Runs rank `shard` (a handle of `opts` as that shard) over the workload's first `steps` steps.
fn run_rank(a: &SteadyArgs, opts: &OpenOptions, shard: Shard, steps: u64) -> Result<Rank> {
    let p = Pipeline::open(
        &a.table_dir,
        OpenOptions {
            shard,
            ..opts.clone()
        },
    )?;
    // (MMAP: the previous rank left its heads' pages cached; every rank starts from none)
    crate::commands::bench::memory::evict(&[p.table().bytes()], p.table().file());
    let meta = p.table().meta();
    let mut wl = Workload::new(&a.opts, meta.hash.vocab_size, meta.hash.eos_token_id)?;
    let (c0, mut st) = (p.counters(), Step::default());
    let mut lat_ns = Vec::with_capacity(steps as usize);
    for seq in 1..=steps {
        wl.step(&mut st);
        let t = Instant::now();
        p.submit(&st.batch(), seq)?;
        p.wait(seq, 0)?;
        lat_ns.push(stats::ns(t.elapsed()));
        p.release_step(seq)?;
    }
    let d = p.counters().delta(&c0);
    Ok(Rank {
        io: format!("{:?}", p.io_info().mode).to_uppercase(),
        num_heads: p.num_heads(),
        heads: p.heads().describe(),
        rows: d.prefill_rows + d.decode_rows,
        reads: d.storage_reads,
        read_bytes: d.storage_read_bytes,
        hits: d.cache_hits,
        misses: d.cache_misses,
        lat_ns,
    })
}

/// The heads of rank `k` of `n` under contiguous blocks: `[k·16/n, (k+1)·16/n)`.
fn contiguous(k: usize, n: usize, heads: usize) -> Vec<usize> {
    (k * heads / n..(k + 1) * heads / n).collect()
}

/// The misses of each rank's replayed cache (`per_rank` bytes) over the workload's first `steps`
/// steps, for the head sets `sets`.
fn replay(a: &SteadyArgs, sets: &[Vec<usize>], per_rank: u64, steps: u64) -> Result<Vec<u64>> {
    let p = Pipeline::open(&a.table_dir, OpenOptions::default())?;
    let meta = p.table().meta().clone();
    let (rb, nh) = (meta.row_bytes as usize, meta.num_heads as usize);
    let mut reps: Vec<Replay> = sets
        .iter()
        .map(|_| {
            Replay::policy(per_rank, rb, Policy::default()).ok_or_else(|| {
                ple_core::Error::InvalidArgument(format!(
                    "--cache-bytes / --shards = {per_rank} bytes hold no row"
                ))
            })
        })
        .collect::<Result<_>>()?;
    let mut wl = Workload::new(&a.opts, meta.hash.vocab_size, meta.hash.eos_token_id)?;
    let (mut st, mut ids, mut mine) = (Step::default(), Vec::new(), Vec::new());
    for _ in 0..steps {
        wl.step(&mut st);
        ids.resize(st.tokens.len() * nh, 0i64);
        p.ngram_ids(&st.batch(), &mut ids)?;
        for (r, heads) in reps.iter_mut().zip(sets) {
            mine.clear();
            mine.extend(
                ids.chunks(nh)
                    .flat_map(|t| heads.iter().map(|&h| t[h] as u64)),
            );
            r.feed(&mine, rb as u64, a.opts.sector);
        }
    }
    Ok(reps
        .iter()
        .map(|r| r.total.lookups - r.total.hits)
        .collect())
}

/// Runs the N ranks and prints the table; returns the JSON of the comparison.
pub(super) fn run(a: &SteadyArgs, opts: &OpenOptions, n: u32) -> Result<Value> {
    Shard::new(0, n)?;
    let s = &a.opts;
    let per_rank = s.cache_bytes / n as u64;
    let opts = OpenOptions {
        cache_bytes: per_rank,
        ..opts.clone()
    };
    let mut ranks = Vec::new();
    for k in 0..n {
        ranks.push(run_rank(a, &opts, Shard::new(k, n)?, s.steps)?);
    }
    println!(
        "{n} head shards over the same {} steps, each rank a handle with {:.1} MiB of row cache \
         (--cache-bytes / {n}), I/O mode {}:",
        s.steps,
        per_rank as f64 / (1 << 20) as f64,
        ranks[0].io
    );
    let nh = ranks[0].num_heads;
    let robin: Vec<Vec<usize>> = (0..n)
        .map(|k| Shard::new(k, n).map(|s| s.heads(nh).iter().collect()))
        .collect::<Result<_>>()?;
    let blocks: Vec<Vec<usize>> = (0..n as usize)
        .map(|k| contiguous(k, n as usize, nh))
        .collect();
    let replayed = replay(a, &[robin, blocks.clone()].concat(), per_rank, s.steps)?;
    let (rr, cont) = replayed.split_at(n as usize);
    println!(
        "{:>6} {:>20} {:>11} {:>11} {:>7} {:>9} {:>9} {:>11} {:>14}",
        "shard",
        "heads",
        "rows",
        "reads",
        "hit%",
        "p50 ms",
        "p99 ms",
        "replay miss",
        "contig. miss"
    );
    for (k, r) in ranks.iter().enumerate() {
        println!(
            "{:>6} {:>20} {:>11} {:>11} {:>7.1} {:>9.3} {:>9.3} {:>11} {:>14}",
            format!("{k}/{n}"),
            r.heads,
            r.rows,
            r.reads,
            100.0 * r.hits as f64 / (r.hits + r.misses).max(1) as f64,
            pct_us(&r.lat_ns, 50.0) / 1e3,
            pct_us(&r.lat_ns, 99.0) / 1e3,
            rr[k],
            cont[k]
        );
    }
    let measured = spread(ranks.iter().map(|r| r.reads));
    let (replay_rr, replay_cont) = (spread(rr.iter().copied()), spread(cont.iter().copied()));
    println!(
        "most / fewest storage reads of a shard: {measured:.3} measured (round-robin heads); \
         replayed: {replay_rr:.3} round-robin, {replay_cont:.3} contiguous heads ({})",
        blocks
            .iter()
            .map(|b| format!("{}..{}", b[0], b[b.len() - 1] + 1))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(json!({
        "shards": n, "cache_bytes_per_rank": per_rank,
        "ranks": ranks.iter().map(Rank::json).collect::<Vec<_>>(),
        "reads_most_over_fewest": measured,
        "replayed_misses_round_robin": rr, "replayed_misses_contiguous": cont,
        "replayed_most_over_fewest": {"round_robin": replay_rr, "contiguous": replay_cont},
    }))
}
