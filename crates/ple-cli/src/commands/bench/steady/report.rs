//! What `ple bench steady` prints: the run's set-up, a line of figures per interval and
//! overall, and the replayed policies per memory size.

use super::SteadyOptions;
use super::reference::{Replay, Tally, find};
use ple_core::io::cache::Policy;
use ple_core::stats::Counters;
use ple_core::step::Pipeline;
use serde_json::{Value, json};
use std::path::Path;

pub(super) const MIB: f64 = (1u64 << 20) as f64;

/// Figures of one report interval (or of the whole run).
pub(super) struct Figures {
    step: u64,
    steps: u64,
    tokens: u64,
    pub(super) hits: u64,
    pub(super) misses: u64,
    storage_bytes: u64,
    /// Requests sent to storage (`Counters::storage_reads`).
    storage_reads: u64,
    major_faults: u64,
    /// Storage a direct read of each miss would move (`--sector` aligned).
    pub(super) direct_bytes: u64,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
    /// VmRSS and RssAnon.
    rss: (u64, u64),
    page_cache_growth: i64,
    /// The table's resident bytes (`mincore`) and MemAvailable, at the interval's end.
    table_resident: u64,
    mem_available: u64,
    pub(super) lru_rows: Option<Tally>,
    pub(super) lru_pages: Option<Tally>,
}

impl Figures {
    pub(super) fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
    fn per_token(&self, bytes: u64) -> f64 {
        bytes as f64 / 1024.0 / self.tokens.max(1) as f64
    }
    pub(super) fn print(&self, label: &str) {
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
    pub(super) fn json(&self) -> Value {
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

pub(super) fn print_header() {
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

/// `--replay-only`: the default policy's replay at the run's size stands in for the handle's
/// cache (its interval's or, with `total`, the whole run's tally).
pub(super) fn replayed_as_handle(f: &mut Figures, reps: &[Replay], memory: u64, total: bool) {
    if let Some(r) = find(reps, memory, Policy::default().name()) {
        let t = if total { r.total } else { r.interval };
        f.hits = t.hits;
        f.misses = t.lookups - t.hits;
        f.direct_bytes = t.storage_bytes;
    }
}

/// What the run is: table, cache, workload.
pub(super) fn print_intro(table_dir: &Path, s: &SteadyOptions, p: &Pipeline) {
    let meta = p.table().meta();
    let rb = meta.row_bytes;
    println!(
        "ple bench steady: {} ({} rows × {rb} B, {:.2} GiB), {} pool threads",
        table_dir.display(),
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
            "{}: heads {} ({} rows per token)",
            info.shard.describe(),
            info.shard.heads(info.num_heads as usize).describe(),
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
pub(super) fn figures(
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

/// Prints (and returns as JSON) hit rates and storage per token of every replay, per size.
pub(super) fn print_policies(reps: &[Replay], tokens: u64) -> Value {
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

/// Resident set of this process (VmRSS) and its anonymous part (RssAnon: everything but mapped
/// files, so the table's mapped pages are not in it), bytes.
fn rss_bytes() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |k| k * 1024)
    };
    (field("VmRSS:"), field("RssAnon:"))
}

/// The nearest-rank `p`-th percentile of nanosecond latencies, in µs.
pub(super) fn pct(v: &[u64], p: f64) -> f64 {
    crate::commands::bench::steps::pct(v, p) as f64 / 1e3
}
