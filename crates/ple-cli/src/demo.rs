//! `ple demo`: the whole job end to end on a generated table, through the C API.
//!
//! 1. Generates a realistically shaped NVFP4 checkpoint (real safetensors files and index, the
//!    model's hash constants, a smaller `ngram_vocab_size_base` so the table is ~1.4 GiB), reusing
//!    it if present; packs it with a progress bar; opens it.
//! 2. Replays an engine: a 2,048-token prefill chunk of real text, short prompts for 7 more
//!    requests, then decode steps for 8 requests, one of them verifying speculative drafts and
//!    rolling back the rejected ones — through `ple_submit` / `ple_wait` / `ple_packed_rows` /
//!    `ple_dequant_cpu` (and `ple_dequant_fuse` when a GPU is present). Once cold (the table's pages
//!    evicted), once warm.
//! 3. Verifies sampled outputs against an independent recomputation: ids by the plain reference
//!    rule written out here, row bytes read from the file with `pread`, values decoded by a plain
//!    scalar rule.
//! 4. Prints a summary and writes `demo-report.json` and `demo-latency.svg` into the work directory.

use ple::*;
use ple_core::error::{Error, Result};
use ple_core::model::{HashParams, RowFormat};
use std::ffi::CString;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `ngram_vocab_size_base` of the demo checkpoint: 16 heads × ~1M rows × 90 B ≈ 1.4 GiB.
pub const DEMO_BASE: u64 = 1_000_000;

fn check(status: ple_status, what: &str) -> Result<()> {
    if status == PLE_OK {
        return Ok(());
    }
    let msg = unsafe { std::ffi::CStr::from_ptr(ple_last_error_message()) }
        .to_string_lossy()
        .into_owned();
    Err(Error::State(format!("{what}: {}: {msg}", unsafe {
        std::ffi::CStr::from_ptr(ple_status_name(status)).to_string_lossy()
    })))
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.to_string_lossy().as_bytes())
        .map_err(|_| Error::InvalidArgument(format!("path {} has a NUL", p.display())))
}

/// A handle opened through the C API, closed on drop.
struct Handle(*mut ple_handle);

impl Handle {
    fn open(dir: &Path, prefetch: i32, cuda_device: i32) -> Result<Handle> {
        let mut o = std::mem::MaybeUninit::<ple_options>::uninit();
        check(
            unsafe { ple_options_default(o.as_mut_ptr()) },
            "ple_options_default",
        )?;
        let mut o = unsafe { o.assume_init() };
        o.max_tokens_per_step = 4096;
        o.prefetch_policy = prefetch;
        o.cuda_device = cuda_device;
        let mut h = std::ptr::null_mut();
        let d = cstr(dir)?;
        check(unsafe { ple_open(d.as_ptr(), &o, &mut h) }, "ple_open")?;
        Ok(Handle(h))
    }
    fn stats(&self) -> Result<ple_stats> {
        let mut s = ple_stats {
            struct_size: std::mem::size_of::<ple_stats>(),
            ..Default::default()
        };
        check(unsafe { ple_stats(self.0, &mut s) }, "ple_stats")?;
        Ok(s)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        unsafe { ple_close(self.0) };
    }
}

/// One engine step: the requests' spans.
#[derive(Clone, Debug)]
struct Step {
    tokens: Vec<i32>,
    positions: Vec<i32>,
    request_ids: Vec<u64>,
    query_start: Vec<u32>,
    prefill: bool,
}

impl Step {
    fn batch(&self) -> ple_batch {
        ple_batch {
            tokens: self.tokens.as_ptr(),
            positions: self.positions.as_ptr(),
            num_tokens: self.tokens.len() as u32,
            request_ids: self.request_ids.as_ptr(),
            query_start: self.query_start.as_ptr(),
            num_requests: self.request_ids.len() as u32,
            context: std::ptr::null(),
        }
    }
}

/// The engine's view of its requests: every accepted token by position, for the reference ids.
#[derive(Default, Clone)]
struct Requests {
    seqs: std::collections::BTreeMap<u64, Vec<i32>>,
}

