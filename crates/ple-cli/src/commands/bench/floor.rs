//! The storage floor: random `O_DIRECT` reads of the table's row file through io_uring at
//! queue depth 1, 64 and 128, of 512 B and 4 KiB (each the faster of a run before and a run after
//! fio's); the ring set-ups DIRECT could use, measured at 512 B / QD 64; and fio's figures on the
//! same file and size and depth (io_uring engine, 3 s), where `fio` is installed. Each also
//! gives its CPU time per read (the probe's thread; fio's usr + sys): the kernel's share of a
//! read, which no reader of the device can go below.

use ple_core::io::buf::AlignedBuf;
use ple_core::io::uring::{ReadReq, Ring, RingSetup};
use serde_json::{Value, json};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

/// One floor measurement.
#[derive(Clone, Debug)]
pub(crate) struct Probe {
    pub(crate) name: String,
    pub(crate) bs: u32,
    pub(crate) qd: usize,
    /// Reads per second (None: the set-up is unavailable here).
    pub(crate) iops: Option<f64>,
    /// Mean time per read at this depth, µs (at QD 1: the read latency).
    pub(crate) lat_us: Option<f64>,
    /// CPU time of the probing thread per read, µs.
    pub(crate) cpu_us: Option<f64>,
    /// fio's figure for the same read size and depth (io_uring engine).
    pub(crate) fio: Option<Fio>,
}

/// What one fio run measured.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fio {
    pub(crate) iops: f64,
    /// Mean completion latency, µs.
    pub(crate) lat_us: f64,
    /// (usr + sys) CPU per read, µs.
    pub(crate) cpu_us: f64,
}

/// The floors of one run.
#[derive(Clone, Debug, Default)]
pub(crate) struct Floor {
    pub(crate) probes: Vec<Probe>,
    pub(crate) setups: Vec<Probe>,
    /// The smallest read probed: the row file's direct-I/O block (what a DIRECT row read is).
    pub(crate) block: u32,
}

impl Floor {
    /// IOPS of `bs`-byte reads at depth `qd` (plain ring).
    pub(crate) fn iops(&self, bs: u32, qd: usize) -> Option<f64> {
        self.find(bs, qd).and_then(|p| p.iops)
    }
    /// Mean read latency of `bs`-byte reads at depth 1, ms.
    pub(crate) fn qd1_ms(&self, bs: u32) -> Option<f64> {
        self.find(bs, 1).and_then(|p| p.lat_us).map(|u| u / 1e3)
    }
    /// CPU µs per read of `bs`-byte reads at depth `qd`: the probe's, and fio's.
    pub(crate) fn cpu_us(&self, bs: u32, qd: usize) -> (Option<f64>, Option<f64>) {
        self.find(bs, qd)
            .map_or((None, None), |p| (p.cpu_us, p.fio.map(|f| f.cpu_us)))
    }
    fn find(&self, bs: u32, qd: usize) -> Option<&Probe> {
        self.probes.iter().find(|p| p.bs == bs && p.qd == qd)
    }

    pub(crate) fn print(&self) {
        println!(
            "storage floor: random O_DIRECT reads of the row file through io_uring (fio beside, \
             io_uring engine, same file, same size and depth):"
        );
        let f = |x: Option<f64>, d: usize| x.map_or("n/a".into(), |x| format!("{x:.d$}"));
        for p in self.probes.iter().chain(&self.setups) {
            println!(
                "  {:<30} {:>5} B QD{:<4} {:>8} IOPS {:>7} µs/read {:>5} µs CPU/read   fio {:>8} IOPS {:>7} µs {:>5} µs CPU/read",
                p.name,
                p.bs,
                p.qd,
                f(p.iops, 0),
                f(p.lat_us, 1),
                f(p.cpu_us, 2),
                f(p.fio.map(|x| x.iops), 0),
                f(p.fio.map(|x| x.lat_us), 1),
                f(p.fio.map(|x| x.cpu_us), 2),
            );
        }
    }

    pub(crate) fn json(&self) -> Value {
        let j = |p: &Probe| {
            json!({"name": p.name, "bs": p.bs, "qd": p.qd, "iops": p.iops, "lat_us": p.lat_us,
                   "cpu_us_per_read": p.cpu_us,
                   "fio_iops": p.fio.map(|x| x.iops), "fio_lat_us": p.fio.map(|x| x.lat_us),
                   "fio_cpu_us_per_read": p.fio.map(|x| x.cpu_us)})
        };
        json!({"probes": self.probes.iter().map(j).collect::<Vec<_>>(),
               "ring_setups": self.setups.iter().map(j).collect::<Vec<_>>()})
    }
}

