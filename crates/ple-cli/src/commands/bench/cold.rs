//! Cold steps (page cache evicted before each run), in both I/O modes on the same steps, beside
//! the baselines: (a) prefetch off, (b) MADV_NORMAL readahead, (e) the seed deployment's method,
//! (f) DIRECT's reader alone (no pipeline, no row cache).

use super::Ctx;
use super::memory::{evict, evict_rows};
use super::steps::{Run, accumulate, run_steps, time_gathers};
use ple_core::error::{Error, Result};
use ple_core::io::direct::{DirectReader, ReadReport};
use ple_core::io::prefetch::PageSet;
use ple_core::stats;
use ple_core::step::{IoMode, Pipeline, PrefetchPolicy};
use serde_json::{Value, json};
use std::os::fd::AsRawFd;
use std::time::Instant;

/// Cold decode shapes compared across modes and with the seed's method, and their steps per mode.
pub(crate) const COLD_DECODE: [(&str, usize); 4] = [
    ("decode 1x1", 60),
    ("decode 8x1", 60),
    ("decode 64x1", 30),
    ("decode 256x1", 12),
];

pub(crate) const MMAP: &str = "cold MMAP";
pub(crate) const MMAP_WILLNEED: &str = "cold MMAP, WILLNEED + gather";
pub(crate) const DIRECT: &str = "cold DIRECT";
pub(crate) const SEED: &str = "cold, seed method (e)";
pub(crate) const OFF: &str = "cold MMAP, prefetch off (a)";
pub(crate) const NORMAL: &str = "cold, MADV_NORMAL readahead (b)";
pub(crate) const BARE: &str = "cold, DirectReader alone (f)";

/// What the cold phase measured.
pub(crate) struct Cold {
    pub(crate) runs: Vec<Run>,
    /// Per cold MMAP prefill chunk: its distinct 4 KiB pages.
    pub(crate) chunk_pages: Vec<u64>,
    /// Per DIRECT run (shape, mode): the sector floor of its rows, bytes (each distinct row's
    /// 512 B blocks).
    pub(crate) sector_floor: Vec<(String, u64)>,
    /// Per cold DIRECT prefill chunk: 512 B (direct-I/O block) IOPS at QD64 of as many random
    /// reads as the chunk issued, the faster of one probe right before it and one right after.
    pub(crate) chunk_floor_iops: Vec<Option<f64>>,
    /// DIRECT's backend, or why DIRECT could not run.
    pub(crate) direct: std::result::Result<String, String>,
    pub(crate) fully_evicted: bool,
    /// DIRECT CPU per row, user (libple) and system (kernel) apart, per handle.
    pub(crate) cpu_split: Vec<super::cpu_split::CpuSplit>,
}

impl Default for Cold {
    fn default() -> Self {
        Cold {
            runs: Vec::new(),
            chunk_pages: Vec::new(),
            sector_floor: Vec::new(),
            chunk_floor_iops: Vec::new(),
            direct: Err("not run".into()),
            fully_evicted: true,
            cpu_split: Vec::new(),
        }
    }
}

impl Cold {
    pub(crate) fn json(&self) -> Value {
        json!({
            "runs": self.runs.iter().map(|r| r.json()).collect::<Vec<_>>(),
            "chunk_unique_pages": self.chunk_pages,
            "chunk_floor_iops_qd64": self.chunk_floor_iops,
            "direct_sector_floor_bytes": self.sector_floor.iter()
                .map(|(s, b)| json!({"shape": s, "bytes": b})).collect::<Vec<_>>(),
            "direct": match &self.direct { Ok(b) => json!({"backend": b}),
                                          Err(e) => json!({"unavailable": e}) },
            "fully_evicted": self.fully_evicted,
            "direct_cpu_split": self.cpu_split.iter().map(|x| x.json()).collect::<Vec<_>>(),
        })
    }
    pub(crate) fn find(&self, shape: &str, mode: &str) -> Option<&Run> {
        self.runs
            .iter()
            .find(|r| r.shape == shape && r.mode == mode)
    }
}

/// The sector floor of `steps`' rows: per step, every distinct row's blocks of `b` bytes (the
/// file's direct-I/O block).
fn sector_floor_bytes(steps: &[Vec<u64>], rb: u64, b: u64) -> u64 {
    let mut total = 0;
    for v in steps {
        let mut u = v.clone();
        u.sort_unstable();
        u.dedup();
        total += u
            .iter()
            .map(|&r| ((r * rb + rb - 1) / b - r * rb / b + 1) * b)
            .sum::<u64>();
    }
    total
}