impl Requests {
    /// Applies a step the way the library's tracked mode must: a span at position p replaces
    /// positions >= p.
    fn apply(&mut self, s: &Step) {
        for (i, &rid) in s.request_ids.iter().enumerate() {
            let (a, b) = (s.query_start[i] as usize, s.query_start[i + 1] as usize);
            let seq = self.seqs.entry(rid).or_default();
            seq.truncate(s.positions[a] as usize);
            seq.extend_from_slice(&s.tokens[a..b]);
        }
    }
}

/// The engine's script: prefill of request 1 (2,048 tokens of real text), prompts for requests
/// 2..=8, then `decode_steps` decode steps of 8 requests; request 5 verifies 4 drafts per step and
/// 2 are accepted, so every step rolls back the 2 rejected positions.
fn script(decode_steps: usize, rid_base: u64) -> Vec<Step> {
    let mut steps = Vec::new();
    let long = ple_testkit::text::stream(2048 + decode_steps + 1, 0);
    steps.push(Step {
        tokens: long[..2048].to_vec(),
        positions: (0..2048).collect(),
        request_ids: vec![rid_base + 1],
        query_start: vec![0, 2048],
        prefill: true,
    });
    let mut prompts: Vec<Vec<i32>> = (2..=8)
        .map(|r| ple_testkit::text::stream(64 + 200, r))
        .collect();
    let mut s = Step {
        tokens: vec![],
        positions: vec![],
        request_ids: vec![],
        query_start: vec![0],
        prefill: true,
    };
    for (i, p) in prompts.iter().enumerate() {
        s.tokens.extend_from_slice(&p[..64]);
        s.positions.extend(0..64);
        s.request_ids.push(rid_base + 2 + i as u64);
        s.query_start.push(s.tokens.len() as u32);
    }
    steps.push(s);
    let mut next = [0i32; 9];
    next[1] = 2048;
    for n in next.iter_mut().skip(2) {
        *n = 64;
    }
    for d in 0..decode_steps {
        let mut s = Step {
            tokens: vec![],
            positions: vec![],
            request_ids: vec![],
            query_start: vec![0],
            prefill: false,
        };
        for r in 1..=8usize {
            let len = if r == 5 { 4 } else { 1 };
            for k in 0..len {
                let p = next[r] + k;
                let tok = if r == 1 {
                    long[p as usize]
                } else if r == 5 && k >= 2 {
                    // a rejected draft: some other word
                    ple_testkit::text::piece_id(&format!(" draft{d}_{k}"))
                } else {
                    let src = &mut prompts[r - 2];
                    src[(p as usize) % src.len()]
                };
                s.tokens.push(tok);
                s.positions.push(p);
            }
            s.request_ids.push(rid_base + r as u64);
            s.query_start.push(s.tokens.len() as u32);
            next[r] += if r == 5 { 2 } else { 1 };
        }
        steps.push(s);
    }
    steps
}

/// The reference rule (SPEC §3), written out plainly: context with the EOS cut, mixes, plain `%`.
fn reference_ids(p: &HashParams, seq: &[i32], pos: usize) -> Vec<u64> {
    let eos = p.eos_token_id;
    let n = p.ngram_size as usize;
    let mut ctx = vec![eos; n - 1];
    let mut cut = false;
    for (k, c) in ctx.iter_mut().enumerate() {
        let q = pos as i64 - 1 - k as i64;
        if cut || q < 0 {
            break;
        }
        *c = seq[q as usize];
        if *c == eos {
            cut = true;
        }
    }
    let mut ids = Vec::new();
    let mut mix = (seq[pos] as i64).wrapping_mul(p.multipliers[0] as i64);
    for (order, &c) in ctx.iter().enumerate() {
        mix ^= (c as i64).wrapping_mul(p.multipliers[order + 1] as i64);
        for j in 0..p.heads_per_ngram as usize {
            let h = order * p.heads_per_ngram as usize + j;
            ids.push((mix as u64) % p.head_sizes[h] + p.offsets[h]);
        }
    }
    ids
}

