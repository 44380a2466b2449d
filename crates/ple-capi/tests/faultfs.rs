//! Failing storage under a handle, through `scripts/faultfs.py` (a FUSE passthrough that injects
//! EIO, short reads and stalls, switched while the test runs): every step either returns the rows
//! of a healthy handle on the real directory or a status; once the fault is cleared the same
//! steps succeed (nothing poisoned); a stalled step times out in `ple_wait` and then finishes;
//! `ple_close` returns within 100 ms while reads are stalled; open/fault/close cycles leak no
//! descriptors. Skipped (with a message) without /dev/fuse, fusermount3 or mfusepy, unless
//! `CI=true` and `PLE_FAULTFS_REQUIRED=1`, where that is a failure.

#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use ple::*;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const RB: usize = 90;
const HEADS: usize = 16;

/// Whether the test can run; panics when it cannot but is required.
fn available() -> bool {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/faultfs.py");
    let missing = if !Path::new("/dev/fuse").exists() {
        Some("/dev/fuse")
    } else if Command::new("fusermount3").arg("-V").output().is_err() {
        Some("fusermount3")
    } else if !Command::new("python3")
        .args(["-c", "import mfusepy"])
        .status()
        .is_ok_and(|s| s.success())
    {
        Some("the Python package mfusepy")
    } else if !script.exists() {
        Some("scripts/faultfs.py")
    } else {
        None
    };
    match missing {
        None => true,
        Some(m) => {
            let required = std::env::var("CI").is_ok_and(|v| v == "true")
                && std::env::var("PLE_FAULTFS_REQUIRED").is_ok_and(|v| v == "1");
            assert!(!required, "faultfs tests required but {m} is missing");
            eprintln!("faultfs tests skipped: {m} is missing");
            false
        }
    }
}

/// A mount of `src` through faultfs; unmounted on drop.
struct Fs {
    _base: tempfile::TempDir,
    mnt: PathBuf,
    ctl: PathBuf,
    child: Child,
    /// The control file's last modification time (faultfs.py reloads it when this changes).
    ctl_mtime: std::cell::Cell<std::time::SystemTime>,
}

fn mtime(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p).unwrap().modified().unwrap()
}

impl Fs {
    fn mount(src: &Path) -> Fs {
        let base = tempfile::tempdir().unwrap();
        let mnt = base.path().join("mnt");
        let ctl = base.path().join("ctl.json");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::write(&ctl, "{}").unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/faultfs.py");
        let child = Command::new("python3")
            .arg(script)
            .args([src, &mnt, &ctl])
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while !mnt.join("table.rows").exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "faultfs did not mount"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Fs {
            _base: base,
            mnt,
            ctl_mtime: std::cell::Cell::new(mtime(&ctl)),
            ctl,
            child,
        }
    }

