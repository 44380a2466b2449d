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

#![warn(clippy::undocumented_unsafe_blocks)]

mod gpu;
mod reference;
mod replay;
mod report;
mod script;

use clap::Args;
use ple::*;
use ple_core::error::{Error, Result};
use ple_core::format::table::TableMeta;
use ple_core::model::RowFormat;
use replay::{PassReport, Verify, cold_chunk_ms, replay};
use script::script;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `ngram_vocab_size_base` of the demo checkpoint: 16 heads × ~1M rows × 90 B ≈ 1.4 GiB.
pub const DEMO_BASE: u64 = 1_000_000;

/// Timeout of the demo's waits for a step, microseconds (`ple_wait(.., 0)` would only poll).
const WAIT_US: u64 = 60_000_000;

fn check(status: ple_status, what: &str) -> Result<()> {
    if status == PLE_OK {
        return Ok(());
    }
    // SAFETY: ple_last_error_message never returns NULL; the text is NUL-terminated and lives until the next libple call on this thread.
    let msg = unsafe { std::ffi::CStr::from_ptr(ple_last_error_message()) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: ple_status_name returns a static NUL-terminated string.
    Err(Error::State(format!("{what}: {}: {msg}", unsafe {
        std::ffi::CStr::from_ptr(ple_status_name(status)).to_string_lossy()
    })))
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.to_string_lossy().as_bytes())
        .map_err(|_| Error::InvalidArgument(format!("path {} has a NUL", p.display())))
}

/// The shipped model's geometry, the only one the demo's script and reference are for.
const SHIPPED_HEADS: u32 = ple_core::model::NUM_HEADS as u32;
const SHIPPED_HEAD_DIM: u32 = ple_core::model::HEAD_DIM as u32;
/// Elements of one token's embedding in the demo's table.
const DIM: usize = ple_core::model::PLE_EMBED_DIM;

/// A handle opened through the C API, closed on drop; `open` refuses any table but the shipped
/// model's geometry.
struct Handle(*mut ple_handle);

impl Handle {
    fn open(dir: &Path, prefetch: i32, cuda_device: i32) -> Result<Handle> {
        Self::open_with(dir, |o| {
            o.prefetch_policy = prefetch;
            o.cuda_device = cuda_device;
        })
    }
    fn open_with(dir: &Path, f: impl FnOnce(&mut ple_options)) -> Result<Handle> {
        let mut o = std::mem::MaybeUninit::<ple_options>::uninit();
        check(
            // SAFETY: `o` is writable memory for one ple_options.
            unsafe { ple_options_default(o.as_mut_ptr()) },
            "ple_options_default",
        )?;
        // SAFETY: ple_options_default returned OK, so it initialised every field.
        let mut o = unsafe { o.assume_init() };
        o.max_tokens_per_step = 4096;
        f(&mut o);
        let mut h = std::ptr::null_mut();
        let d = cstr(dir)?;
        // SAFETY: `d` is a NUL-terminated path, `o` initialised options, `h` a writable local.
        check(unsafe { ple_open(d.as_ptr(), &o, &mut h) }, "ple_open")?;
        let h = Handle(h);
        // SAFETY: ple_info is plain data (integers and char arrays): all-zero is a valid value.
        let mut info: ple_table_info = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<ple_table_info>();
        // SAFETY: the handle is open; `info` is a writable ple_info with its struct_size set.
        check(unsafe { ple_table_info(h.0, &mut info) }, "ple_table_info")?;
        if (info.num_heads, info.head_dim) != (SHIPPED_HEADS, SHIPPED_HEAD_DIM) {
            return Err(Error::InvalidArgument(format!(
                "the demo replays the shipped model's script: a table of {SHIPPED_HEADS} heads of \
                 {SHIPPED_HEAD_DIM}, not {} of {}",
                info.num_heads, info.head_dim
            )));
        }
        Ok(h)
    }
    fn stats(&self) -> Result<ple_stats> {
        let mut s = ple_stats {
            struct_size: std::mem::size_of::<ple_stats>(),
            ..Default::default()
        };
        // SAFETY: the handle is open; `s` is writable with its struct_size set.
        check(unsafe { ple_stats(self.0, &mut s) }, "ple_stats")?;
        Ok(s)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle is open and closed only here, once.
        unsafe { ple_close(self.0) };
    }
}