fn e4m3(b: u8) -> f32 {
    let (s, e, m) = (b >> 7, (b >> 3) & 15, (b & 7) as i32);
    if e == 15 && m == 7 {
        return f32::NAN;
    }
    let v = if e == 0 {
        m as f32 * 2f32.powi(-9)
    } else {
        (8 + m) as f32 * 2f32.powi(e as i32 - 10)
    };
    if s == 1 { -v } else { v }
}

/// Decodes one row to f32 by the plain rule of SPEC §5.
fn decode_row(format: RowFormat, global: f32, row: &[u8]) -> Vec<f32> {
    const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    (0..160)
        .map(|j| match format {
            RowFormat::Nvfp4 => {
                let byte = row[j / 2];
                let code = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
                let v = E2M1[(code & 7) as usize] * if code & 8 != 0 { -1.0 } else { 1.0 };
                (v * e4m3(row[80 + j / 16])) * global
            }
            RowFormat::Fp8 => e4m3(row[j]) * global,
            RowFormat::Bf16 => {
                f32::from_bits((u16::from_le_bytes([row[2 * j], row[2 * j + 1]]) as u32) << 16)
            }
        })
        .collect()
}

/// Evicts the table's pages from the page cache (POSIX_FADV_DONTNEED); returns false if the
/// kernel kept them (e.g. dirty pages).
fn evict(rows: &Path) -> Result<()> {
    let f = std::fs::File::open(rows).map_err(|e| Error::io_path("opening", rows, e))?;
    use std::os::fd::AsRawFd;
    unsafe {
        libc::fdatasync(f.as_raw_fd());
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    Ok(())
}

#[derive(serde::Serialize, Default, Clone)]
struct PassReport {
    name: String,
    step_ms: Vec<f64>,
    prefill_p50_ms: f64,
    prefill_p99_ms: f64,
    decode_p50_ms: f64,
    decode_p99_ms: f64,
    tokens: u64,
    rows: u64,
    unique_pages: u64,
    storage_kib_per_token: f64,
    storage_reads_per_token: f64,
    hash_ms: f64,
    prefetch_ms: f64,
    gather_ms: f64,
    copy_ms: f64,
    wait_ms: f64,
}

fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[((p / 100.0) * (s.len() - 1) as f64).round() as usize]
}

struct Verify {
    tokens_checked: u64,
    rows_checked: u64,
    values_checked: u64,
    mismatches: u64,
}

