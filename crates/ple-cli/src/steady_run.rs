//! The run loop of `ple bench --steady`, its report, and the all-cached step against MMAP.

use super::reference::{self, Point, Replay, Tally};
use super::shard_cmp::PerToken;
use super::{SteadyArgs, Step, Workload, pct, rss_bytes};
use crate::cli::BenchArgs;
use ple_core::error::{Error, Result};
use ple_core::io::cache::Policy;
use ple_core::stats::{self, Counters};
use ple_core::step::{OpenOptions, Pipeline};
use rayon::prelude::*;
use serde_json::{Value, json};
use std::time::Instant;

const MIB: f64 = (1u64 << 20) as f64;

/// Figures of one report interval (or of the whole run).
struct Figures {
    step: u64,
    steps: u64,
    tokens: u64,
    hits: u64,
    misses: u64,
    storage_bytes: u64,
    /// Requests sent to storage (`Counters::storage_reads`).
    storage_reads: u64,
    major_faults: u64,
    /// Storage a direct read of each miss would move (`--sector` aligned).
    direct_bytes: u64,
    p50_us: f64,
    p99_us: f64,
    /// VmRSS and RssAnon.
    rss: (u64, u64),
    page_cache_growth: i64,
    /// The table's resident bytes (`mincore`) and MemAvailable, at the interval's end.
    table_resident: u64,
    mem_available: u64,
    lru_rows: Option<Tally>,
    lru_pages: Option<Tally>,
}

impl Figures {
    fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
    fn per_token(&self, bytes: u64) -> f64 {
        bytes as f64 / 1024.0 / self.tokens.max(1) as f64
    }
    fn print(&self, label: &str) {
        let r = |t: &Option<Tally>| {
            t.map_or("    -".into(), |t| format!("{:5.1}", 100.0 * t.hit_rate()))
        };
        println!(
            "{label:>8} {:>8} {:>6.1} {:>6} {:>6} {:>9.2} {:>9.2} {:>9} {:>9.2} {:>9.1} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>8.1} {:>9.0} {:>9.0}",
            self.tokens,
            100.0 * self.hit_rate(),
            r(&self.lru_rows),
            r(&self.lru_pages),
            self.per_token(self.storage_bytes),
            self.per_token(self.direct_bytes),
            self.lru_pages.map_or("-".into(), |t| format!(
                "{:.2}",
                self.per_token(t.storage_bytes)
            )),
            self.major_faults as f64 / self.steps.max(1) as f64,
            self.misses as f64 / self.steps.max(1) as f64,
            self.p50_us,
            self.p99_us,
            self.rss.0 as f64 / MIB,
            self.rss.1 as f64 / MIB,
            self.page_cache_growth as f64 / MIB,
            self.table_resident as f64 / MIB,
            self.mem_available as f64 / MIB,
        );
    }
    fn json(&self) -> Value {
        json!({
            "step": self.step, "steps": self.steps, "tokens": self.tokens,
            "hit_rate": self.hit_rate(), "cache_hits": self.hits, "cache_misses": self.misses,
            "storage_kib_per_token": self.per_token(self.storage_bytes),
            "storage_reads_per_token": self.storage_reads as f64 / self.tokens.max(1) as f64,
            "direct_kib_per_token": self.per_token(self.direct_bytes),
            "major_faults_per_step": self.major_faults as f64 / self.steps.max(1) as f64,
            "misses_per_step": self.misses as f64 / self.steps.max(1) as f64,
            "p50_us": self.p50_us, "p99_us": self.p99_us, "rss_bytes": self.rss.0, "rss_anon_bytes": self.rss.1,
            "page_cache_growth_bytes": self.page_cache_growth,
            "table_resident_bytes": self.table_resident, "mem_available_bytes": self.mem_available,
            "lru_rows_hit_rate": self.lru_rows.map(|t| t.hit_rate()),
            "lru_pages_hit_rate": self.lru_pages.map(|t| t.hit_rate()),
            "lru_pages_kib_per_token": self.lru_pages.map(|t| self.per_token(t.storage_bytes)),
        })
    }
}

