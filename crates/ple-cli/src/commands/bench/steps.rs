//! Steps of the bench: shapes over the token streams, runs through a pipeline, bare gathers.

use ple_core::error::Result;
use ple_core::lookup::context::Batch;
use ple_core::stats;
use ple_core::step::Pipeline;
use ple_testkit::corpus::Corpus;
use serde_json::{Value, json};
use std::time::Instant;

/// One step's batch, owned (stateless: each span carries its context tokens).
#[derive(Clone, Debug, Default)]
pub(crate) struct Step {
    pub(crate) tokens: Vec<i32>,
    pub(crate) positions: Vec<i32>,
    pub(crate) request_ids: Vec<u64>,
    pub(crate) query_start: Vec<u32>,
    pub(crate) context: Vec<i32>,
}

impl Step {
    pub(crate) fn batch(&self) -> Batch<'_> {
        Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            request_ids: &self.request_ids,
            query_start: &self.query_start,
            context: Some(&self.context),
        }
    }
}

/// A step shape: `reqs` requests × `toks` tokens per step.
#[derive(Clone, Debug)]
pub(crate) struct Shape {
    pub(crate) name: String,
    pub(crate) reqs: usize,
    pub(crate) toks: usize,
    pub(crate) steps: usize,
}

/// Steps of `shape`: request `r` reads stream `seed + r` from its start, `toks` tokens per step,
/// with the two tokens before each span as stateless context.
pub(crate) fn make_steps(c: &Corpus, shape: &Shape, seed: u64, eos: i32) -> Vec<Step> {
    let len = shape.toks * shape.steps;
    let streams: Vec<Vec<i32>> = (0..shape.reqs)
        .map(|r| c.stream(seed * 1000 + r as u64, len))
        .collect();
    (0..shape.steps)
        .map(|s| {
            let mut st = Step {
                tokens: Vec::new(),
                positions: Vec::new(),
                request_ids: Vec::new(),
                query_start: vec![0],
                context: Vec::new(),
            };
            for (r, stream) in streams.iter().enumerate() {
                let p = s * shape.toks;
                st.request_ids.push(r as u64 + 1);
                for i in 0..shape.toks {
                    st.tokens.push(stream[p + i]);
                    st.positions.push((p + i) as i32);
                }
                st.query_start.push(st.tokens.len() as u32);
                let at = |q: isize| if q < 0 { eos } else { stream[q as usize] };
                st.context.push(at(p as isize - 2));
                st.context.push(at(p as isize - 1));
            }
            st
        })
        .collect()
}

/// What one run of steps measured.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub(crate) shape: String,
    pub(crate) mode: &'static str,
    pub(crate) steps: usize,
    pub(crate) tokens: u64,
    pub(crate) rows: u64,
    pub(crate) lat_ns: Vec<u64>,
    pub(crate) unique_pages: u64,
    pub(crate) pages_prefetched: u64,
    pub(crate) major: u64,
    pub(crate) minor: u64,
    pub(crate) read_bytes: u64,
    /// Process-wide read_bytes over the run (cross-check).
    pub(crate) proc_read_bytes: u64,
    pub(crate) resident_before: u64,
    /// Storage requests issued (the handle's `storage_reads`).
    pub(crate) storage_reads: u64,
    /// CPU time of the whole process over the run (user + system), ns.
    pub(crate) cpu_ns: u64,
    /// The handle's prefetch and gather (or DIRECT read) time over the run, ns.
    pub(crate) prefetch_ns: u64,
    pub(crate) gather_ns: u64,
}

/// The nearest-rank `p`-th percentile of `v` (0 for an empty `v`).
pub(crate) fn pct(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let i = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[i.clamp(1, s.len()) - 1]
}

impl Run {
    pub(crate) fn p50(&self) -> f64 {
        pct(&self.lat_ns, 50.0) as f64 / 1e6
    }
    pub(crate) fn p99(&self) -> f64 {
        pct(&self.lat_ns, 99.0) as f64 / 1e6
    }
    pub(crate) fn total_s(&self) -> f64 {
        self.lat_ns.iter().sum::<u64>() as f64 / 1e9
    }
    pub(crate) fn rows_per_s(&self) -> f64 {
        self.rows as f64 / self.total_s().max(1e-12)
    }
    pub(crate) fn kib_per_token(&self) -> f64 {
        self.read_bytes as f64 / 1024.0 / self.tokens.max(1) as f64
    }
    pub(crate) fn cpu_us_per_step(&self) -> f64 {
        self.cpu_ns as f64 / 1e3 / self.steps.max(1) as f64
    }
    pub(crate) fn faults_per_token(&self) -> (f64, f64) {
        let t = self.tokens.max(1) as f64;
        (self.major as f64 / t, self.minor as f64 / t)
    }
    pub(crate) fn json(&self) -> Value {
        let (ma, mi) = self.faults_per_token();
        json!({
            "shape": self.shape, "mode": self.mode, "steps": self.steps, "tokens": self.tokens,
            "rows": self.rows, "p50_ms": self.p50(), "p99_ms": self.p99(),
            "mean_ms": self.total_s() * 1e3 / self.steps.max(1) as f64,
            "rows_per_s": self.rows_per_s(), "unique_pages": self.unique_pages,
            "pages_prefetched": self.pages_prefetched, "major_faults": self.major,
            "minor_faults": self.minor, "storage_read_bytes": self.read_bytes,
            "process_read_bytes": self.proc_read_bytes,
            "storage_kib_per_token": self.kib_per_token(), "major_faults_per_token": ma,
            "minor_faults_per_token": mi, "resident_pages_before": self.resident_before,
            "storage_reads": self.storage_reads, "cpu_us_per_step": self.cpu_us_per_step(),
            "prefetch_us_per_step": self.prefetch_ns as f64 / 1e3 / self.steps.max(1) as f64,
            "gather_us_per_step": self.gather_ns as f64 / 1e3 / self.steps.max(1) as f64,
        })
    }
}