/// Runs the script once on `h`, verifying every `sample`-th token of each step.
fn replay(
    h: &Handle,
    table: &ple_core::format::table::TableMeta,
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
    let mut out = vec![0f32; 4096 * 2560];
    for (i, s) in steps.iter().enumerate() {
        let seq = i as u64 + 1;
        let b = s.batch();
        let mut lib_ids = vec![0i64; s.tokens.len() * 16];
        check(
            unsafe { ple_ngram_ids(h.0, &b, lib_ids.as_mut_ptr()) },
            "ple_ngram_ids",
        )?;
        let t0 = Instant::now();
        check(unsafe { ple_submit(h.0, &b, seq) }, "ple_submit")?;
        check(unsafe { ple_wait(h.0, seq, 0) }, "ple_wait")?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        rep.step_ms.push(ms);
        if s.prefill {
            pre.push(ms)
        } else {
            dec.push(ms)
        }
        reqs.apply(s);
        let mut rows_ptr = std::ptr::null();
        let mut nt = 0u32;
        check(
            unsafe { ple_packed_rows(h.0, seq, &mut rows_ptr, &mut nt) },
            "ple_packed_rows",
        )?;
        let staged =
            unsafe { std::slice::from_raw_parts(rows_ptr, nt as usize * 16 * rb) }.to_vec();
        check(
            unsafe {
                ple_dequant_cpu(h.0, seq, out.as_mut_ptr() as *mut _, PLE_DTYPE_F32, 2560, 0)
            },
            "ple_dequant_cpu",
        )?;
        // verify sampled tokens (all of a decode step's, every 17th of a prefill step's)
        for (ri, &rid) in s.request_ids.iter().enumerate() {
            for t in s.query_start[ri] as usize..s.query_start[ri + 1] as usize {
                if s.prefill && t % 17 != 0 {
                    continue;
                }
                let want = reference_ids(&table.hash, &reqs.seqs[&rid], s.positions[t] as usize);
                v.tokens_checked += 1;
                for (k, &id) in want.iter().enumerate() {
                    let mut row = vec![0u8; rb];
                    rows_file
                        .read_exact_at(&mut row, id * rb as u64)
                        .map_err(|e| Error::io("pread", e))?;
                    v.rows_checked += 1;
                    if lib_ids[t * 16 + k] != id as i64
                        || staged[(t * 16 + k) * rb..(t * 16 + k + 1) * rb] != row[..]
                    {
                        v.mismatches += 1;
                    }
                    let vals = decode_row(table.row_format, table.global_scale, &row);
                    let got = &out[t * 2560 + k * 160..t * 2560 + (k + 1) * 160];
                    v.values_checked += 160;
                    if vals
                        .iter()
                        .zip(got)
                        .any(|(a, b)| a.to_bits() != b.to_bits())
                    {
                        v.mismatches += 1;
                    }
                }
            }
        }
        rep.tokens += s.tokens.len() as u64;
    }
    let after = h.stats()?;
    rep.rows =
        (after.prefill_rows + after.decode_rows) - (before.prefill_rows + before.decode_rows);
    rep.unique_pages = after.unique_pages - before.unique_pages;
    rep.storage_kib_per_token =
        (after.storage_read_bytes - before.storage_read_bytes) as f64 / 1024.0 / rep.tokens as f64;
    rep.storage_reads_per_token =
        (after.storage_reads - before.storage_reads) as f64 / rep.tokens as f64;
    rep.hash_ms = (after.hash_ns - before.hash_ns) as f64 / 1e6;
    rep.prefetch_ms = (after.prefetch_ns - before.prefetch_ns) as f64 / 1e6;
    rep.gather_ms = (after.gather_ns - before.gather_ns) as f64 / 1e6;
    rep.copy_ms = (after.copy_ns - before.copy_ns) as f64 / 1e6;
    rep.wait_ms = (after.wait_ns - before.wait_ns) as f64 / 1e6;
    rep.prefill_p50_ms = percentile(&pre, 50.0);
    rep.prefill_p99_ms = percentile(&pre, 99.0);
    rep.decode_p50_ms = percentile(&dec, 50.0);
    rep.decode_p99_ms = percentile(&dec, 99.0);
    Ok(rep)
}

/// Times one cold 2,048-token prefill chunk with the given prefetch policy.
fn cold_chunk_ms(table_dir: &Path, rows: &Path, policy: i32) -> Result<f64> {
    let h = Handle::open(table_dir, policy, -1)?;
    let s = &script(0, 900)[0];
    evict(rows)?;
    let b = s.batch();
    let t0 = Instant::now();
    check(unsafe { ple_submit(h.0, &b, 1) }, "ple_submit")?;
    check(unsafe { ple_wait(h.0, 1, 0) }, "ple_wait")?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    check(unsafe { ple_release_step(h.0, 1) }, "ple_release_step")?;
    Ok(ms)
}

