//! The bench's tables and its ratios against their targets.

use super::Ctx;
use super::cold::{BARE, COLD_DECODE, Cold, DIRECT, MMAP, MMAP_WILLNEED, OFF, SEED};
use super::floor::Floor;
use super::steps::{Run, pct};
use super::warm::Warm;
use serde_json::{Value, json};

fn verdict(ok: bool) -> &'static str {
    if ok { "meets target" } else { "MISSES target" }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn print_runs<'a>(runs: impl Iterator<Item = &'a Run>) {
    println!(
        "{:<16} {:<32} {:>5} {:>9} {:>9} {:>11} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "shape",
        "mode",
        "steps",
        "p50 ms",
        "p99 ms",
        "rows/s",
        "KiB/token",
        "majf/tok",
        "reads/stp",
        "KiB/stp",
        "CPU µs/st",
        "pf µs/st",
        "rd µs/st"
    );
    for r in runs {
        let (ma, _) = r.faults_per_token();
        let st = r.steps.max(1) as f64;
        println!(
            "{:<16} {:<32} {:>5} {:>9.3} {:>9.3} {:>11.0} {:>10.2} {:>9.3} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            r.shape,
            r.mode,
            r.steps,
            r.p50(),
            r.p99(),
            r.rows_per_s(),
            r.kib_per_token(),
            ma,
            r.storage_reads as f64 / st,
            r.read_bytes as f64 / 1024.0 / st,
            r.cpu_us_per_step(),
            r.prefetch_ns as f64 / 1e3 / st,
            r.gather_ns as f64 / 1e3 / st,
        );
    }
}

fn print_warm_detail(w: &Warm) {
    println!();
    println!("warm steps, stages (mean per step, µs; queue = submit until the worker starts it):");
    println!(
        "  {:<16} {:>9} {:>9} {:>14} {:>9} {:>15} {:>9}",
        "shape", "queue", "hash", "pages+prefetch", "gather", "submit->done", "prefetch"
    );
    for st in &w.stages {
        let f = |k: &str| st[k].as_f64().unwrap_or(0.0);
        println!(
            "  {:<16} {:>9.1} {:>9.1} {:>14.1} {:>9.1} {:>15.1} {:>9}",
            st["shape"].as_str().unwrap_or(""),
            f("queue_us"),
            f("hash_us"),
            f("pages_and_prefetch_us"),
            f("gather_us"),
            f("submit_to_done_us"),
            st["prefetch_steps"].as_u64().unwrap_or(0),
        );
    }
    println!();
    println!(
        "warm step vs its gather alone, both on the pipeline's worker thread (and pool): bare = \
         the same gathers from the mapped table, memory floor (c) = from an anonymous copy of the \
         touched rows:"
    );
    println!(
        "  {:<16} {:>12} {:>12} {:>12} {:>12}",
        "shape", "step p50 ms", "bare p50 ms", "floor p50 ms", "floor p99 ms"
    );
    for (((name, lat), b), r) in w.floor.iter().zip(&w.bare).zip(&w.runs) {
        println!(
            "  {:<16} {:>12.3} {:>12.3} {:>12.3} {:>12.3}",
            name,
            r.p50(),
            pct(b, 50.0) as f64 / 1e6,
            pct(lat, 50.0) as f64 / 1e6,
            pct(lat, 99.0) as f64 / 1e6
        );
    }
}

/// The ratios against their targets: each printed as it is added, and kept as JSON.
#[derive(Default)]
struct Ratios(Vec<Value>);

impl Ratios {
    fn add(&mut self, name: &str, value: f64, target: &str, ok: bool) {
        println!(
            "  {name:<66} {value:>8.2}  (target {target}: {})",
            verdict(ok)
        );
        self.0
            .push(json!({"name": name, "value": value, "target": target, "meets": ok}));
    }
}

/// Prints everything; returns the ratios as JSON.
pub(crate) fn print(ctx: &Ctx, w: &Warm, fl: &Floor, c: &Cold) -> Vec<Value> {
    println!();
    print_runs(w.runs.iter().chain(&c.runs));
    println!(
        "(reads and KiB of a cold MMAP decode step include the pages its worker advises after it, \
         for the page cache: a sector per row for the step, then the row's page)"
    );
    print_warm_detail(w);
    let mut ratios = Ratios::default();
    println!();
    println!("ratios:");
    warm_ratios(ctx, w, &mut ratios);
    if ctx.a.warm_only {
        return ratios.0;
    }
    cold_mmap_ratios(ctx, fl, c, &mut ratios);
    direct_ratios(ctx, fl, c, &mut ratios);
    if !c.fully_evicted {
        println!(
            "  (note: the page cache could not be fully evicted; cold figures are partly warm)"
        );
    }
    ratios.0
}

