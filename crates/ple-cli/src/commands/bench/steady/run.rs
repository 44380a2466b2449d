//! The run loop of `ple bench steady` and its outputs (`--svg`, `--json`).

use super::plot::{self, Point};
use super::reference::{self, Replay, Tally, find};
use super::report::{self, Figures, MIB};
use super::shard::{self, PerToken};
use super::workload::Workload;
use super::{SteadyArgs, SteadyOptions, hit_path};
use crate::commands::bench::steps::Step;
use ple_core::error::{Error, Result};
use ple_core::io::cache::Policy;
use ple_core::stats::{self, Counters};
use ple_core::step::{OpenOptions, Pipeline};
use rayon::prelude::*;
use serde_json::{Value, json};
use std::time::Instant;

/// The replays: at the run's cache size and at each `--sizes`, every policy, an exact LRU of as
/// many rows as the default policy holds, and an exact LRU of pages of the same memory.
fn replays(s: &SteadyOptions, rb: usize) -> Vec<Replay> {
    let mut sizes = vec![s.cache_bytes];
    sizes.extend(s.sizes.iter().copied().filter(|&m| m != s.cache_bytes));
    let mut v = Vec::new();
    for m in sizes.into_iter().filter(|&m| m > 0) {
        let Some(first) = Replay::policy(m, rb, Policy::S3Fifo) else {
            continue;
        };
        let rows = first.capacity;
        v.push(first);
        v.extend(Replay::policy(m, rb, Policy::Sieve));
        v.push(Replay::row_lru(m, rows));
        v.push(Replay::page_lru(m));
    }
    v
}

/// The handle's options for the run.
fn handle_options(a: &SteadyArgs) -> OpenOptions {
    let s = &a.opts;
    OpenOptions {
        num_threads: a.threads,
        cache_bytes: if s.replay_only { 0 } else { s.cache_bytes },
        max_tokens_per_step: (s.requests + s.prefill_chunk).max(64) as u32,
        io_mode: s.io_mode,
        shard: s.shard.unwrap_or_default(),
        resident_bytes_max: s.resident_max,
        ..OpenOptions::default()
    }
}

pub(super) fn run(a: &SteadyArgs) -> Result<()> {
    let s = &a.opts;
    let opts = handle_options(a);
    if let Some(n) = s.shards {
        let results = super::shards::run(a, &opts, n)?;
        return write_outputs(
            a,
            &[],
            &json!({ "table_dir": a.table_dir, "shards": results }),
        );
    }
    let p = Pipeline::open(&a.table_dir, opts.clone())?;
    let meta = p.table().meta().clone();
    let rb = meta.row_bytes as usize;
    let mut wl = Workload::new(s, meta.hash.vocab_size, meta.hash.eos_token_id)?;
    report::print_intro(&a.table_dir, s, &p);
    if s.sector == 0 || !s.sector.is_power_of_two() {
        return ple_core::invalid!("--sector {} is not a power of two", s.sector);
    }
    let mut reps = if s.no_reference {
        Vec::new()
    } else {
        replays(s, rb)
    };
    let mut m = Measure::new(&p, mean_span(rb as u64, s.sector));
    let t_start = Instant::now();
    let mut st = Step::default();
    report::print_header();
    loop {
        wl.step(&mut st);
        m.step(&p, &st, &mut reps, s)?;
        let stop = m.steps >= s.steps
            || s.seconds
                .is_some_and(|t| t_start.elapsed().as_secs_f64() >= t);
        if m.steps % s.interval.max(1) == 0 || stop {
            m.end_interval(&p, &mut reps, s);
        }
        if stop {
            break;
        }
    }
    let overall = m.overall(&p, &reps, s);
    println!(
        "{} steps, {} tokens, {} documents started, {:.1} s",
        m.steps,
        m.tokens_all,
        wl.docs_started,
        t_start.elapsed().as_secs_f64()
    );
    let policies = report::print_policies(&reps, m.tokens_all);
    let hit_path = if s.replay_only || !opts.shard.is_whole() {
        Value::Null
    } else {
        hit_path::hit_path(&p, &wl, &a.table_dir, &opts)?
    };
    let shard = if s.replay_only || opts.shard.is_whole() || s.no_whole {
        Value::Null
    } else {
        let rank = PerToken::of(&m.c_start, &p.counters(), m.tokens_all);
        drop(p);
        shard::whole_beside_shard(a, &opts, m.steps, rank)?
    };
    let results = json!({
        "table_dir": a.table_dir, "cache_bytes": s.cache_bytes, "requests": s.requests,
        "intervals": m.rows_json, "overall": overall.json(), "policies": policies,
        "hit_path": hit_path, "shard": shard,
    });
    write_outputs(a, &m.points, &results)
}

/// What the run has measured: the current interval's and the whole run's.
struct Measure {
    /// The handle's heads (its shard's), the row size, the mean bytes of a direct read of a row.
    heads: ple_core::shard::Heads,
    rb: u64,
    span: f64,
    /// The table's resident pages at the start.
    res0: i64,
    ids: Vec<i64>,
    seq: u64,
    steps: u64,
    /// The step the interval started after.
    step0: u64,
    lat: Vec<u64>,
    lat_all: Vec<u64>,
    tokens: u64,
    tokens_all: u64,
    direct: u64,
    direct_all: u64,
    c_start: Counters,
    /// Counters at the interval's start.
    c0: Counters,
    points: Vec<Point>,
    rows_json: Vec<Value>,
}

