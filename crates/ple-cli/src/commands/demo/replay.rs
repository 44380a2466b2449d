//! One pass of the engine's script through the C API, with verification of sampled tokens, and
//! the cold prefill-chunk timing.

use super::reference::{decode_row, reference_ids};
use super::script::{Requests, Step, script};
use super::{Handle, WAIT_US, check, evict};
use ple::*;
use ple_core::error::{Error, Result};
use ple_core::format::table::TableMeta;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

/// Elements of one token's output row.
use super::DIM;

#[derive(serde::Serialize, Default, Clone)]
pub(super) struct PassReport {
    pub(super) name: String,
    pub(super) step_ms: Vec<f64>,
    pub(super) prefill_p50_ms: f64,
    pub(super) prefill_p99_ms: f64,
    pub(super) decode_p50_ms: f64,
    pub(super) decode_p99_ms: f64,
    pub(super) tokens: u64,
    pub(super) rows: u64,
    pub(super) unique_pages: u64,
    pub(super) storage_kib_per_token: f64,
    pub(super) storage_reads_per_token: f64,
    pub(super) hash_ms: f64,
    pub(super) prefetch_ms: f64,
    pub(super) gather_ms: f64,
    pub(super) copy_ms: f64,
    pub(super) wait_ms: f64,
}

fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[((p / 100.0) * (s.len() - 1) as f64).round() as usize]
}

/// What the verification checked and found.
#[derive(Default)]
pub(super) struct Verify {
    pub(super) tokens_checked: u64,
    pub(super) rows_checked: u64,
    pub(super) values_checked: u64,
    pub(super) mismatches: u64,
}

/// What the library returned for one step: its tokens' ids, packed rows and dequantised values.
struct Got<'a> {
    ids: &'a [i64],
    rows: &'a [u8],
    values: &'a [f32],
}

impl Verify {
    /// Checks the sampled tokens of step `s` (all of a decode step's, every 17th of a prefill
    /// step's) against the reference rule and the file. `reqs` has the step applied.
    fn check_step(
        &mut self,
        table: &TableMeta,
        rows_file: &std::fs::File,
        s: &Step,
        reqs: &Requests,
        got: &Got,
    ) -> Result<()> {
        let rb = table.row_bytes as usize;
        for (ri, &rid) in s.request_ids.iter().enumerate() {
            for t in s.query_start[ri] as usize..s.query_start[ri + 1] as usize {
                if s.prefill && t % 17 != 0 {
                    continue;
                }
                let want = reference_ids(&table.hash, &reqs.seqs[&rid], s.positions[t] as usize);
                self.tokens_checked += 1;
                for (k, &id) in want.iter().enumerate() {
                    let mut row = vec![0u8; rb];
                    rows_file
                        .read_exact_at(&mut row, id * rb as u64)
                        .map_err(|e| Error::io("pread", e))?;
                    self.rows_checked += 1;
                    if got.ids[t * 16 + k] != id as i64
                        || got.rows[(t * 16 + k) * rb..(t * 16 + k + 1) * rb] != row[..]
                    {
                        self.mismatches += 1;
                    }
                    let vals = decode_row(table.row_format, table.global_scale, &row);
                    let values = &got.values[t * DIM + k * 160..t * DIM + (k + 1) * 160];
                    self.values_checked += 160;
                    if vals
                        .iter()
                        .zip(values)
                        .any(|(a, b)| a.to_bits() != b.to_bits())
                    {
                        self.mismatches += 1;
                    }
                }
            }
        }
        Ok(())
    }
}

impl PassReport {
    /// The pass's rows, pages, storage and time split from the handle's counters before and
    /// after it, and the step latency percentiles.
    fn finish(&mut self, before: &ple_stats, after: &ple_stats, pre: &[f64], dec: &[f64]) {
        self.rows =
            (after.prefill_rows + after.decode_rows) - (before.prefill_rows + before.decode_rows);
        self.unique_pages = after.unique_pages - before.unique_pages;
        self.storage_kib_per_token = (after.storage_read_bytes - before.storage_read_bytes) as f64
            / 1024.0
            / self.tokens as f64;
        self.storage_reads_per_token =
            (after.storage_reads - before.storage_reads) as f64 / self.tokens as f64;
        self.hash_ms = (after.hash_ns - before.hash_ns) as f64 / 1e6;
        self.prefetch_ms = (after.prefetch_ns - before.prefetch_ns) as f64 / 1e6;
        self.gather_ms = (after.gather_ns - before.gather_ns) as f64 / 1e6;
        self.copy_ms = (after.copy_ns - before.copy_ns) as f64 / 1e6;
        self.wait_ms = (after.wait_ns - before.wait_ns) as f64 / 1e6;
        self.prefill_p50_ms = percentile(pre, 50.0);
        self.prefill_p99_ms = percentile(pre, 99.0);
        self.decode_p50_ms = percentile(dec, 50.0);
        self.decode_p99_ms = percentile(dec, 99.0);
    }
}