/// The warm targets: the prefill chunk against the in-memory gather, decode 8x1 against the bare
/// gather.
fn warm_ratios(ctx: &Ctx, w: &Warm, ratio: &mut Ratios) {
    let chunk = &ctx.shapes[0].name;
    let warm_chunk = w
        .runs
        .iter()
        .find(|r| &r.shape == chunk)
        .expect("warm chunk");
    let v = warm_chunk.p50() / (pct(&w.floor[0].1, 50.0) as f64 / 1e6).max(1e-9);
    ratio.add(
        "warm prefill chunk / in-memory gather (p50)",
        v,
        "<= 1.5",
        v <= 1.5,
    );
    let i8 = ctx.shape("decode 8x1");
    let v = w.runs[i8].p50() / (pct(&w.bare[i8], 50.0) as f64 / 1e6).max(1e-9);
    ratio.add(
        "decode 8x1 submit->wait / bare gather (p50)",
        v,
        "<= 1.2",
        v <= 1.2,
    );
}

/// The cold MMAP targets: decode against the seed method, the prefill chunk against prefetch off
/// and against its unique pages at the 4 KiB IOPS.
fn cold_mmap_ratios(ctx: &Ctx, fl: &Floor, c: &Cold, ratio: &mut Ratios) {
    let chunk = &ctx.shapes[0].name;
    for (name, _) in COLD_DECODE {
        if let (Some(m), Some(s)) = (c.find(name, MMAP), c.find(name, SEED)) {
            let v = m.p50() / s.p50().max(1e-9);
            let t = matches!(name, "decode 8x1" | "decode 64x1");
            let target = if t { "<= 0.8" } else { "report" };
            ratio.add(
                &format!("cold {name} MMAP / seed method (p50)"),
                v,
                target,
                !t || v <= 0.8,
            );
        }
        if let (Some(m), Some(s)) = (c.find(name, MMAP_WILLNEED), c.find(name, SEED)) {
            let v = m.p50() / s.p50().max(1e-9);
            ratio.add(
                &format!("cold {name} MMAP with WILLNEED + gather / seed method (p50)"),
                v,
                "report",
                true,
            );
        }
    }
    let mmap_chunk = median(
        c.runs
            .iter()
            .filter(|r| &r.shape == chunk && r.mode == MMAP)
            .map(|r| r.p50())
            .collect(),
    );
    if let Some(off) = c.find(chunk, OFF) {
        let v = off.p50() / mmap_chunk;
        ratio.add(
            "cold prefill chunk MMAP: speed-up of prefetch over prefetch off",
            v,
            "> 1",
            v > 1.0,
        );
    }
    if let Some(iops4k) = fl.iops(4096, 64) {
        let pages = median(c.chunk_pages.iter().map(|&p| p as f64).collect());
        let v = mmap_chunk / (pages / iops4k * 1e3);
        ratio.add(
            "cold prefill chunk MMAP / (unique pages / 4 KiB IOPS QD64)",
            v,
            "report",
            true,
        );
    }
}

/// The DIRECT targets: decode 8x1 and the prefill chunk against the 512 B floor, bytes per row
/// against the sector floor, CPU per row read.
fn direct_ratios(ctx: &Ctx, fl: &Floor, c: &Cold, ratio: &mut Ratios) {
    if let Err(e) = &c.direct {
        println!("  DIRECT not measured: {e}");
        return;
    }
    let b = fl.block;
    let (Some(iops), Some(qd1)) = (fl.iops(b, 64), fl.qd1_ms(b)) else {
        println!("  DIRECT ratios: no {b} B io_uring floor here");
        return;
    };
    direct_decode_ratios(c, b, iops, qd1, ratio);
    direct_chunk_ratios(&ctx.shapes[0].name, c, b, iops, ratio);
    direct_cost_ratios(fl, c, ratio);
}

/// Cold decode 8x1 DIRECT against its floor: the read latency, then its reads at the device's
/// QD64 rate (`iops` of `b`-byte reads, `qd1` ms); and what of it is the pipeline's.
fn direct_decode_ratios(c: &Cold, b: u32, iops: f64, qd1: f64, ratio: &mut Ratios) {
    let decode_floor = |r: &Run| qd1 + r.storage_reads as f64 / r.steps.max(1) as f64 / iops * 1e3;
    let Some(d8) = c.find("decode 8x1", DIRECT) else {
        return;
    };
    let v = d8.p50() / decode_floor(d8);
    ratio.add(
        &format!("cold decode 8x1 DIRECT / (QD1 latency + its reads / {b} B IOPS QD64)"),
        v,
        "<= 1.5",
        v <= 1.5,
    );
    // what of it is the pipeline's (hash, hand-offs, row cache) and what the reads'
    if let Some(alone) = c.find("decode 8x1", BARE) {
        ratio.add(
            "cold decode 8x1 DirectReader alone (f) / (QD1 latency + its reads / IOPS)",
            alone.p50() / decode_floor(alone),
            "report",
            true,
        );
        ratio.add(
            "cold decode 8x1 DIRECT / DirectReader alone (f) (p50, paired)",
            d8.p50() / alone.p50(),
            "report",
            true,
        );
    }
}