fn print_header() {
    println!(
        "(hit%: the handle's row cache; LRUr/LRUp: exact LRU of as many rows / of 4 KiB pages of the same memory; \
         KiB/tok: storage read, measured; direct: the cache's misses read as aligned sectors; \
         LRUp: the page LRU's storage; flt/step: major faults per step; miss/stp: cache misses per step; \
         RSS: the process's resident memory (with the table's mapped pages); anon: without mapped files; \
         +pgc: growth of the table's page-cache residency; table: the table's resident bytes (mincore); \
         avail: MemAvailable)"
    );
    println!(
        "{:>8} {:>8} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9}",
        "step",
        "tokens",
        "hit%",
        "LRUr%",
        "LRUp%",
        "KiB/tok",
        "direct",
        "LRUp",
        "flt/step",
        "miss/stp",
        "p50 µs",
        "p99 µs",
        "RSS MiB",
        "anon MiB",
        "+pgc MiB",
        "table MiB",
        "avail MiB"
    );
}

/// The replays: at the run's cache size and at each `--sizes`, every policy, an exact LRU of as
/// many rows as the default policy holds, and an exact LRU of pages of the same memory.
fn replays(s: &SteadyArgs, rb: usize) -> Vec<Replay> {
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

fn find<'a>(r: &'a [Replay], memory: u64, name: &str) -> Option<&'a Replay> {
    r.iter().find(|x| x.memory == memory && x.name == name)
}

/// `--replay-only`: the default policy's replay at the run's size stands in for the handle's
/// cache (its interval's or, with `total`, the whole run's tally).
fn replayed_as_handle(f: &mut Figures, reps: &[Replay], memory: u64, total: bool) {
    if let Some(r) = find(reps, memory, Policy::default().name()) {
        let t = if total { r.total } else { r.interval };
        f.hits = t.hits;
        f.misses = t.lookups - t.hits;
        f.direct_bytes = t.storage_bytes;
    }
}

/// What the run is: table, cache, workload.
fn print_intro(a: &BenchArgs, p: &Pipeline) {
    let s = &a.steady;
    let meta = p.table().meta();
    let rb = meta.row_bytes;
    println!(
        "ple bench --steady: {} ({} rows × {rb} B, {:.2} GiB), {} pool threads",
        a.table_dir.display(),
        meta.total_rows,
        p.table().bytes().len() as f64 / (1u64 << 30) as f64,
        p.pool().current_num_threads()
    );
    match p.row_cache() {
        Some(c) => println!(
            "row cache: {:.1} MiB, {} ({} rows of {:.1} B incl. overhead, {} shards)",
            s.cache_bytes as f64 / MIB,
            c.policy().name(),
            c.capacity_rows(),
            c.bytes_per_row(),
            c.num_shards()
        ),
        None => println!("row cache: none (--cache-bytes 0)"),
    }
    let info = p.table_info();
    if !info.shard.is_whole() {
        println!(
            "{}: heads {}..{} ({} rows per token)",
            info.shard.describe(),
            info.first_head,
            info.first_head + info.shard_heads,
            info.shard_heads
        );
    }
    let io = p.io_info();
    println!(
        "I/O mode: {}{}",
        if io.mode == ple_core::step::IoMode::Direct {
            "DIRECT"
        } else {
            "MMAP"
        },
        io.backend
            .map_or(String::new(), |b| format!(" ({})", b.name()))
    );
    println!(
        "workload: {} requests, prompt {} + decode {} tokens per document, prefill chunk {}, documents from {}; direct reads modelled {}-byte aligned",
        s.requests,
        s.prompt_tokens,
        s.decode_tokens,
        s.prefill_chunk,
        s.trace
            .as_ref()
            .map_or("the English corpus streams".into(), |t| t
                .display()
                .to_string()),
        s.sector
    );
}