/// The seed's method on `ids` (one entry per step): a `posix_fadvise(WILLNEED)` for each distinct
/// 4 KiB page of the step's rows, then the gather, from `map` (MADV_RANDOM) on this thread.
fn seed_method(
    ctx: &Ctx,
    map: &[u8],
    fd: i32,
    shape: &str,
    ids: &[Vec<u64>],
    res: u64,
) -> Result<Run> {
    let rb = ctx.rb;
    let mut buf = vec![0u8; ids.iter().map(|v| v.len()).max().unwrap_or(0) * rb];
    let io0 = stats::process_read_bytes().unwrap_or(0);
    let cpu0 = super::caller_and_engine_cpu_ns();
    stats::thread_read_bytes_delta(); // this thread's reads so far are not the run's
    let (lat, io) = stats::measure(true, || -> Result<Vec<u64>> {
        let mut lat = Vec::with_capacity(ids.len());
        for v in ids {
            let t = Instant::now();
            let pages = PageSet::from_rows(v, rb);
            for &pg in &pages.pages {
                let _ = ple_core::sys::fadvise(fd, pg * 4096, 4096, libc::POSIX_FADV_WILLNEED);
            }
            ple_core::io::gather::gather_serial(map, rb, v, &mut buf)?;
            lat.push(stats::ns(t.elapsed()));
        }
        Ok(lat)
    });
    baseline_run(shape, SEED, ids, lat?, io, (io0, cpu0, res))
}

/// (f): the rows of `ids` read by a `DirectReader` on this thread, without a pipeline or a row
/// cache: DIRECT's reads alone (no hash, hand-off or cache).
fn bare_reader(
    reader: &std::cell::RefCell<DirectReader>,
    rb: usize,
    shape: &str,
    ids: &[Vec<u64>],
    res: u64,
) -> Result<Run> {
    let mut r = reader.borrow_mut();
    let mut buf = vec![0u8; ids.iter().map(|v| v.len()).max().unwrap_or(0) * rb];
    let io0 = stats::process_read_bytes().unwrap_or(0);
    let cpu0 = super::caller_and_engine_cpu_ns();
    let (mut lat, mut rep) = (Vec::with_capacity(ids.len()), ReadReport::default());
    for v in ids {
        let t = Instant::now();
        let x = r.read_rows(v, &mut buf[..v.len() * rb])?;
        lat.push(stats::ns(t.elapsed()));
        (rep.reads, rep.bytes) = (rep.reads + x.reads, rep.bytes + x.bytes);
    }
    let mut run = baseline_run(shape, BARE, ids, lat, Default::default(), (io0, cpu0, res))?;
    (run.storage_reads, run.read_bytes) = (rep.reads, rep.bytes);
    Ok(run)
}

/// The `Run` of a baseline timed on this thread (no pipeline): `lat` per step of `ids`, `io` its
/// faults and reads, and `(io0, cpu0, res)` the process read bytes and CPU time before it and the
/// pages resident before it.
fn baseline_run(
    shape: &str,
    mode: &'static str,
    ids: &[Vec<u64>],
    lat: Vec<u64>,
    io: stats::IoDelta,
    (io0, cpu0, res): (u64, u64, u64),
) -> Result<Run> {
    let tokens = (ids.iter().map(|v| v.len()).sum::<usize>() / 16) as u64;
    Ok(Run {
        shape: shape.into(),
        mode,
        steps: ids.len(),
        tokens,
        rows: tokens * 16,
        lat_ns: lat,
        unique_pages: 0,
        pages_prefetched: 0,
        major: io.major_faults,
        minor: io.minor_faults,
        read_bytes: io.read_bytes,
        proc_read_bytes: stats::process_read_bytes().unwrap_or(0).saturating_sub(io0),
        resident_before: res,
        storage_reads: 0,
        cpu_ns: super::caller_and_engine_cpu_ns().saturating_sub(cpu0),
        prefetch_ns: 0,
        gather_ns: 0,
    })
}

/// Issues the advice an MMAP handle's worker keeps for when it is idle (`run_on_worker` issues it
/// first), then waits for those reads of the step's `run.unique_pages` pages: 1 ms + 10 µs a
/// page, longer than they take at the device's depth (100k IOPS and more). The advice's reads
/// are the step's: they are added to `run`.
fn settle(p: &Pipeline, run: &mut Run) -> Result<()> {
    let c0 = p.counters();
    p.run_on_worker(|_, _| ())?;
    let d = p.counters().delta(&c0);
    run.read_bytes += d.storage_read_bytes;
    run.storage_reads += d.storage_reads;
    run.pages_prefetched += d.pages_prefetched;
    let pages = run.unique_pages;
    std::thread::sleep(std::time::Duration::from_micros(1000 + 10 * pages));
    Ok(())
}