/// Random reads of `bs` at depth `qd` through a ring set up as `setup` → (IOPS, mean µs per
/// read in flight, CPU µs per read). None where the set-up fails here.
fn uring_iops(
    path: &Path,
    size: u64,
    bs: u32,
    qd: usize,
    reads: usize,
    setup: RingSetup,
) -> Option<(f64, f64, f64)> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()?;
    let mut ring = Ring::new(f.as_raw_fd(), qd, setup).ok()?;
    let mut buf = AlignedBuf::with_capacity(qd * bs as usize).ok()?;
    let blocks = size / bs as u64;
    let mut x = 0x5EED_u64 + bs as u64 + qd as u64;
    // each read in flight has its own slot of the buffer: read i uses slot i % qd
    let reqs: Vec<ReadReq> = (0..reads)
        .map(|i| {
            x = ple_core::model::splitmix64(x);
            ReadReq {
                off: (x % blocks) * bs as u64,
                buf_off: (i % qd) * bs as usize,
                len: bs,
            }
        })
        .collect();
    let mut res = Vec::new();
    // a short warm-up batch (ring and device queues), then the timed one
    ring.read_batch(&reqs[..qd.min(reqs.len())], &mut buf, &mut res)
        .ok()?;
    let (t, cpu0) = (Instant::now(), ple_core::sys::thread_cpu_ns());
    ring.read_batch(&reqs, &mut buf, &mut res).ok()?;
    let s = t.elapsed().as_secs_f64();
    let cpu_us = (ple_core::sys::thread_cpu_ns() - cpu0) as f64 / 1e3 / reads as f64;
    if res.iter().any(|&n| n != bs as i32) {
        return None;
    }
    let iops = reads as f64 / s;
    Some((iops, qd.min(reads) as f64 / iops * 1e6, cpu_us))
}

/// fio's random reads on `path` at `bs`/`qd` (io_uring, O_DIRECT, 3 s). None where fio is not
/// installed or fails.
fn fio(path: &Path, bs: u32, qd: usize) -> Option<Fio> {
    let out = std::process::Command::new("fio")
        .args([
            "--name=floor",
            "--readonly",
            "--direct=1",
            "--rw=randread",
            "--ioengine=io_uring",
            "--runtime=3",
            "--time_based",
            "--output-format=json",
        ])
        .arg(format!("--filename={}", path.display()))
        .arg(format!("--bs={bs}"))
        .arg(format!("--iodepth={qd}"))
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    let job = &v["jobs"][0];
    let r = &job["read"];
    let ios = r["total_ios"].as_f64()?.max(1.0);
    // usr_cpu and sys_cpu are percentages of the job's run time
    let cpu_s = (job["usr_cpu"].as_f64()? + job["sys_cpu"].as_f64()?) / 100.0
        * job["job_runtime"].as_f64()?
        / 1e3;
    Some(Fio {
        iops: r["iops"].as_f64()?,
        lat_us: r["lat_ns"]["mean"].as_f64()? / 1e3,
        cpu_us: cpu_s * 1e6 / ios,
    })
}

/// IOPS of `reads` random reads of `bs` at QD64 through DIRECT's ring set-up: a floor taken
/// beside one measured run (the device's speed drifts within seconds). None where it fails.
pub(crate) fn qd64_iops(path: &Path, size: u64, bs: u32, reads: usize) -> Option<f64> {
    uring_iops(path, size, bs, 64, reads.max(64), RingSetup::READS).map(|x| x.0)
}

/// Measures the floors on `path` (`size` bytes) with reads of `block` (the file's direct-I/O
/// block) and 4 KiB; `scale` scales the number of reads.
pub(crate) fn measure(path: &Path, size: u64, scale: f64, block: u32) -> Floor {
    let has_fio = std::process::Command::new("fio")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let n = |k: usize| ((k as f64 * scale) as usize).max(64);
    let mut fl = Floor {
        block,
        ..Default::default()
    };
    let sizes: &[u32] = if block < 4096 {
        &[block, 4096]
    } else {
        &[block]
    };
    for &bs in sizes {
        for qd in [1usize, 64, 128] {
            let reads = if qd == 1 { n(1500) } else { n(40_000) };
            // the faster of two runs, one before and one after fio's: the shared device's
            // speed drifts within seconds, and a floor is what the device can do
            let probe = || uring_iops(path, size, bs, qd, reads, RingSetup::READS);
            let a = probe();
            let fio = if has_fio { fio(path, bs, qd) } else { None };
            let r = match (a, probe()) {
                (Some(a), Some(b)) => Some(if a.0 >= b.0 { a } else { b }),
                (a, b) => a.or(b),
            };
            fl.probes.push(Probe {
                name: "io_uring (DIRECT's set-up)".into(),
                bs,
                qd,
                iops: r.map(|x| x.0),
                lat_us: r.map(|x| x.1),
                cpu_us: r.map(|x| x.2),
                fio,
            });
        }
    }
    // each set-up DIRECT could use, one flag at a time beside the plain ring
    let with = |f: fn(&mut RingSetup)| {
        let mut s = RingSetup::default();
        f(&mut s);
        s
    };
    let setups = [
        ("io_uring, plain", RingSetup::default()),
        ("io_uring, registered file", with(|s| s.fixed_file = true)),
        ("io_uring, registered buffer", with(|s| s.fixed_buf = true)),
        ("io_uring, COOP_TASKRUN", with(|s| s.coop_taskrun = true)),
        ("io_uring, DEFER_TASKRUN", with(|s| s.defer_taskrun = true)),
        ("io_uring, SQPOLL", with(|s| s.sqpoll = true)),
        ("io_uring, IOPOLL", with(|s| s.iopoll = true)),
    ];
    for (name, setup) in setups {
        let r = uring_iops(path, size, block, 64, n(40_000), setup);
        fl.setups.push(Probe {
            name: name.into(),
            bs: block,
            qd: 64,
            iops: r.map(|x| x.0),
            lat_us: r.map(|x| x.1),
            cpu_us: r.map(|x| x.2),
            fio: None,
        });
    }
    fl
}