impl Measure {
    fn new(p: &Pipeline, span: f64) -> Measure {
        Measure {
            heads: p.heads(),
            rb: p.table().meta().row_bytes as u64,
            span,
            res0: p.stats().resident_pages as i64,
            ids: Vec::new(),
            seq: 0,
            steps: 0,
            step0: 0,
            lat: Vec::new(),
            lat_all: Vec::new(),
            tokens: 0,
            tokens_all: 0,
            direct: 0,
            direct_all: 0,
            c_start: p.counters(),
            c0: p.counters(),
            points: Vec::new(),
            rows_json: Vec::new(),
        }
    }

    /// Runs step `st` on the handle (unless `--replay-only`) and feeds its rows to the replays.
    fn step(
        &mut self,
        p: &Pipeline,
        st: &Step,
        reps: &mut [Replay],
        s: &SteadyOptions,
    ) -> Result<()> {
        let b = st.batch();
        self.ids.resize(st.tokens.len() * 16, 0);
        p.ngram_ids(&b, &mut self.ids)?;
        if !s.replay_only {
            self.seq += 1;
            let t = Instant::now();
            p.submit(&b, self.seq)?;
            p.wait(self.seq, 0)?;
            self.lat.push(stats::ns(t.elapsed()));
            p.release_step(self.seq)?;
        }
        self.steps += 1;
        self.tokens += st.tokens.len() as u64;
        // (the references see the rows the handle reads: its shard's heads)
        let uids: Vec<u64> = self
            .ids
            .chunks(16)
            .flat_map(|t| self.heads.iter().map(|h| t[h] as u64))
            .collect();
        let rb = self.rb;
        reps.par_iter_mut()
            .for_each(|r| r.feed(&uids, rb, s.sector));
        Ok(())
    }

    /// Prints and records the interval's figures, and starts the next interval.
    fn end_interval(&mut self, p: &Pipeline, reps: &mut [Replay], s: &SteadyOptions) {
        let c1 = p.counters();
        self.direct += ((c1.cache_misses - self.c0.cache_misses) as f64 * self.span).round() as u64;
        let lru = |n: &str| find(reps, s.cache_bytes, n).map(|r| r.interval);
        let n = (
            self.steps,
            self.steps - self.step0,
            self.tokens,
            self.direct,
        );
        let mut f = report::figures(p, (&self.c0, &c1), &mut self.lat, n, self.res0, lru);
        if s.replay_only {
            report::replayed_as_handle(&mut f, reps, s.cache_bytes, false);
        }
        f.print(&self.steps.to_string());
        self.points.push(Point {
            step: self.steps,
            hit: f.hit_rate(),
            lru_rows: f.lru_rows.map_or(0.0, |t| t.hit_rate()),
            lru_pages: f.lru_pages.map_or(0.0, |t| t.hit_rate()),
            p50_us: f.p50_us,
            p99_us: f.p99_us,
        });
        self.rows_json.push(f.json());
        for r in reps.iter_mut() {
            r.interval = Tally::default();
        }
        self.lat_all.append(&mut self.lat);
        self.tokens_all += self.tokens;
        self.direct_all += self.direct;
        (self.tokens, self.direct, self.c0, self.step0) = (0, 0, c1, self.steps);
    }

    /// Prints the whole run's figures and returns them.
    fn overall(&mut self, p: &Pipeline, reps: &[Replay], s: &SteadyOptions) -> Figures {
        let lru = |n: &str| find(reps, s.cache_bytes, n).map(|r| r.total);
        let ends = (&self.c_start, &p.counters());
        let n = (self.steps, self.steps, self.tokens_all, self.direct_all);
        let mut overall = report::figures(p, ends, &mut self.lat_all, n, self.res0, lru);
        if s.replay_only {
            report::replayed_as_handle(&mut overall, reps, s.cache_bytes, true);
        }
        overall.print("overall");
        overall
    }
}

/// The plot (`--svg`) and the results as JSON (`--json`).
fn write_outputs(a: &SteadyArgs, points: &[Point], results: &Value) -> Result<()> {
    let s = &a.opts;
    if let Some(path) = &s.svg {
        let title = format!(
            "ple bench steady: {} requests, cache {:.0} MiB",
            s.requests,
            s.cache_bytes as f64 / MIB
        );
        std::fs::write(path, plot::svg(points, &title))
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        println!("plot: {}", path.display());
    }
    if let Some(path) = &a.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(results).expect("serialises"),
        )
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    }
    Ok(())
}

/// Mean bytes of a `sector`-aligned direct read of one row of `rb` bytes (over a period of the
/// rows' alignments).
fn mean_span(rb: u64, sector: u64) -> f64 {
    let g = (1..=rb.min(sector))
        .rev()
        .find(|d| rb % d == 0 && sector % d == 0)
        .unwrap_or(1);
    let period = (sector / g).min(1 << 20);
    let sum: u64 = (0..period)
        .map(|i| reference::direct_read_bytes(i, rb, sector))
        .sum();
    sum as f64 / period as f64
}