/// A second read-only mapping of the row file with `advice`.
fn map_with(p: &Pipeline, advice: memmap2::Advice) -> Result<memmap2::Mmap> {
    // SAFETY: a read-only shared mapping of the table's row file, which no one in this process
    // writes; the bench only reads it.
    let m = unsafe { memmap2::MmapOptions::new().map(p.table().file()) }
        .map_err(|e| Error::io("mmap (baseline)", e))?;
    m.advise(advice)
        .map_err(|e| Error::io("madvise (baseline)", e))?;
    Ok(m)
}

/// The handles and mappings the cold phase compares.
struct Modes<'a> {
    never: Pipeline,
    /// MMAP with WILLNEED advice and a faulting gather for decode steps too (no io_uring reads).
    willneed: Pipeline,
    direct: Option<Pipeline>,
    /// The DIRECT reader alone (f), where DIRECT opens.
    reader: Option<std::cell::RefCell<DirectReader>>,
    normal: memmap2::Mmap,
    seed: memmap2::Mmap,
    p: &'a Pipeline,
}

impl Modes<'_> {
    fn maps(&self) -> Vec<&[u8]> {
        let mut m = vec![
            self.p.table().bytes(),
            self.never.table().bytes(),
            self.willneed.table().bytes(),
            &self.normal[..],
            &self.seed[..],
        ];
        m.extend(self.direct.as_ref().map(|d| d.table().bytes()));
        m
    }
}

fn open_modes<'a>(ctx: &'a Ctx, c: &mut Cold) -> Result<Modes<'a>> {
    let with = |f: &dyn Fn(&mut ple_core::step::OpenOptions)| {
        let mut o = ctx.opts.clone();
        f(&mut o);
        Pipeline::open(ctx.a.dir(), o)
    };
    let direct = match with(&|o| o.io_mode = IoMode::Direct) {
        Ok(d) => {
            c.direct = Ok(d.io_info().backend.map_or("?", |b| b.name()).to_string());
            Some(d)
        }
        Err(e) => {
            c.direct = Err(e.to_string());
            None
        }
    };
    let t = ctx.p.table();
    let reader = DirectReader::open(t.rows_path(), t.row_bytes(), false).ok();
    Ok(Modes {
        reader: reader.map(std::cell::RefCell::new),
        never: with(&|o| o.prefetch_policy = PrefetchPolicy::Never)?,
        willneed: with(&|o| o.cold_reads = ple_core::step::ColdReads::Willneed)?,
        direct,
        normal: map_with(&ctx.p, memmap2::Advice::Normal)?,
        seed: map_with(&ctx.p, memmap2::Advice::Random)?,
        p: &ctx.p,
    })
}

pub(crate) fn run(ctx: &Ctx) -> Result<Cold> {
    let mut c = Cold::default();
    let m = open_modes(ctx, &mut c)?;
    cold_chunks(ctx, &m, &mut c)?;
    cold_decode(ctx, &m, &mut c)?;
    // (a) and (b) on decode 8x1, after a global eviction each
    let (maps, file) = (m.maps(), ctx.p.table().file());
    let i = ctx.shape("decode 8x1");
    let n = ctx.sc(20).min(ctx.steps[i].len());
    let r = evict(&maps, file);
    let mut seq = 1_000_000;
    c.runs.push(run_steps(
        &m.never,
        &ctx.steps[i][..n],
        &mut seq,
        "decode 8x1",
        OFF,
        r,
    )?);
    let r = evict(&maps, file);
    let ids = &ctx.ids[i][..ctx.sc(3).min(n)];
    c.runs
        .push(readahead_run(ctx, &m.normal, "decode 8x1", ids, r)?);
    drop(m);
    c.cpu_split = super::cpu_split::measure(ctx, ctx.a.scale.clamp(0.2, 1.0))?;
    Ok(c)
}