/// The cold prefill chunks (shape `chunk`) DIRECT against their reads at the device's QD64 rate,
/// from the floor's run and from the floor taken beside each chunk.
fn direct_chunk_ratios(chunk: &str, c: &Cold, b: u32, iops: f64, ratio: &mut Ratios) {
    let chunks: Vec<&Run> = c
        .runs
        .iter()
        .filter(|r| r.shape == chunk && r.mode == DIRECT)
        .collect();
    if chunks.is_empty() {
        return;
    }
    let v = median(
        chunks
            .iter()
            .map(|r| r.p50() / (r.storage_reads as f64 / iops * 1e3))
            .collect(),
    );
    ratio.add(
        &format!("cold prefill chunk DIRECT / (its reads / {b} B IOPS QD64)"),
        v,
        "report",
        true,
    );
    // the same against the floor taken beside each chunk (the device drifts between the
    // floor's run and the chunks')
    let paired: Vec<f64> = (chunks.iter().zip(&c.chunk_floor_iops))
        .filter_map(|(r, f)| Some(r.p50() / (r.storage_reads as f64 / (*f)? * 1e3)))
        .collect();
    if !paired.is_empty() {
        let v = median(paired);
        ratio.add(
            &format!("cold prefill chunk DIRECT / (its reads / {b} B IOPS QD64 beside it)"),
            v,
            "<= 1.15",
            v <= 1.15,
        );
    }
}

/// DIRECT's costs: storage bytes against the sector floor, CPU per row (libple's own and the
/// kernel's), CPU per read against the floor probe's and fio's.
fn direct_cost_ratios(fl: &Floor, c: &Cold, ratio: &mut Ratios) {
    let b = fl.block;
    let (mut bytes, mut cpu, mut rows) = (0u64, 0u64, 0u64);
    for r in c.runs.iter().filter(|r| r.mode == DIRECT) {
        bytes += r.read_bytes;
        cpu += r.cpu_ns;
        rows += r.rows;
    }
    let floor: u64 = c.sector_floor.iter().map(|x| x.1).sum();
    let v = bytes as f64 / floor.max(1) as f64;
    ratio.add(
        "DIRECT storage bytes / sector floor of the rows read",
        v,
        "<= 1.2",
        v <= 1.2,
    );
    let v = cpu as f64 / 1e3 / rows.max(1) as f64;
    ratio.add(
        "DIRECT CPU µs of libple threads per row read",
        v,
        "<= 1",
        v <= 1.0,
    );
    for x in &c.cpu_split {
        let (u, s) = x.per_row_us();
        let what = format!(
            "{}; {} cold 8x1 steps, {:.1} s, {:.2} rows/read",
            x.handle,
            x.steps,
            x.wall_s,
            x.rows as f64 / x.reads.max(1) as f64
        );
        ratio.add(
            &format!("DIRECT CPU µs per row, libple's own code (worker, user; {what})"),
            u,
            "<= 1",
            u <= 1.0,
        );
        ratio.add(
            &format!(
                "DIRECT CPU µs per row, the kernel (worker, system; {})",
                x.handle
            ),
            s,
            "report",
            true,
        );
    }
    // the kernel's share of a read is the floor of any reader: the same reads by the floor's
    // probe and by fio, on the same file
    let (mut reads, mut rows_read) = (0u64, 0u64);
    for r in c.runs.iter().filter(|r| r.mode == DIRECT) {
        reads += r.storage_reads;
        rows_read += r.rows;
    }
    let per_read = cpu as f64 / 1e3 / reads.max(1) as f64;
    let (probe, fio) = fl.cpu_us(b, 64);
    for (name, floor) in [("the floor probe's", probe), ("fio's", fio)] {
        if let Some(f) = floor {
            let v = per_read / f.max(1e-9);
            ratio.add(
                &format!(
                    "DIRECT CPU per read ({per_read:.2} µs, {:.2} rows/read) / {name} ({b} B QD64, {f:.2} µs)",
                    rows_read as f64 / reads.max(1) as f64
                ),
                v,
                "report",
                true,
            );
        }
    }
}