/// The figures of the steps between counters `c.0` and `c.1` (latencies `lat`; `n`: the last
/// step, the steps, tokens, direct-read bytes); `lru` gives a reference's tally by name.
fn figures(
    p: &Pipeline,
    c: (&Counters, &Counters),
    lat: &mut [u64],
    n: (u64, u64, u64, u64),
    res0: i64,
    lru: impl Fn(&str) -> Option<Tally>,
) -> Figures {
    let (a, b) = c;
    let now = p.stats();
    Figures {
        step: n.0,
        steps: n.1,
        tokens: n.2,
        hits: b.cache_hits - a.cache_hits,
        misses: b.cache_misses - a.cache_misses,
        storage_bytes: b.storage_read_bytes - a.storage_read_bytes,
        storage_reads: b.storage_reads - a.storage_reads,
        major_faults: b.major_faults - a.major_faults,
        direct_bytes: n.3,
        p50_us: pct(lat, 50.0),
        p99_us: pct(lat, 99.0),
        rss: rss_bytes(),
        page_cache_growth: (now.resident_pages as i64 - res0) * 4096,
        table_resident: now.resident_pages * 4096,
        mem_available: now.mem_available_bytes,
        lru_rows: lru("LRU rows"),
        lru_pages: lru("LRU pages"),
    }
}

