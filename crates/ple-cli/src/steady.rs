//! `ple bench --steady`: a serving workload at steady state, for sizing the row cache.
//!
//! `--requests` requests decode through long documents (continuous batching): each step carries
//! one token of every request past its prompt, plus up to `--prefill-chunk` prompt tokens of
//! requests that just started (chunked prefill); a request that reaches the end of its document
//! is replaced by a new one with a fresh document. Documents come from the test kit's English
//! corpus streams, or from `--trace FILE` (one document per line, space-separated token ids; the
//! first `--prompt-tokens` of each are its prompt). Requests start staggered through their
//! documents, so the run begins at steady state with a cold cache.
//!
//! Per interval and overall it prints the handle's cache hit rate, storage KiB per token and
//! reads per step as measured, the storage a direct read of each miss would move (`--sector`
//! aligned), step latency p50/p99, RSS and page-cache growth of the table; beside them the same
//! row-id sequence replayed through an exact LRU of as many rows as the cache holds, an exact LRU
//! of the 4 KiB pages the same memory holds, and each row-cache policy (at `--sizes` too).

use crate::bench::steps::Step;
use clap::Args;
use ple_core::error::{Error, Result};
use ple_testkit::corpus::Corpus;
use std::path::PathBuf;

/// Options of `ple bench --steady`.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Steady-state benchmark (--steady)")]
pub struct SteadyArgs {
    /// Run the steady-state serving benchmark (row cache sizing) instead of the step shapes.
    #[arg(long)]
    pub steady: bool,
    /// Requests decoding at once.
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// Steps to run (with --seconds: whichever ends first).
    #[arg(long, default_value_t = 2000)]
    pub steps: u64,
    /// Seconds to run.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Row cache of the handle (bytes; K, M, G suffixes are powers of 1024; 0 = none).
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    pub cache_bytes: u64,
    /// Prompt tokens of each document (prefilled in chunks).
    #[arg(long, default_value_t = 1024)]
    pub prompt_tokens: usize,
    /// Tokens each request decodes after its prompt (generated documents).
    #[arg(long, default_value_t = 512)]
    pub decode_tokens: usize,
    /// Most prompt tokens per step.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Replay these documents: one per line, space-separated token ids.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Steps per report line.
    #[arg(long, default_value_t = 200)]
    pub interval: u64,
    /// More memory sizes to replay the references and policies at (e.g. 16M,64M,1G).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
    pub sizes: Vec<u64>,
    /// Alignment of the modelled direct read of a missed row, bytes.
    #[arg(long, default_value_t = 512)]
    pub sector: u64,
    /// Write a plot of hit rate and latency over the run here (SVG).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Skip the replayed references (the run's own figures only).
    #[arg(long)]
    pub no_reference: bool,
    /// Only replay the row-id sequence through the references and policies (no steps run, no
    /// rows read): sizes caches over long sequences quickly. The hit% column is then the
    /// default policy's replay at --cache-bytes.
    #[arg(long)]
    pub replay_only: bool,
    /// I/O mode of the handle: auto, mmap or direct (the all-cached comparison at the end always
    /// uses a second, MMAP handle).
    #[arg(long, default_value = "auto", value_parser = parse_io_mode)]
    pub io_mode: ple_core::step::IoMode,
    /// MMAP: cap the table's page-cache residency at this many bytes (`resident_bytes_max`;
    /// K, M, G suffixes; 0 = no cap).
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    pub resident_max: u64,
    /// Run as head shard K of N (a tensor-parallel rank, e.g. `--shard 1/4`), then the same
    /// steps on the whole table with N times the row cache (the N ranks' memory), and print the
    /// rank's rows, reads and KiB per token beside the whole table's (1/N expected).
    #[arg(long, value_name = "K/N", value_parser = crate::cli::parse_shard)]
    pub shard: Option<ple_core::shard::Shard>,
    /// With --shard: the rank's run only, not the whole table's after it (several ranks at once,
    /// `scripts/bench-tp-procs.sh`).
    #[arg(long, requires = "shard")]
    pub no_whole: bool,
}

/// Parses `auto`, `mmap`, `direct`.
pub fn parse_io_mode(s: &str) -> std::result::Result<ple_core::step::IoMode, String> {
    use ple_core::step::IoMode;
    match s {
        "auto" => Ok(IoMode::Auto),
        "mmap" => Ok(IoMode::Mmap),
        "direct" => Ok(IoMode::Direct),
        _ => Err(format!("unknown I/O mode {s:?} (auto, mmap or direct)")),
    }
}

/// Parses `123`, `64K`, `256M`, `1G`, `1T` (powers of 1024).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("{s}: unknown size suffix {c:?} (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let v: f64 = num.parse().map_err(|_| format!("{s}: not a size"))?;
    if !(0.0..=(1u64 << 50) as f64).contains(&v) {
        return Err(format!("{s}: out of range"));
    }
    Ok((v * mul as f64) as u64)
}