/// Submits step `s` as `seq` and waits for it; returns the library's ids of its tokens and the
/// submit → wait time (ms).
fn submit_and_wait(h: &Handle, s: &Step, seq: u64) -> Result<(Vec<i64>, f64)> {
    let b = s.batch();
    let mut lib_ids = vec![0i64; s.tokens.len() * 16];
    check(
        // SAFETY: the handle is open; the batch points into `s`; `lib_ids` holds 16 ids per token.
        unsafe { ple_ngram_ids(h.0, &b, lib_ids.as_mut_ptr()) },
        "ple_ngram_ids",
    )?;
    let t0 = Instant::now();
    // SAFETY: the handle is open; the batch points into `s`, which outlives the call.
    check(unsafe { ple_submit(h.0, &b, seq) }, "ple_submit")?;
    // SAFETY: the handle is open.
    check(unsafe { ple_wait(h.0, seq, WAIT_US) }, "ple_wait")?;
    Ok((lib_ids, t0.elapsed().as_secs_f64() * 1e3))
}

/// The done step `seq`'s packed rows (copied; `rb` bytes each) and its values dequantised into
/// `out` (which consumes the step).
fn step_outputs(h: &Handle, seq: u64, rb: usize, out: &mut [f32]) -> Result<Vec<u8>> {
    let mut rows_ptr = std::ptr::null();
    let mut nt = 0u32;
    check(
        // SAFETY: the handle is open; both out-pointers are writable locals.
        unsafe { ple_packed_rows(h.0, seq, &mut rows_ptr, &mut nt) },
        "ple_packed_rows",
    )?;
    let staged =
        // SAFETY: ple_packed_rows returned OK: `rows_ptr` holds `nt` tokens of 16 rows of `rb` bytes until the step is consumed (below).
        unsafe { std::slice::from_raw_parts(rows_ptr, nt as usize * 16 * rb) }.to_vec();
    check(
        // SAFETY: the handle is open; `out` holds 4096 rows of DIM f32, and a step has at most 4096 tokens (max_tokens_per_step).
        unsafe { ple_dequant_cpu(h.0, seq, out.as_mut_ptr() as *mut _, PLE_DTYPE_F32, DIM, 0) },
        "ple_dequant_cpu",
    )?;
    Ok(staged)
}

/// Runs the script once on `h`, verifying sampled tokens of each step ([`Verify::check_step`]).
pub(super) fn replay(
    h: &Handle,
    table: &TableMeta,
    rows_file: &std::fs::File,
    steps: &[Step],
    name: &str,
    v: &mut Verify,
) -> Result<PassReport> {
    let before = h.stats()?;
    let mut reqs = Requests::default();
    let mut rep = PassReport {
        name: name.into(),
        ..Default::default()
    };
    let (mut pre, mut dec) = (vec![], vec![]);
    let rb = table.row_bytes as usize;
    let mut out = vec![0f32; 4096 * DIM];
    for (i, s) in steps.iter().enumerate() {
        let seq = i as u64 + 1;
        let (lib_ids, ms) = submit_and_wait(h, s, seq)?;
        rep.step_ms.push(ms);
        if s.prefill {
            pre.push(ms)
        } else {
            dec.push(ms)
        }
        reqs.apply(s);
        let staged = step_outputs(h, seq, rb, &mut out)?;
        let got = Got {
            ids: &lib_ids,
            rows: &staged,
            values: &out,
        };
        v.check_step(table, rows_file, s, &reqs, &got)?;
        rep.tokens += s.tokens.len() as u64;
    }
    rep.finish(&before, &h.stats()?, &pre, &dec);
    Ok(rep)
}

/// Times one cold 2,048-token prefill chunk with the given prefetch policy.
pub(super) fn cold_chunk_ms(table_dir: &Path, rows: &Path, policy: i32) -> Result<f64> {
    let h = Handle::open(table_dir, policy, -1)?;
    let s = &script(0, 900)[0];
    evict(rows)?;
    let b = s.batch();
    let t0 = Instant::now();
    // SAFETY: the handle is open; the batch points into `s`, which outlives the call.
    check(unsafe { ple_submit(h.0, &b, 1) }, "ple_submit")?;
    // SAFETY: the handle is open.
    check(unsafe { ple_wait(h.0, 1, WAIT_US) }, "ple_wait")?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    // SAFETY: the handle is open.
    check(unsafe { ple_release_step(h.0, 1) }, "ple_release_step")?;
    Ok(ms)
}