    /// Sets the fault (JSON, see scripts/faultfs.py); `{}` clears it.
    ///
    /// faultfs.py sees a new spec by its file's modification time, which the kernel takes from a
    /// clock that advances a tick at a time (and later than that on a loaded VM): the new file is
    /// written again until its time differs from the last spec's, so no change goes unseen.
    fn set(&self, spec: &str) {
        let tmp = self.ctl.with_extension("new");
        loop {
            std::fs::write(&tmp, spec).unwrap();
            let m = mtime(&tmp);
            if m > self.ctl_mtime.get() {
                self.ctl_mtime.set(m);
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::fs::rename(&tmp, &self.ctl).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }

    fn dir(&self) -> CString {
        CString::new(self.mnt.to_str().unwrap()).unwrap()
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&self.mnt)
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one step of `n` tokens as `seq`; its status and (when OK) its rows.
fn step(h: *mut ple_handle, seq: u64, n: u32, req: u64, wait_us: u64) -> (ple_status, Vec<u8>) {
    let s = submit(h, seq, n, req);
    if s != PLE_OK {
        return (s, Vec::new());
    }
    // SAFETY: `h` is an open handle (looked up by libple).
    let st = unsafe { ple_wait(h, seq, wait_us) };
    let mut rows = Vec::new();
    if st == PLE_OK {
        let mut p: *const u8 = std::ptr::null();
        let mut got = 0u32;
        // SAFETY: out pointers are valid; the rows stay valid until the step is released.
        assert_eq!(unsafe { ple_packed_rows(h, seq, &mut p, &mut got) }, PLE_OK);
        assert_eq!(got, n);
        // SAFETY: ple_packed_rows gave `n × HEADS × RB` readable bytes at `p`.
        rows = unsafe { std::slice::from_raw_parts(p, n as usize * HEADS * RB) }.to_vec();
    }
    // SAFETY: as above.
    unsafe { ple_release_step(h, seq) };
    (st, rows)
}

fn close(h: *mut ple_handle) -> Duration {
    let t0 = Instant::now();
    // SAFETY: `h` came from ple_open and is closed once.
    unsafe { ple_close(h) };
    t0.elapsed()
}

/// The handles a mode opens: (name, options).
fn modes() -> Vec<(&'static str, ple_options)> {
    vec![
        (
            "mmap, cold reads",
            options(|o| {
                o.io_mode = PLE_IO_MMAP;
                o.cache_bytes = 0;
            }),
        ),
        (
            "mmap, gathered from the mapping",
            options(|o| {
                o.io_mode = PLE_IO_MMAP;
                o.prefetch_policy = PLE_PREFETCH_NEVER;
                o.cache_bytes = 0;
            }),
        ),
        (
            // every step's pages pass the cap: the ple-trim thread drops chunks while the
            // reads fail or stall
            "mmap, gathered, residency cap",
            options(|o| {
                o.io_mode = PLE_IO_MMAP;
                o.prefetch_policy = PLE_PREFETCH_NEVER;
                o.cache_bytes = 0;
                o.resident_bytes_max = 4096;
            }),
        ),
        (
            "direct",
            options(|o| {
                o.io_mode = PLE_IO_DIRECT;
                o.cache_bytes = 0;
            }),
        ),
        (
            "direct + row cache",
            options(|o| {
                o.io_mode = PLE_IO_DIRECT;
                o.cache_bytes = 1 << 20;
            }),
        ),
    ]
}

/// Opens `dir` with `o`, or None when the file system refuses the mode (DIRECT on FUSE).
fn try_open(dir: &CString, o: &ple_options) -> Option<*mut ple_handle> {
    let mut h = std::ptr::null_mut();
    // SAFETY: valid C string, options and out pointer.
    let s = unsafe { ple_open(dir.as_ptr(), o, &mut h) };
    if s == PLE_E_UNSUPPORTED {
        eprintln!("faultfs: mode refused on FUSE: {}", last_error());
        return None;
    }
    assert_eq!(s, PLE_OK, "{}", last_error());
    Some(h)
}

#[test]
fn faults_give_a_status_or_the_healthy_rows_and_clearing_them_heals_every_step() {
    if !available() {
        return;
    }
    let (d, real) = table();
    let healthy = open(&real, &options(|o| o.cache_bytes = 0));
    let sizes = [1u32, 7, 64];
    let mut want = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        let (s, rows) = step(healthy, k as u64 + 1, n, 1000 * k as u64, 20_000_000);
        assert_eq!(s, PLE_OK);
        want.push(rows);
    }
    close(healthy);
    let len = std::fs::metadata(d.path().join("table.rows"))
        .unwrap()
        .len();
    let faults = [
        format!(r#"{{"eio": [[0, {len}]]}}"#),
        format!(r#"{{"eio": [[{}, {len}]]}}"#, len / 2),
        r#"{"short": true}"#.to_string(),
    ];
    for (name, o) in modes() {
        for f in &faults {
            // to FUSE a short buffered read is the end of the file: the kernel shrinks the
            // cached size and zero-fills the page (its page cache is then wrong until the file
            // is reopened), which no block device does; short reads are a DIRECT-mode fault
            if f.contains("short") && o.io_mode == PLE_IO_MMAP {
                continue;
            }
            // a fresh mount per case: no page of the row file is cached yet
            let fs = Fs::mount(d.path());
            let Some(h) = try_open(&fs.dir(), &o) else {
                continue;
            };
            fs.set(f);
            let mut seq = 0;
            let mut failed = Vec::new();
            for (k, &n) in sizes.iter().enumerate() {
                seq += 1;
                let (s, rows) = step(h, seq, n, 1000 * k as u64, 20_000_000);
                match s {
                    PLE_OK => assert!(rows == want[k], "{name}, {f}: step of {n} rows differs"),
                    PLE_E_IO => failed.push(k),
                    s => panic!("{name}, {f}: step of {n}: status {s}: {}", last_error()),
                }
            }
            fs.set("{}");
            for (k, &n) in sizes.iter().enumerate() {
                seq += 1;
                let (s, rows) = step(h, seq, n, 1000 * k as u64, 20_000_000);
                assert_eq!(s, PLE_OK, "{name}, {f}: after clearing: {}", last_error());
                assert!(
                    rows == want[k],
                    "{name}, {f}: step of {n} rows differs after clearing"
                );
            }
            eprintln!(
                "faultfs: {name}, {f}: {} of {} steps failed",
                failed.len(),
                sizes.len()
            );
            close(h);
        }
    }
}

#[test]
fn a_stalled_step_times_out_then_finishes_and_close_is_bounded() {
    if !available() {
        return;
    }
    let (d, _real) = table();
    for (name, o) in modes() {
        let fs = Fs::mount(d.path());
        let Some(h) = try_open(&fs.dir(), &o) else {
            continue;
        };
        fs.set(r#"{"stall_ms": 1500}"#);
        assert_eq!(submit(h, 1, 1, 1), PLE_OK);
        // SAFETY: `h` is open.
        let st = unsafe { ple_wait(h, 1, 200_000) };
        assert_eq!(
            st, PLE_E_TIMEOUT,
            "{name}: the stalled step did not time out"
        );
        // SAFETY: as above.
        let st = unsafe { ple_wait(h, 1, 30_000_000) };
        assert_eq!(st, PLE_OK, "{name}: {}", last_error());
        // SAFETY: as above.
        unsafe { ple_release_step(h, 1) };
        // a new step stalls: close while its reads are in flight
        assert_eq!(submit(h, 2, 4, 100), PLE_OK);
        std::thread::sleep(Duration::from_millis(100));
        let took = close(h);
        eprintln!("faultfs: {name}: close with a stalled step took {took:?}");
        assert!(
            took < Duration::from_millis(100),
            "{name}: close took {took:?}"
        );
        fs.set("{}");
    }
}

#[test]
fn close_is_bounded_while_a_read_ahead_is_stalled() {
    if !available() {
        return;
    }
    let (d, _real) = table();
    for (name, o) in modes() {
        let o = ple_options {
            cache_bytes: o.cache_bytes.max(1 << 20),
            ..o
        };
        let fs = Fs::mount(d.path());
        let Some(h) = try_open(&fs.dir(), &o) else {
            continue;
        };
        fs.set(r#"{"stall_ms": 1500}"#);
        // the reader thread's reads stall; no step is in flight
        assert_eq!(prefetch_ahead(h, 64, 500), PLE_OK, "{}", last_error());
        std::thread::sleep(Duration::from_millis(100));
        let took = close(h);
        eprintln!("faultfs: {name}, read-ahead stalled: close took {took:?}");
        assert!(
            took < Duration::from_millis(100),
            "{name}: close with a stalled read-ahead took {took:?}"
        );
        fs.set("{}");
    }
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_thousand_open_fault_close_cycles_leak_nothing() {
    if !available() {
        return;
    }
    let (d, _real) = table();
    let len = std::fs::metadata(d.path().join("table.rows"))
        .unwrap()
        .len();
    let fs = Fs::mount(d.path());
    let dir = fs.dir();
    let all = modes();
    let mut base = (0, 0);
    for i in 0..1000u64 {
        if i == 20 {
            base = (fd_count(), rss_kib());
        }
        let (_, o) = &all[i as usize % all.len()];
        let Some(h) = try_open(&dir, o) else {
            continue;
        };
        fs.set(&format!(r#"{{"eio": [[0, {len}]]}}"#));
        let (s, _) = step(h, 1, 3, i * 10, 20_000_000);
        assert!(s == PLE_OK || s == PLE_E_IO, "cycle {i}: status {s}");
        fs.set("{}");
        close(h);
    }
    let (fds, rss) = (fd_count(), rss_kib());
    eprintln!(
        "faultfs: after 1000 cycles: {fds} fds (at cycle 20: {}), RSS {rss} KiB (at cycle 20: {} \
         KiB)",
        base.0, base.1
    );
    assert!(fds <= base.0, "descriptors leaked: {} then {fds}", base.0);
    assert!(
        rss < base.1 + 64 * 1024,
        "RSS grew from {} to {rss} KiB",
        base.1
    );
}
