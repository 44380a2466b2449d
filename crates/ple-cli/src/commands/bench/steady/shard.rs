//! `ple bench steady --shard K/N`: after the rank's run, the same steps on the whole table (a
//! handle with N times the rank's row cache: the memory of the N ranks together; the table's
//! pages evicted first), and the rank's rows, storage reads and KiB per token beside the whole
//! table's (1/N expected).

use super::SteadyArgs;
use super::workload::Workload;
use crate::commands::bench::steps::Step;
use ple_core::error::Result;
use ple_core::shard::Shard;
use ple_core::stats::Counters;
use ple_core::step::{OpenOptions, Pipeline};
use serde_json::{Value, json};

/// What a run moved, between two counter snapshots.
#[derive(Clone, Copy, Debug)]
pub(super) struct PerToken {
    tokens: u64,
    rows: u64,
    reads: u64,
    bytes: u64,
    hits: u64,
    misses: u64,
}

impl PerToken {
    /// The figures between counters `a` and `b` of a run of `tokens` tokens.
    pub(super) fn of(a: &Counters, b: &Counters, tokens: u64) -> PerToken {
        PerToken {
            tokens,
            rows: (b.prefill_rows + b.decode_rows) - (a.prefill_rows + a.decode_rows),
            reads: b.storage_reads - a.storage_reads,
            bytes: b.storage_read_bytes - a.storage_read_bytes,
            hits: b.cache_hits - a.cache_hits,
            misses: b.cache_misses - a.cache_misses,
        }
    }
    fn per_token(&self, x: u64) -> f64 {
        x as f64 / self.tokens.max(1) as f64
    }
    fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
    fn row(&self, label: &str) {
        println!(
            "{label:>14} {:>10.2} {:>10.2} {:>10.2} {:>7.1}",
            self.per_token(self.rows),
            self.per_token(self.reads),
            self.per_token(self.bytes) / 1024.0,
            100.0 * self.hit_rate()
        );
    }
    fn json(&self) -> Value {
        json!({
            "tokens": self.tokens, "rows_per_token": self.per_token(self.rows),
            "storage_reads_per_token": self.per_token(self.reads),
            "storage_kib_per_token": self.per_token(self.bytes) / 1024.0,
            "hit_rate": self.hit_rate(),
        })
    }
}

/// Runs the rank's `steps` steps again on the whole table (options `opts` but the shard, and N
/// times the row cache) and prints both runs' per-token figures and their ratio.
pub(super) fn whole_beside_shard(
    a: &SteadyArgs,
    opts: &OpenOptions,
    steps: u64,
    rank: PerToken,
) -> Result<Value> {
    let n = opts.shard.count as u64;
    let whole_opts = OpenOptions {
        shard: Shard::WHOLE,
        cache_bytes: opts.cache_bytes.saturating_mul(n),
        ..opts.clone()
    };
    let p = Pipeline::open(&a.table_dir, whole_opts)?;
    // (MMAP: the rank's run left its heads' pages cached; the whole run starts from none)
    crate::commands::bench::memory::evict(&[p.table().bytes()], p.table().file());
    let meta = p.table().meta();
    // the same workload, so the same steps (it is deterministic)
    let mut wl = Workload::new(&a.opts, meta.hash.vocab_size, meta.hash.eos_token_id)?;
    let (c0, mut st, mut tokens) = (p.counters(), Step::default(), 0u64);
    for seq in 1..=steps {
        wl.step(&mut st);
        p.submit(&st.batch(), seq)?;
        p.wait(seq, 0)?;
        p.release_step(seq)?;
        tokens += st.tokens.len() as u64;
    }
    let whole = PerToken::of(&c0, &p.counters(), tokens);
    println!(
        "{} beside the whole table (its row cache {} × the rank's), the same {steps} steps:",
        opts.shard.describe(),
        n
    );
    println!(
        "{:>14} {:>10} {:>10} {:>10} {:>7}",
        "", "rows/tok", "reads/tok", "KiB/tok", "hit%"
    );
    rank.row(&opts.shard.describe());
    whole.row("whole table");
    let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::NAN };
    let (rows, reads, kib) = (
        ratio(rank.per_token(rank.rows), whole.per_token(whole.rows)),
        ratio(rank.per_token(rank.reads), whole.per_token(whole.reads)),
        ratio(rank.per_token(rank.bytes), whole.per_token(whole.bytes)),
    );
    println!(
        "{:>14} {rows:>10.3} {reads:>10.3} {kib:>10.3}   (1/N = {:.3})",
        "rank / whole",
        1.0 / n as f64
    );
    Ok(json!({
        "shard": opts.shard, "rank": rank.json(), "whole": whole.json(),
        "rank_over_whole": {"rows": rows, "storage_reads": reads, "storage_kib": kib},
    }))
}