fn svg(cold: &PassReport, warm: &PassReport) -> String {
    let (w, h, pad) = (760.0, 360.0, 50.0);
    let n = cold.step_ms.len().max(2);
    let max = cold
        .step_ms
        .iter()
        .chain(&warm.step_ms)
        .cloned()
        .fold(0.001f64, f64::max);
    let (lo, hi) = (
        (0.001f64)
            .max(
                warm.step_ms
                    .iter()
                    .chain(&cold.step_ms)
                    .cloned()
                    .fold(f64::MAX, f64::min),
            )
            .log10()
            .floor(),
        max.log10().ceil(),
    );
    let y =
        |v: f64| pad + (h - 2.0 * pad) * (1.0 - (v.max(1e-3).log10() - lo) / (hi - lo).max(1e-9));
    let x = |i: usize| pad + (w - 2.0 * pad) * i as f64 / (n - 1) as f64;
    let line = |v: &[f64], color: &str| {
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(i, &m)| format!("{:.1},{:.1}", x(i), y(m)))
            .collect();
        format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>",
            pts.join(" ")
        )
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    s += &format!(
        "<text x=\"{pad}\" y=\"20\" font-size=\"14\">libple demo: step latency, submit to rows ready (log scale)</text>\n"
    );
    let mut e = lo;
    while e <= hi {
        let v = 10f64.powf(e);
        s += &format!(
            "<line x1=\"{pad}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"5\" y=\"{:.1}\">{} ms</text>\n",
            w - pad,
            y(v),
            y(v),
            y(v) + 4.0,
            v
        );
        e += 1.0;
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\">engine step (1 = 2,048-token prefill, 2 = prompts, then decode)</text>\n",
        pad,
        h - 12.0
    );
    s += &line(&cold.step_ms, "#d62728");
    s += &line(&warm.step_ms, "#1f77b4");
    s += &format!(
        "<text x=\"{}\" y=\"40\" fill=\"#d62728\">cold (pages evicted)</text><text x=\"{}\" y=\"56\" fill=\"#1f77b4\">warm (page cache)</text>\n</svg>\n",
        w - 230.0,
        w - 230.0
    );
    s
}

/// Generates the demo checkpoint in `dir` unless a complete one from the same spec is there (a
/// marker file written last records the spec).
fn ensure_checkpoint(dir: &Path) -> Result<()> {
    let spec = ple_testkit::synth::CheckpointSpec::new(RowFormat::Nvfp4, DEMO_BASE, 128, 2026);
    let marker = dir.join(".ple-demo-complete");
    let want = format!("{:?}", spec.config);
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(want.as_str()) {
        return Ok(());
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| Error::io_path("removing", dir, e))?;
    }
    println!(
        "  generating a {} checkpoint (ngram_vocab_size_base {DEMO_BASE}, 128 row shards)...",
        spec.format.name()
    );
    ple_testkit::synth::write_checkpoint(dir, &spec)?;
    std::fs::write(&marker, want).map_err(|e| Error::io_path("writing", &marker, e))
}

