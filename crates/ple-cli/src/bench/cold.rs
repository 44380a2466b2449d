//! Cold steps (page cache evicted before each run), in both I/O modes on the same steps, beside
//! the baselines: (a) prefetch off, (b) MADV_NORMAL readahead, (e) the seed deployment's method.

use super::Ctx;
use super::memory::evict;
use super::steps::{Run, accumulate, run_steps, time_gathers};
use ple_core::error::{Error, Result};
use ple_core::io::prefetch::PageSet;
use ple_core::stats;
use ple_core::step::{IoMode, Pipeline, PrefetchPolicy};
use serde_json::{Value, json};
use std::os::fd::AsRawFd;
use std::time::Instant;

/// Cold decode shapes compared across modes and with the seed's method, and their step counts
/// per round.
pub(crate) const COLD_DECODE: [(&str, usize); 4] = [
    ("decode 1x1", 20),
    ("decode 8x1", 20),
    ("decode 64x1", 10),
    ("decode 256x1", 4),
];
/// Rounds of the cold decode comparison: each round runs every shape in every mode, one after
/// the other, so a drifting device (shared network storage) moves all of them alike.
const ROUNDS: usize = 3;

pub(crate) const MMAP: &str = "cold MMAP";
pub(crate) const MMAP_FADVISE: &str = "cold MMAP, WILLNEED prefetch";
pub(crate) const DIRECT: &str = "cold DIRECT";
pub(crate) const SEED: &str = "cold, seed method (e)";
pub(crate) const OFF: &str = "cold MMAP, prefetch off (a)";
pub(crate) const NORMAL: &str = "cold, MADV_NORMAL readahead (b)";

/// What the cold phase measured.
pub(crate) struct Cold {
    pub(crate) runs: Vec<Run>,
    /// Per cold MMAP prefill chunk: its distinct 4 KiB pages.
    pub(crate) chunk_pages: Vec<u64>,
    /// Per DIRECT run (shape, mode): the sector floor of its rows, bytes (each distinct row's
    /// 512 B blocks).
    pub(crate) sector_floor: Vec<(String, u64)>,
    /// DIRECT's backend, or why DIRECT could not run.
    pub(crate) direct: std::result::Result<String, String>,
    pub(crate) fully_evicted: bool,
}

impl Default for Cold {
    fn default() -> Self {
        Cold {
            runs: Vec::new(),
            chunk_pages: Vec::new(),
            sector_floor: Vec::new(),
            direct: Err("not run".into()),
            fully_evicted: true,
        }
    }
}

impl Cold {
    pub(crate) fn json(&self) -> Value {
        json!({
            "runs": self.runs.iter().map(|r| r.json()).collect::<Vec<_>>(),
            "chunk_unique_pages": self.chunk_pages,
            "direct_sector_floor_bytes": self.sector_floor.iter()
                .map(|(s, b)| json!({"shape": s, "bytes": b})).collect::<Vec<_>>(),
            "direct": match &self.direct { Ok(b) => json!({"backend": b}),
                                          Err(e) => json!({"unavailable": e}) },
            "fully_evicted": self.fully_evicted,
        })
    }
    pub(crate) fn find(&self, shape: &str, mode: &str) -> Option<&Run> {
        self.runs
            .iter()
            .find(|r| r.shape == shape && r.mode == mode)
    }
}