/// Prefill chunks, each after a global eviction: MMAP (prefetch) and DIRECT; one with prefetch
/// off.
fn cold_chunks(ctx: &Ctx, m: &Modes, c: &mut Cold) -> Result<()> {
    let (maps, file) = (m.maps(), ctx.p.table().file());
    let chunk = ctx.shapes[0].name.clone();
    let mut seq = ctx.seq.get();
    let mut seq_d = 0;
    for (k, st) in ctx.steps[0].iter().take(ctx.sc(3)).enumerate() {
        let one = std::slice::from_ref(st);
        let r = evict(&maps, file);
        c.fully_evicted &= r == 0;
        c.runs.push(run_steps(m.p, one, &mut seq, &chunk, MMAP, r)?);
        c.chunk_pages
            .push(PageSet::from_rows(&ctx.ids[0][k], ctx.rb).len() as u64);
        if let Some(d) = &m.direct {
            let r = evict(&maps, file);
            // the floor beside the chunk: as many random reads as it has distinct rows, right
            // before and right after it
            let mut rows = ctx.ids[0][k].clone();
            rows.sort_unstable();
            rows.dedup();
            let reads = rows.len();
            let probe = || {
                super::floor::qd64_iops(
                    ctx.p.table().rows_path(),
                    ctx.file_bytes,
                    ctx.block as u32,
                    reads,
                )
            };
            let before = probe();
            c.runs
                .push(run_steps(d, one, &mut seq_d, &chunk, DIRECT, r)?);
            let after = probe();
            c.chunk_floor_iops
                .push(before.into_iter().chain(after).reduce(f64::max));
            let f = sector_floor_bytes(&ctx.ids[0][k..k + 1], ctx.rb as u64, ctx.block);
            c.sector_floor.push((chunk.clone(), f));
        }
    }
    ctx.seq.set(seq);
    let r = evict(&maps, file);
    let mut seq_n = 0;
    c.runs.push(run_steps(
        &m.never,
        &ctx.steps[0][..1],
        &mut seq_n,
        &chunk,
        OFF,
        r,
    )?);
    Ok(())
}

/// Cold decode, paired: per shape, step j of every mode runs back to back (rotating which goes
/// first), each on its own steps (mode k takes steps k, k + 4, …: no mode reads rows another just
/// read, so no cache below the page cache favours it) and each right after the pages of its rows
/// were evicted. Drift of a shared device then moves every mode alike. After each MMAP step, the
/// page advice its worker would issue when idle is issued and given time to be read
/// ([`settle`]): it must not run beside the next mode's step.
fn cold_decode(ctx: &Ctx, m: &Modes, c: &mut Cold) -> Result<()> {
    let (maps, file) = (m.maps(), ctx.p.table().file());
    const NM: usize = 5; // MMAP, seed, DIRECT, MMAP with WILLNEED + gather, DIRECT reader alone
    let mut seqs = [ctx.seq.get(), 0, 2_000_000, 3_000_000, 0];
    for (name, n) in COLD_DECODE {
        let i = ctx.shape(name);
        let n = ctx.sc(n).min(ctx.steps[i].len() / NM);
        let mut acc: [Option<Run>; NM] = Default::default();
        for j in 0..n {
            for r in 0..NM {
                let k = (j + r) % NM;
                let s = j * NM + k;
                let (st, ids) = (&ctx.steps[i][s..s + 1], &ctx.ids[i][s..s + 1]);
                let res = evict_rows(&maps, file, &ids[0], ctx.rb);
                c.fully_evicted &= res == 0;
                let run = match k {
                    0 => {
                        let mut run = run_steps(m.p, st, &mut seqs[0], name, MMAP, res)?;
                        settle(m.p, &mut run)?;
                        run
                    }
                    1 => seed_method(ctx, &m.seed, file.as_raw_fd(), name, ids, res)?,
                    2 => match &m.direct {
                        Some(d) => {
                            let f = sector_floor_bytes(ids, ctx.rb as u64, ctx.block);
                            c.sector_floor.push((name.to_string(), f));
                            run_steps(d, st, &mut seqs[2], name, DIRECT, res)?
                        }
                        None => continue,
                    },
                    3 => run_steps(&m.willneed, st, &mut seqs[3], name, MMAP_WILLNEED, res)?,
                    _ => match &m.reader {
                        Some(r) => bare_reader(r, ctx.rb, name, ids, res)?,
                        None => continue,
                    },
                };
                accumulate(&mut acc[k], run);
            }
        }
        c.runs.extend(acc.into_iter().flatten());
    }
    ctx.seq.set(seqs[0]);
    Ok(())
}

/// (b): gathers of `ids` from a MADV_NORMAL mapping (default readahead), for read amplification.
fn readahead_run(ctx: &Ctx, normal: &[u8], name: &str, ids: &[Vec<u64>], res: u64) -> Result<Run> {
    let io0 = stats::process_read_bytes().unwrap_or(0);
    let cpu0 = super::caller_and_engine_cpu_ns();
    stats::thread_read_bytes_delta(); // this thread's reads so far are not the run's
    let (r, mut io) = stats::measure(true, || time_gathers(normal, ctx.rb, ids, ctx.p.pool()));
    let (lat, pool_io) = r?;
    io.add(pool_io);
    baseline_run(name, NORMAL, ids, lat, io, (io0, cpu0, res))
}