/// Runs the demo in `work`.
pub fn run(work: &Path) -> Result<()> {
    let t_all = Instant::now();
    std::fs::create_dir_all(work).map_err(|e| Error::io_path("creating", work, e))?;
    let ck = work.join("checkpoint");
    let table_dir = work.join("table");
    println!("libple demo: work directory {}", work.display());
    let t = Instant::now();
    ensure_checkpoint(&ck)?;
    println!(
        "  checkpoint  {} ({:.1} s)",
        ck.display(),
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let report = crate::cli::pack_with_bar(
        &ck,
        &table_dir,
        &ple_core::format::pack::PackOptions::default(),
        false,
    )?;
    println!(
        "  table       {} ({}, {:.1} s)",
        table_dir.display(),
        if report.reused { "reused" } else { "packed" },
        t.elapsed().as_secs_f64()
    );

    let topen = ple_core::format::table::Table::open(&table_dir, &Default::default())?;
    let meta = topen.meta().clone();
    let rows_path: PathBuf = topen.rows_path().to_path_buf();
    drop(topen);
    let rows_file =
        std::fs::File::open(&rows_path).map_err(|e| Error::io_path("opening", &rows_path, e))?;
    println!(
        "  {} rows x {} B ({}) = {:.2} GiB, {} heads x {} values, global scale {}",
        meta.total_rows,
        meta.row_bytes,
        meta.row_format.name(),
        meta.file_bytes() as f64 / (1u64 << 30) as f64,
        meta.num_heads,
        meta.head_dim,
        meta.global_scale
    );

    let mut v = Verify {
        tokens_checked: 0,
        rows_checked: 0,
        values_checked: 0,
        mismatches: 0,
    };
    let decode_steps = 48;
    evict(&rows_path)?;
    // the same engine script on a fresh handle, cold (pages evicted first) and then warm
    let mut pass = |name: &str| -> Result<PassReport> {
        let h = Handle::open(&table_dir, PLE_PREFETCH_AUTO, -1)?;
        replay(
            &h,
            &meta,
            &rows_file,
            &script(decode_steps, 0),
            name,
            &mut v,
        )
    };
    let cold = pass("cold")?;
    let warm = pass("warm")?;
    let gpu = gpu_pass(&table_dir, &meta)?;
    let off = cold_chunk_ms(&table_dir, &rows_path, PLE_PREFETCH_NEVER)?;
    let on = cold_chunk_ms(&table_dir, &rows_path, PLE_PREFETCH_ALWAYS)?;

    println!();
    println!("  {:<34} {:>12} {:>12}", "", "cold", "warm");
    // one line of the summary: the same figure of the cold and the warm pass
    let row = |k: &str, f: &dyn Fn(&PassReport) -> String| {
        println!("  {k:<34} {:>12} {:>12}", f(&cold), f(&warm))
    };
    let per_token = |x: u64, r: &PassReport| x as f64 / r.tokens as f64;
    row("tokens / rows", &|r| format!("{}/{}", r.tokens, r.rows));
    row("rows per token", &|r| {
        format!("{:.1}", per_token(r.rows, r))
    });
    row("unique pages per token", &|r| {
        format!("{:.2}", per_token(r.unique_pages, r))
    });
    row("storage KiB / reads per token", &|r| {
        format!(
            "{:.2}/{:.2}",
            r.storage_kib_per_token, r.storage_reads_per_token
        )
    });
    row("prefill step p50 / p99 (ms)", &|r| {
        format!("{:.2}/{:.2}", r.prefill_p50_ms, r.prefill_p99_ms)
    });
    row("decode step p50 / p99 (ms)", &|r| {
        format!("{:.3}/{:.3}", r.decode_p50_ms, r.decode_p99_ms)
    });
    row("time: hash / prefetch (ms)", &|r| {
        format!("{:.2}/{:.2}", r.hash_ms, r.prefetch_ms)
    });
    row("time: gather / copy (ms)", &|r| {
        format!("{:.2}/{:.2}", r.gather_ms, r.copy_ms)
    });
    println!(
        "  cold 2,048-token chunk: prefetch off {off:.1} ms, on {on:.1} ms: speed-up {:.2}x",
        off / on.max(1e-9)
    );
    match &gpu {
        Some(g) => println!("  GPU: {g}"),
        None => println!("  GPU: none found (cuda_device 0 unavailable): CPU dequant only"),
    }
    let ok = v.mismatches == 0 && v.tokens_checked > 0;
    println!(
        "  verification: {} tokens, {} rows, {} values checked against the plain reference rule and the file: {}",
        v.tokens_checked,
        v.rows_checked,
        v.values_checked,
        if ok {
            "all match".to_string()
        } else {
            format!("{} MISMATCHES", v.mismatches)
        }
    );
    let json = serde_json::json!({
        "table": {"rows": meta.total_rows, "row_bytes": meta.row_bytes, "format": meta.row_format.name(), "file_bytes": meta.file_bytes()},
        "cold": cold, "warm": warm,
        "cold_chunk_prefetch_off_ms": off, "cold_chunk_prefetch_on_ms": on, "prefetch_speedup": off / on.max(1e-9),
        "gpu": gpu,
        "verification": {"tokens": v.tokens_checked, "rows": v.rows_checked, "values": v.values_checked, "mismatches": v.mismatches},
    });
    let jp = work.join("demo-report.json");
    std::fs::write(&jp, serde_json::to_string_pretty(&json).unwrap())
        .map_err(|e| Error::io_path("writing", &jp, e))?;
    let sp = work.join("demo-latency.svg");
    std::fs::write(&sp, svg(&cold, &warm)).map_err(|e| Error::io_path("writing", &sp, e))?;
    println!(
        "  wrote {} and {} ({:.1} s in all)",
        jp.display(),
        sp.display(),
        t_all.elapsed().as_secs_f64()
    );
    if !ok {
        return Err(Error::State(format!(
            "verification failed: {} mismatches",
            v.mismatches
        )));
    }
    Ok(())
}

/// With a GPU: the engine's script (prefill, prompts, 16 decode steps) through `ple_dequant_fuse`
/// on an engine stream, each step compared bit for bit with `ple_dequant_cpu` of the same step on
/// a CPU handle. `None` when no CUDA device can be opened.
fn gpu_pass(
    table_dir: &Path,
    _meta: &ple_core::format::table::TableMeta,
) -> Result<Option<String>> {
    let gpu = match Handle::open(table_dir, PLE_PREFETCH_AUTO, 0) {
        Err(_) => return Ok(None),
        Ok(h) => h,
    };
    let cpu = Handle::open(table_dir, PLE_PREFETCH_AUTO, -1)?;
    let steps = script(16, 500);
    let max_tokens = steps.iter().map(|s| s.tokens.len()).max().unwrap_or(1);
    let engine = ple_core::dequant::gpu::EngineStream::new(0, max_tokens * 2560 * 4)?;
    let mut info = ple_table_info {
        struct_size: std::mem::size_of::<ple_table_info>(),
        ..unsafe { std::mem::zeroed() }
    };
    check(
        unsafe { ple_table_info(gpu.0, &mut info) },
        "ple_table_info",
    )?;
    let (mut mismatched, mut total_ms) = (0u64, 0.0f64);
    let mut want = vec![0f32; max_tokens * 2560];
    let mut got = vec![0u8; max_tokens * 2560 * 4];
    for (i, s) in steps.iter().enumerate() {
        let seq = i as u64 + 1;
        let b = s.batch();
        let n = s.tokens.len();
        let t0 = Instant::now();
        check(
            unsafe { ple_submit(gpu.0, &b, seq) },
            "ple_submit (GPU handle)",
        )?;
        check(
            unsafe {
                ple_dequant_fuse(
                    gpu.0,
                    engine.stream(),
                    seq,
                    engine.buffer() as *mut _,
                    PLE_DTYPE_F32,
                    2560,
                    0,
                )
            },
            "ple_dequant_fuse",
        )?;
        engine.download(&mut got[..n * 2560 * 4])?;
        total_ms += t0.elapsed().as_secs_f64() * 1e3;
        check(
            unsafe { ple_submit(cpu.0, &b, seq) },
            "ple_submit (CPU handle)",
        )?;
        check(
            unsafe {
                ple_dequant_cpu(
                    cpu.0,
                    seq,
                    want.as_mut_ptr() as *mut _,
                    PLE_DTYPE_F32,
                    2560,
                    0,
                )
            },
            "ple_dequant_cpu",
        )?;
        let want_bytes =
            unsafe { std::slice::from_raw_parts(want.as_ptr() as *const u8, n * 2560 * 4) };
        if want_bytes != &got[..n * 2560 * 4] {
            mismatched += 1;
        }
    }
    check(unsafe { ple_check_device(gpu.0) }, "ple_check_device")?;
    if mismatched > 0 {
        return Err(Error::State(format!(
            "GPU: {mismatched} of {} steps differ from ple_dequant_cpu",
            steps.len()
        )));
    }
    Ok(Some(format!(
        "{} steps through ple_dequant_fuse (device wait {}), bit-identical to ple_dequant_cpu; {:.2} ms per step incl. download",
        steps.len(),
        if info.device_wait_supported != 0 {
            "supported"
        } else {
            "unsupported: host wait"
        },
        total_ms / steps.len() as f64
    )))
}