pub fn run(a: &BenchArgs) -> Result<()> {
    let s = &a.steady;
    let opts = OpenOptions {
        num_threads: a.threads,
        cache_bytes: if s.replay_only { 0 } else { s.cache_bytes },
        max_tokens_per_step: (s.requests + s.prefill_chunk).max(64) as u32,
        io_mode: s.io_mode,
        shard: s.shard.unwrap_or_default(),
        resident_bytes_max: s.resident_max,
        ..OpenOptions::default()
    };
    let p = Pipeline::open(&a.table_dir, opts.clone())?;
    let heads = p.heads();
    let meta = p.table().meta().clone();
    let rb = meta.row_bytes as usize;
    let mut wl = Workload::new(s, meta.hash.vocab_size, meta.hash.eos_token_id)?;
    print_intro(a, &p);
    if s.sector == 0 || !s.sector.is_power_of_two() {
        return ple_core::invalid!("--sector {} is not a power of two", s.sector);
    }
    let span = mean_span(rb as u64, s.sector);
    let mut reps = if s.no_reference {
        Vec::new()
    } else {
        replays(s, rb)
    };
    let res0 = p.stats().resident_pages as i64;
    let t_start = Instant::now();
    let (mut seq, mut steps, mut step0) = (0u64, 0u64, 0u64);
    let (mut st, mut ids) = (Step::default(), Vec::<i64>::new());
    let (mut lat, mut lat_all) = (Vec::new(), Vec::new());
    let (mut tokens, mut tokens_all, mut direct, mut direct_all) = (0u64, 0u64, 0u64, 0u64);
    let (c_start, mut c0) = (p.counters(), p.counters());
    let (mut points, mut rows_json) = (Vec::new(), Vec::new());
    print_header();
    loop {
        wl.step(&mut st);
        let b = st.batch();
        ids.resize(st.tokens.len() * 16, 0);
        p.ngram_ids(&b, &mut ids)?;
        if !s.replay_only {
            seq += 1;
            let t = Instant::now();
            p.submit(&b, seq)?;
            p.wait(seq, 0)?;
            lat.push(stats::ns(t.elapsed()));
            p.release_step(seq)?;
        }
        steps += 1;
        tokens += st.tokens.len() as u64;
        // (the references see the rows the handle reads: its shard's heads)
        let uids: Vec<u64> = ids
            .chunks(16)
            .flat_map(|t| t[heads.clone()].iter().map(|&x| x as u64))
            .collect();
        reps.par_iter_mut()
            .for_each(|r| r.feed(&uids, rb as u64, s.sector));
        let stop = steps >= s.steps
            || s.seconds
                .is_some_and(|t| t_start.elapsed().as_secs_f64() >= t);
        if steps % s.interval.max(1) == 0 || stop {
            let c1 = p.counters();
            direct += ((c1.cache_misses - c0.cache_misses) as f64 * span).round() as u64;
            let lru = |n: &str| find(&reps, s.cache_bytes, n).map(|r| r.interval);
            let mut f = figures(
                &p,
                (&c0, &c1),
                &mut lat,
                (steps, steps - step0, tokens, direct),
                res0,
                lru,
            );
            if s.replay_only {
                replayed_as_handle(&mut f, &reps, s.cache_bytes, false);
            }
            f.print(&steps.to_string());
            points.push(Point {
                step: steps,
                hit: f.hit_rate(),
                lru_rows: f.lru_rows.map_or(0.0, |t| t.hit_rate()),
                lru_pages: f.lru_pages.map_or(0.0, |t| t.hit_rate()),
                p50_us: f.p50_us,
                p99_us: f.p99_us,
            });
            rows_json.push(f.json());
            for r in reps.iter_mut() {
                r.interval = Tally::default();
            }
            lat_all.append(&mut lat);
            tokens_all += tokens;
            direct_all += direct;
            (tokens, direct, c0, step0) = (0, 0, c1, steps);
        }
        if stop {
            break;
        }
    }
    let lru = |n: &str| find(&reps, s.cache_bytes, n).map(|r| r.total);
    let ends = (&c_start, &p.counters());
    let run = (steps, steps, tokens_all, direct_all);
    let mut overall = figures(&p, ends, &mut lat_all, run, res0, lru);
    if s.replay_only {
        replayed_as_handle(&mut overall, &reps, s.cache_bytes, true);
    }
    overall.print("overall");
    println!(
        "{} steps, {} tokens, {} documents started, {:.1} s",
        steps,
        tokens_all,
        wl.docs_started,
        t_start.elapsed().as_secs_f64()
    );
    let policies = print_policies(&reps, tokens_all);
    let hit_path = if s.replay_only || !opts.shard.is_whole() {
        Value::Null
    } else {
        hit_path(&p, &wl, a, &opts)?
    };
    let shard = if s.replay_only || opts.shard.is_whole() || s.no_whole {
        Value::Null
    } else {
        let rank = PerToken::of(&c_start, &p.counters(), tokens_all);
        drop(p);
        super::shard_cmp::whole_beside_shard(a, &opts, steps, rank)?
    };
    let results = json!({
        "table_dir": a.table_dir, "cache_bytes": s.cache_bytes, "requests": s.requests,
        "intervals": rows_json, "overall": overall.json(), "policies": policies,
        "hit_path": hit_path, "shard": shard,
    });
    write_outputs(a, &points, &results)
}