/// Evicts the table's pages from the page cache (POSIX_FADV_DONTNEED), best effort: the
/// kernel may keep some (e.g. dirty pages).
fn evict(rows: &Path) -> Result<()> {
    let f = std::fs::File::open(rows).map_err(|e| Error::io_path("opening", rows, e))?;
    use std::os::fd::AsRawFd;
    // SAFETY: `f` is an open file descriptor for the calls' duration; both calls only take it and plain integers.
    unsafe {
        libc::fdatasync(f.as_raw_fd());
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    Ok(())
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

/// `ple demo [--work-dir DIR]`
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Where the generated checkpoint, table and reports go.
    #[arg(long, default_value = ".ple-demo")]
    pub work_dir: PathBuf,
}

pub fn run(a: DemoArgs) -> Result<()> {
    ple::log::init();
    run_in(&a.work_dir)
}

/// Runs the demo in `work`.
fn run_in(work: &Path) -> Result<()> {
    let t_all = Instant::now();
    std::fs::create_dir_all(work).map_err(|e| Error::io_path("creating", work, e))?;
    println!("libple demo: work directory {}", work.display());
    let (table_dir, meta, rows_path) = prepare(work)?;
    let rows_file =
        std::fs::File::open(&rows_path).map_err(|e| Error::io_path("opening", &rows_path, e))?;
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
    let gpu = gpu::gpu_pass(&table_dir, &meta)?;
    let off = cold_chunk_ms(&table_dir, &rows_path, PLE_PREFETCH_NEVER)?;
    let on = cold_chunk_ms(&table_dir, &rows_path, PLE_PREFETCH_ALWAYS)?;

    print_summary(&cold, &warm, off, on);
    let cache = cache_warmup(&table_dir, decode_steps)?;
    match &gpu {
        Some(g) => println!("  GPU: {g}"),
        None => println!("  GPU: none found (cuda_device 0 unavailable): CPU dequant only"),
    }
    let ok = print_verification(&v);
    let json = serde_json::json!({
        "table": {"rows": meta.total_rows, "row_bytes": meta.row_bytes, "format": meta.row_format.name(), "file_bytes": meta.file_bytes()},
        "cold": cold, "warm": warm,
        "cold_chunk_prefetch_off_ms": off, "cold_chunk_prefetch_on_ms": on, "prefetch_speedup": off / on.max(1e-9),
        "gpu": gpu,
        "row_cache_hit_rate_per_round": cache,
        "verification": {"tokens": v.tokens_checked, "rows": v.rows_checked, "values": v.values_checked, "mismatches": v.mismatches},
    });
    write_reports(work, &json, &cold, &warm, t_all)?;
    if !ok {
        return Err(Error::State(format!(
            "verification failed: {} mismatches",
            v.mismatches
        )));
    }
    Ok(())
}

/// The demo's table: the generated checkpoint in `work` (made unless present), packed into a
/// table there (or reused); returns the table's directory, metadata and row file.
fn prepare(work: &Path) -> Result<(PathBuf, TableMeta, PathBuf)> {
    let ck = work.join("checkpoint");
    let table_dir = work.join("table");
    let t = Instant::now();
    ensure_checkpoint(&ck)?;
    println!(
        "  checkpoint  {} ({:.1} s)",
        ck.display(),
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let report = crate::progress::pack_with_bar(
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
    Ok((table_dir, meta, rows_path))
}

/// Prints what the verification checked; returns whether everything matched.
fn print_verification(v: &Verify) -> bool {
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
    ok
}

/// Writes `demo-report.json` and `demo-latency.svg` into `work`.
fn write_reports(
    work: &Path,
    json: &serde_json::Value,
    cold: &PassReport,
    warm: &PassReport,
    t_all: Instant,
) -> Result<()> {
    let jp = work.join("demo-report.json");
    std::fs::write(&jp, serde_json::to_string_pretty(json).unwrap())
        .map_err(|e| Error::io_path("writing", &jp, e))?;
    let sp = work.join("demo-latency.svg");
    std::fs::write(&sp, report::svg(cold, warm)).map_err(|e| Error::io_path("writing", &sp, e))?;
    println!(
        "  wrote {} and {} ({:.1} s in all)",
        jp.display(),
        sp.display(),
        t_all.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The row cache warming up: one handle with a 64 MiB row cache replays the engine script three
/// times; prints each round's hit rate (`cache_hits / (cache_hits + cache_misses)`).
fn cache_warmup(table_dir: &Path, decode_steps: usize) -> Result<Vec<f64>> {
    const CACHE_BYTES: u64 = 64 << 20;
    let h = Handle::open_with(table_dir, |o| o.cache_bytes = CACHE_BYTES)?;
    let steps = script(decode_steps, 1000);
    let mut seq = 0u64;
    let mut rates = Vec::new();
    for round in 1..=3 {
        let before = h.stats()?;
        for s in &steps {
            seq += 1;
            let b = s.batch();
            // SAFETY: the handle is open; the batch points into `s`, which outlives the call.
            check(unsafe { ple_submit(h.0, &b, seq) }, "ple_submit")?;
            // SAFETY: the handle is open.
            check(unsafe { ple_release_step(h.0, seq) }, "ple_release_step")?;
        }
        let after = h.stats()?;
        let hits = after.cache_hits - before.cache_hits;
        let misses = after.cache_misses - before.cache_misses;
        let rate = hits as f64 / (hits + misses).max(1) as f64;
        println!(
            "  row cache ({} MiB) round {round}: hit rate {:.1}% ({hits} of {} rows), {:.1} MiB used",
            CACHE_BYTES >> 20,
            rate * 100.0,
            hits + misses,
            after.cache_bytes_used as f64 / (1u64 << 20) as f64
        );
        rates.push(rate);
    }
    Ok(rates)
}

/// Prints the cold and warm passes side by side, and the cold prefill-chunk timing.
fn print_summary(cold: &PassReport, warm: &PassReport, off: f64, on: f64) {
    println!();
    println!("  {:<34} {:>12} {:>12}", "", "cold", "warm");
    // one line of the summary: the same figure of the cold and the warm pass
    let row = |k: &str, f: &dyn Fn(&PassReport) -> String| {
        println!("  {k:<34} {:>12} {:>12}", f(cold), f(warm))
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
}