/// The sector floor of `steps`' rows: per step, every distinct row's 512 B blocks.
fn sector_floor_bytes(steps: &[Vec<u64>], rb: u64) -> u64 {
    let mut total = 0;
    for v in steps {
        let mut u = v.clone();
        u.sort_unstable();
        u.dedup();
        total += u
            .iter()
            .map(|&r| ((r * rb + rb - 1) / 512 - r * rb / 512 + 1) * 512)
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
    let cpu0 = ple_core::sys::process_cpu_ns();
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
    let lat = lat?;
    let tokens = (ids.iter().map(|v| v.len()).sum::<usize>() / 16) as u64;
    Ok(Run {
        shape: shape.into(),
        mode: SEED,
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
        cpu_ns: ple_core::sys::process_cpu_ns().saturating_sub(cpu0),
        prefetch_ns: 0,
        gather_ns: 0,
    })
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

pub(crate) fn run(ctx: &Ctx) -> Result<Cold> {
    let mut c = Cold::default();
    let p = &ctx.p;
    let never = Pipeline::open(
        &ctx.a.table_dir,
        ple_core::step::OpenOptions {
            prefetch_policy: PrefetchPolicy::Never,
            ..ctx.opts.clone()
        },
    )?;
    let direct = match Pipeline::open(
        &ctx.a.table_dir,
        ple_core::step::OpenOptions {
            io_mode: IoMode::Direct,
            ..ctx.opts.clone()
        },
    ) {
        Ok(d) => {
            let b = d.io_info().backend.map_or("?", |b| b.name());
            c.direct = Ok(b.to_string());
            Some(d)
        }
        Err(e) => {
            c.direct = Err(e.to_string());
            None
        }
    };
    let fadv = Pipeline::open(
        &ctx.a.table_dir,
        ple_core::step::OpenOptions {
            uring_prefetch: false,
            ..ctx.opts.clone()
        },
    )?;
    let normal = map_with(p, memmap2::Advice::Normal)?;
    let seed = map_with(p, memmap2::Advice::Random)?;
    let mut maps = vec![
        p.table().bytes(),
        never.table().bytes(),
        fadv.table().bytes(),
        &normal[..],
        &seed[..],
    ];
    if let Some(d) = &direct {
        maps.push(d.table().bytes());
    }
    let file = p.table().file();
    let ev = |c: &mut Cold| {
        let r = evict(&maps, file);
        c.fully_evicted &= r == 0;
        r
    };
    let (mut seq, mut seq_never, mut seq_direct, mut seq_fadv) = (ctx.seq.get(), 0, 0, 0);
    // prefill chunks, each after an eviction: MMAP (prefetch), DIRECT; one with prefetch off
    let chunk = ctx.shapes[0].name.clone();
    let n_cold = ctx.sc(3).min(ctx.steps[0].len());
    for (k, st) in ctx.steps[0].iter().take(n_cold).enumerate() {
        let one = std::slice::from_ref(st);
        let r = ev(&mut c);
        c.runs.push(run_steps(p, one, &mut seq, &chunk, MMAP, r)?);
        c.chunk_pages
            .push(PageSet::from_rows(&ctx.ids[0][k], ctx.rb).len() as u64);
        if let Some(d) = &direct {
            let r = ev(&mut c);
            c.runs
                .push(run_steps(d, one, &mut seq_direct, &chunk, DIRECT, r)?);
            c.sector_floor.push((
                chunk.clone(),
                sector_floor_bytes(&ctx.ids[0][k..k + 1], ctx.rb as u64),
            ));
        }
    }
    let r = ev(&mut c);
    c.runs.push(run_steps(
        &never,
        &ctx.steps[0][..1],
        &mut seq_never,
        &chunk,
        OFF,
        r,
    )?);
    // decode: per round and shape, evict, then a run of steps, in each mode and the seed's method
    let mut acc: Vec<Option<Run>> = vec![None; COLD_DECODE.len() * 4];
    for _ in 0..ctx.sc(ROUNDS) {
        for (k, (name, n)) in COLD_DECODE.into_iter().enumerate() {
            let i = ctx.shape(name);
            let n = ctx.sc(n).min(ctx.steps[i].len());
            let steps = &ctx.steps[i][..n];
            let r = ev(&mut c);
            let m = run_steps(p, steps, &mut seq, name, MMAP, r)?;
            accumulate(&mut acc[4 * k], m);
            let r = ev(&mut c);
            let s = seed_method(ctx, &seed, file.as_raw_fd(), name, &ctx.ids[i][..n], r)?;
            accumulate(&mut acc[4 * k + 1], s);
            let r = ev(&mut c);
            let f = run_steps(&fadv, steps, &mut seq_fadv, name, MMAP_FADVISE, r)?;
            accumulate(&mut acc[4 * k + 3], f);
            if let Some(d) = &direct {
                let r = ev(&mut c);
                let run = run_steps(d, steps, &mut seq_direct, name, DIRECT, r)?;
                accumulate(&mut acc[4 * k + 2], run);
                let f = sector_floor_bytes(&ctx.ids[i][..n], ctx.rb as u64);
                c.sector_floor.push((name.to_string(), f));
            }
        }
    }
    c.runs.extend(acc.into_iter().flatten());
    let i = ctx.shape("decode 8x1");
    let n = ctx.sc(20).min(ctx.steps[i].len());
    let r = ev(&mut c);
    c.runs.push(run_steps(
        &never,
        &ctx.steps[i][..n],
        &mut seq_never,
        "decode 8x1",
        OFF,
        r,
    )?);
    let r = ev(&mut c);
    let ids = &ctx.ids[i][..ctx.sc(3).min(n)];
    c.runs
        .push(readahead_run(ctx, &normal, "decode 8x1", ids, r)?);
    ctx.seq.set(seq);
    Ok(c)
}

/// (b): gathers of `ids` from a MADV_NORMAL mapping (default readahead), for read amplification.
fn readahead_run(ctx: &Ctx, normal: &[u8], name: &str, ids: &[Vec<u64>], res: u64) -> Result<Run> {
    let io0 = stats::process_read_bytes().unwrap_or(0);
    let cpu0 = ple_core::sys::process_cpu_ns();
    stats::thread_read_bytes_delta(); // this thread's reads so far are not the run's
    let (r, mut io) = stats::measure(true, || time_gathers(normal, ctx.rb, ids, ctx.p.pool()));
    let (lat, pool_io) = r?;
    io.add(pool_io);
    let tokens = (ids.iter().map(|v| v.len()).sum::<usize>() / 16) as u64;
    Ok(Run {
        shape: name.into(),
        mode: NORMAL,
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
        cpu_ns: ple_core::sys::process_cpu_ns().saturating_sub(cpu0),
        prefetch_ns: 0,
        gather_ns: 0,
    })
}