/// The plot (`--svg`) and the results as JSON (`--json`).
fn write_outputs(a: &BenchArgs, points: &[Point], results: &Value) -> Result<()> {
    let s = &a.steady;
    if let Some(path) = &s.svg {
        let title = format!(
            "ple bench --steady: {} requests, cache {:.0} MiB",
            s.requests,
            s.cache_bytes as f64 / MIB
        );
        std::fs::write(path, reference::svg(points, &title))
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

/// Prints (and returns as JSON) hit rates and storage per token of every replay, per size.
fn print_policies(reps: &[Replay], tokens: u64) -> Value {
    if reps.is_empty() {
        return Value::Null;
    }
    println!("replayed on the same row-id sequence (hit % / storage KiB per token):");
    let mut sizes: Vec<u64> = reps.iter().map(|r| r.memory).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let names = [
        Policy::S3Fifo.name(),
        Policy::Sieve.name(),
        "LRU rows",
        "LRU pages",
    ];
    println!(
        "{:>10} {:>10} {:>16} {:>16} {:>16} {:>16}",
        "memory", "rows", names[0], names[1], names[2], names[3]
    );
    let mut out = Vec::new();
    for m in sizes {
        let cell = |n: &str| {
            find(reps, m, n).map_or("-".to_string(), |r| {
                format!(
                    "{:.1} / {:.2}",
                    100.0 * r.total.hit_rate(),
                    r.total.storage_bytes as f64 / 1024.0 / tokens.max(1) as f64
                )
            })
        };
        let rows = find(reps, m, names[0]).map_or(0, |r| r.capacity);
        println!(
            "{:>9.0}M {:>10} {:>16} {:>16} {:>16} {:>16}",
            m as f64 / MIB,
            rows,
            cell(names[0]),
            cell(names[1]),
            cell(names[2]),
            cell(names[3])
        );
        for n in names {
            if let Some(r) = find(reps, m, n) {
                out.push(json!({
                    "memory": m, "model": n, "capacity": r.capacity,
                    "hit_rate": r.total.hit_rate(),
                    "storage_kib_per_token": r.total.storage_bytes as f64 / 1024.0 / tokens.max(1) as f64,
                }));
            }
        }
    }
    Value::Array(out)
}

/// One decode step (a token of every request past its prompt), not advancing the workload.
fn decode_step(wl: &Workload) -> Step {
    let mut st = Step {
        query_start: vec![0],
        ..Default::default()
    };
    for r in wl
        .reqs
        .iter()
        .filter(|r| r.pos >= r.doc.prompt && r.pos < r.doc.tokens.len())
    {
        let t = &r.doc.tokens;
        st.tokens.push(t[r.pos]);
        st.positions.push(r.pos as i32);
        st.request_ids.push(r.id);
        st.query_start.push(st.tokens.len() as u32);
        let at = |q: usize| if q < 2 { wl.eos } else { t[q - 2] };
        st.context.push(at(r.pos));
        st.context.push(at(r.pos + 1));
    }
    st
}

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

/// A decode step whose rows are all cached, on the cached handle, against the same step on a
/// handle without a cache (MMAP, warm page cache), in alternating rounds (so a shared machine's
/// drift hits both alike); and the bare per-row costs of both copies.
/// Alternating rounds (pairs) of the all-cached comparison.
const ROUNDS: usize = 10;

fn hit_path(p: &Pipeline, wl: &Workload, a: &BenchArgs, opts: &OpenOptions) -> Result<Value> {
    let Some(cache) = p.row_cache() else {
        return Ok(Value::Null);
    };
    let st = decode_step(wl);
    if st.tokens.is_empty() {
        return Ok(Value::Null);
    }
    let plain = Pipeline::open(
        &a.table_dir,
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
    for _ in 0..ROUNDS {
        let (mut c, mut m) = (Vec::new(), Vec::new());
        misses += repeat(p, &st, &mut seq, 30, &mut c)?;
        repeat(&plain, &st, &mut seq2, 30, &mut m)?;
        pairs.push(pct(&c, 50.0) / pct(&m, 50.0).max(1e-9));
        lc.extend(c);
        lm.extend(m);
    }
    let (cached, mmap) = (pct(&lc, 50.0), pct(&lm, 50.0));
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
        "hit path, one thread: {lookup_ns:.1} ns per row by lookup, {batch_ns:.1} by lookup_batch (what a step uses), from the cache ({:.0}% found) vs {mmap_ns:.1} ns per row copied from the warm mapping",
        100.0 * found as f64 / (2 * reps * uids.len()) as f64
    );
    Ok(json!({
        "tokens": st.tokens.len(), "cached_p50_us": cached, "mmap_warm_p50_us": mmap,
        "misses": misses, "lookup_ns_per_row": lookup_ns, "mmap_copy_ns_per_row": mmap_ns,
        "pair_ratios": pairs, "pair_ratio_median": pair_median,
        "lookup_batch_ns_per_row": batch_ns,
    }))
}