/// Runs `steps` through `p` (submit → wait → release), timing each step.
pub(crate) fn run_steps(
    p: &Pipeline,
    steps: &[Step],
    seq: &mut u64,
    shape: &str,
    mode: &'static str,
    resident_before: u64,
) -> Result<Run> {
    let s0 = p.counters();
    let io0 = stats::process_read_bytes().unwrap_or(0);
    let cpu0 = super::engine_cpu_ns();
    let mut lat = Vec::with_capacity(steps.len());
    let mut tokens = 0u64;
    for st in steps {
        *seq += 1;
        let t = Instant::now();
        p.submit(&st.batch(), *seq)?;
        p.wait(*seq, 0)?;
        lat.push(stats::ns(t.elapsed()));
        p.release_step(*seq)?;
        tokens += st.tokens.len() as u64;
    }
    let d = p.counters().delta(&s0);
    Ok(Run {
        shape: shape.into(),
        mode,
        steps: steps.len(),
        tokens,
        rows: tokens * 16,
        lat_ns: lat,
        unique_pages: d.unique_pages,
        pages_prefetched: d.pages_prefetched,
        major: d.major_faults,
        minor: d.minor_faults,
        read_bytes: d.storage_read_bytes,
        proc_read_bytes: stats::process_read_bytes().unwrap_or(0).saturating_sub(io0),
        resident_before,
        storage_reads: d.storage_reads,
        cpu_ns: super::engine_cpu_ns().saturating_sub(cpu0),
        prefetch_ns: d.prefetch_ns,
        gather_ns: d.gather_ns,
    })
}

pub(crate) fn ids_of(p: &Pipeline, st: &Step) -> Result<Vec<u64>> {
    let mut ids = vec![0i64; st.tokens.len() * 16];
    p.ngram_ids(&st.batch(), &mut ids)?;
    Ok(ids.into_iter().map(|x| x as u64).collect())
}

/// Times a gather of each step's ids from `src` (pool as the pipeline uses it).
pub(crate) fn time_gathers(
    src: &[u8],
    rb: usize,
    ids: &[Vec<u64>],
    pool: &rayon::ThreadPool,
) -> Result<(Vec<u64>, stats::IoDelta)> {
    let max = ids.iter().map(|v| v.len()).max().unwrap_or(0);
    let mut buf = vec![0u8; max * rb];
    let mut lat = Vec::with_capacity(ids.len());
    let mut io = stats::IoDelta::default();
    for v in ids {
        let t = Instant::now();
        io.add(ple_core::io::gather::gather(
            src,
            rb,
            v,
            &mut buf,
            Some(pool),
        )?);
        lat.push(stats::ns(t.elapsed()));
    }
    Ok((lat, io))
}

/// Adds run `r` into `acc`.
pub(crate) fn accumulate(acc: &mut Option<Run>, r: Run) {
    match acc {
        None => *acc = Some(r),
        Some(a) => {
            a.steps += r.steps;
            a.tokens += r.tokens;
            a.rows += r.rows;
            a.lat_ns.extend(r.lat_ns);
            a.unique_pages += r.unique_pages;
            a.pages_prefetched += r.pages_prefetched;
            a.major += r.major;
            a.minor += r.minor;
            a.read_bytes += r.read_bytes;
            a.proc_read_bytes += r.proc_read_bytes;
            a.storage_reads += r.storage_reads;
            a.cpu_ns += r.cpu_ns;
            a.prefetch_ns += r.prefetch_ns;
            a.gather_ns += r.gather_ns;
        }
    }
}

/// Stage sums over decode steps, from counter deltas (of one or several spans of steps).
#[derive(Default)]
pub(crate) struct Stages {
    steps: u64,
    queue_ns: u64,
    hash_ns: u64,
    gather_ns: u64,
    done_ns: u64,
}

impl Stages {
    /// Adds the steps between the snapshots `a` and `b` (b later).
    pub(crate) fn add(&mut self, a: &stats::Counters, b: &stats::Counters) {
        self.steps += b.decode_steps - a.decode_steps;
        self.queue_ns += b.queue_ns - a.queue_ns;
        self.hash_ns += b.hash_ns - a.hash_ns;
        self.gather_ns += b.gather_ns - a.gather_ns;
        self.done_ns += b.decode_step_ns - a.decode_step_ns;
    }

    /// Means per step, µs.
    pub(crate) fn means(&self) -> String {
        let per = |ns: u64| ns as f64 / 1e3 / self.steps.max(1) as f64;
        format!(
            "queue {:.1}, hash {:.1}, gather {:.1}, submit-to-done {:.1} µs",
            per(self.queue_ns),
            per(self.hash_ns),
            per(self.gather_ns),
            per(self.done_ns)
        )
    }
}