/// A document: its tokens and how many of them are prompt.
struct Doc {
    tokens: Vec<i32>,
    prompt: usize,
}

enum Source {
    Corpus { c: Box<Corpus>, n: u64 },
    Trace { docs: Vec<Vec<i32>>, n: usize },
}

struct Req {
    id: u64,
    doc: Doc,
    /// Next token of `doc` to process.
    pos: usize,
}

/// The requests and where their documents come from.
struct Workload {
    src: Source,
    reqs: Vec<Req>,
    next_id: u64,
    prompt: usize,
    decode: usize,
    chunk: usize,
    eos: i32,
    docs_started: u64,
}

/// Documents of a trace file (see the module doc), checked against the vocabulary.
fn read_trace(path: &std::path::Path, vocab: u32) -> Result<Vec<Vec<i32>>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading the trace {}", path.display()), e))?;
    let mut docs = Vec::new();
    for (ln, line) in text.lines().enumerate() {
        let mut d = Vec::new();
        for w in line.split_whitespace() {
            match w.parse::<i64>() {
                Ok(t) if (0..vocab as i64).contains(&t) => d.push(t as i32),
                _ => {
                    return ple_core::invalid!(
                        "{}:{}: {w:?} is not a token id in [0, {vocab})",
                        path.display(),
                        ln + 1
                    );
                }
            }
        }
        if d.len() >= 2 {
            docs.push(d);
        }
    }
    if docs.is_empty() {
        return ple_core::invalid!("{}: no document of 2 tokens or more", path.display());
    }
    Ok(docs)
}

impl Workload {
    fn new(a: &SteadyArgs, vocab: u32, eos: i32) -> Result<Workload> {
        if a.requests == 0 || a.prefill_chunk == 0 || a.prompt_tokens + a.decode_tokens < 2 {
            return ple_core::invalid!(
                "--requests, --prefill-chunk and a document of 2 tokens or more are needed"
            );
        }
        let src = match &a.trace {
            Some(p) => Source::Trace {
                docs: read_trace(p, vocab)?,
                n: 0,
            },
            None => Source::Corpus {
                c: Box::new(Corpus::new(vocab, eos)),
                n: 0,
            },
        };
        let mut w = Workload {
            src,
            reqs: Vec::new(),
            next_id: 1,
            prompt: a.prompt_tokens,
            decode: a.decode_tokens,
            chunk: a.prefill_chunk,
            eos,
            docs_started: 0,
        };
        for i in 0..a.requests {
            let mut r = w.new_req();
            // staggered: request i is i/n of the way through its decoding
            let decode = r.doc.tokens.len() - r.doc.prompt;
            r.pos = r.doc.prompt + decode * i / a.requests;
            w.reqs.push(r);
        }
        Ok(w)
    }

    fn new_req(&mut self) -> Req {
        let tokens = match &mut self.src {
            Source::Corpus { c, n } => {
                *n += 1;
                c.stream(*n, self.prompt + self.decode)
            }
            Source::Trace { docs, n } => {
                *n += 1;
                docs[(*n - 1) % docs.len()].clone()
            }
        };
        let prompt = self.prompt.min(tokens.len() - 1);
        self.docs_started += 1;
        self.next_id += 1;
        Req {
            id: self.next_id - 1,
            doc: Doc { tokens, prompt },
            pos: 0,
        }
    }

    /// The next step: one token per decoding request, up to `chunk` prompt tokens.
    fn step(&mut self, st: &mut Step) {
        st.query_start.clear();
        st.query_start.push(0);
        st.tokens.clear();
        st.positions.clear();
        st.request_ids.clear();
        st.context.clear();
        let mut budget = self.chunk;
        for i in 0..self.reqs.len() {
            let r = &self.reqs[i];
            let n = if r.pos < r.doc.prompt {
                let n = (r.doc.prompt - r.pos).min(budget);
                budget -= n;
                n
            } else {
                1
            };
            if n == 0 {
                continue;
            }
            let t = &r.doc.tokens;
            st.tokens.extend_from_slice(&t[r.pos..r.pos + n]);
            st.positions.extend((r.pos..r.pos + n).map(|p| p as i32));
            st.request_ids.push(r.id);
            st.query_start.push(st.tokens.len() as u32);
            let at = |q: usize| if q < 2 { self.eos } else { t[q - 2] };
            st.context.push(at(r.pos));
            st.context.push(at(r.pos + 1));
            let done = r.pos + n >= t.len();
            self.reqs[i].pos += n;
            if done {
                self.reqs[i] = self.new_req();
            }
        }
    }
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
fn pct(v: &[u64], p: f64) -> f64 {
    crate::bench::steps::pct(v, p) as f64 / 1e3
}

#[path = "steady_ref.rs"]
mod reference;
#[path = "steady_run.rs"]
mod run;
#[path = "steady_shard.rs"]
mod shard_cmp;
pub use run::run;
