//! Packing through the binary and the C API: disk full, SIGKILL mid-pack, `ple pack`/`ple inspect`,
//! table info, `ple_pack` with cancellation.

mod common;

use common::*;
use ple_core::format::fingerprint::fingerprint;
use ple_core::format::pack::PackOptions;
use ple_core::model::RowFormat;
use ple_testkit::synth::{self, CheckpointSpec, write_checkpoint};
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};

// ---------------------------------------------------------------------------------------------
// The binary: disk full, SIGKILL mid-pack, inspect.
// ---------------------------------------------------------------------------------------------

/// Runs `ple pack ck out [extra]` with RLIMIT_FSIZE = `limit` bytes and SIGXFSZ ignored.
fn pack_with_fsize_limit(
    ck: &Path,
    out: &Path,
    limit: u64,
    extra: &[&str],
) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(PLE);
    c.arg("pack").arg(ck).arg(out).args(extra);
    // SAFETY: the closure runs in the forked child before exec and calls only setrlimit and
    // signal, which are async-signal-safe; it allocates nothing and touches no shared state.
    unsafe {
        c.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    c.output().unwrap()
}

#[test]
fn disk_full_fails_cleanly_and_a_rerun_succeeds() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    let info = write_checkpoint(&ck, &spec(RowFormat::Nvfp4, 9)).unwrap();
    for extra in [
        &[][..],
        &["--no-preallocate", "--buffer-bytes", "65536"][..],
    ] {
        let out = d.path().join(format!("out{}", extra.len()));
        let o = pack_with_fsize_limit(&ck, &out, info.table_bytes / 2, extra);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "pack succeeded under a file size limit"
        );
        assert!(
            err.contains("File too large") || err.contains("os error 27"),
            "unclear error: {err}"
        );
        assert!(
            err.contains(".table.rows.tmp-"),
            "error does not name the file: {err}"
        );
        assert_nothing_opens(&out);
        let o = Command::new(PLE)
            .arg("pack")
            .arg(&ck)
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_rows(&open(&out).unwrap(), 9, RowFormat::Nvfp4);
    }
}

#[test]
fn killed_mid_pack_leaves_no_table_and_a_rerun_succeeds() {
    use std::os::fd::AsRawFd;
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    let mut s = CheckpointSpec::new(RowFormat::Nvfp4, 8000, 8, 21);
    s.shards_per_file = 3;
    let info = write_checkpoint(&ck, &s).unwrap();
    let out = d.path().join("out");
    // Progress lines go to a pipe we stop reading: once it is full the packer blocks in the
    // middle of the table, so the kill lands mid-pack deterministically. The pipe is shrunk
    // before the packer starts (shrinking one that already holds more fails with EBUSY).
    let (stderr, to_child) = std::io::pipe().unwrap();
    // SAFETY: fcntl on a pipe descriptor this test owns; no memory is passed.
    let sz = unsafe { libc::fcntl(stderr.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
    assert!(sz > 0, "F_SETPIPE_SZ: {}", std::io::Error::last_os_error());
    let mut child = Command::new(PLE)
        .args(["pack", "--progress-lines", "--buffer-bytes", "4096"])
        .arg(&ck)
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(to_child)
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(stderr).lines();
    loop {
        let l = lines.next().expect("packer ended early").unwrap();
        if let Some(rest) = l.strip_prefix("progress ") {
            let done: u64 = rest.split(' ').next().unwrap().parse().unwrap();
            if done > 0 {
                assert!(done < info.table_bytes);
                break;
            }
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the packer finished before the kill"
    );
    assert!(
        !temp_files(&out).is_empty(),
        "no temporary file while packing"
    );
    // SAFETY: kill takes a pid and a signal, no memory; the child has not been waited for, so
    // its pid cannot have been reused.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    drop(lines);
    assert!(open(&out).is_err(), "a killed pack left a table that opens");
    assert!(!out.join("table.json").exists());

    let o = Command::new(PLE)
        .arg("pack")
        .arg(&ck)
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("reused: no"));
    assert!(
        temp_files(&out).is_empty(),
        "stale temporary files: {:?}",
        temp_files(&out)
    );
    assert_rows(&open(&out).unwrap(), 21, RowFormat::Nvfp4);
}

#[test]
fn cli_pack_and_inspect() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    let o = Command::new(PLE)
        .args([
            "synth-checkpoint",
            "--format",
            "fp8",
            "--base",
            "1000",
            "--shards",
            "4",
            "--seed",
            "8",
        ])
        .arg(&ck)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = d.path().join("t");
    let o = Command::new(PLE)
        .arg("pack")
        .arg(&ck)
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line = String::from_utf8_lossy(&o.stdout);
    let t = open(&out).unwrap();
    assert!(
        line.contains(&format!("{} rows", t.meta().total_rows)),
        "{line}"
    );
    assert!(
        line.contains("reused: no") && line.contains("MB/s"),
        "{line}"
    );
    assert_rows(&t, 8, RowFormat::Fp8);
    let o = Command::new(PLE)
        .arg("pack")
        .arg(&ck)
        .arg(&out)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("reused: yes"));

    let o = Command::new(PLE).arg("inspect").arg(&out).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(
        text.contains("fp8") && text.contains("valid:        yes"),
        "{text}"
    );
    let o = Command::new(PLE)
        .args(["inspect", "--json"])
        .arg(&out)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["meta"]["total_rows"], t.meta().total_rows);
    assert_eq!(v["meta"]["source"]["name"], "ck");
    let o = Command::new(PLE)
        .args(["inspect", "--checkpoint"])
        .arg(&ck)
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success());

    // heads_per_ngram = 2^31 + 8, whose head count (3 - 1) × h wraps to 16 in 32 bits: invalid
    let meta_path = out.join("table.json");
    let good = std::fs::read_to_string(&meta_path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
    v["heads_per_ngram"] = serde_json::json!(2147483656u64);
    v["hash"]["heads_per_ngram"] = serde_json::json!(2147483656u64);
    std::fs::write(&meta_path, v.to_string()).unwrap();
    let o = Command::new(PLE).arg("inspect").arg(&out).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("valid:        no"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("heads_per_ngram"));
    std::fs::write(&meta_path, good).unwrap();

    // invalid table: non-zero exit, the error on stderr
    std::fs::OpenOptions::new()
        .write(true)
        .open(out.join("table.rows"))
        .unwrap()
        .set_len(100)
        .unwrap();
    let o = Command::new(PLE).arg("inspect").arg(&out).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("valid:        no"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("file size"));
    let o = Command::new(PLE)
        .args(["inspect", "--json"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert!(v["error"].as_str().unwrap().contains("file size"));

    // pack errors exit non-zero with the message
    let o = Command::new(PLE)
        .arg("pack")
        .arg(d.path().join("none"))
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("none"));
}

#[test]
fn table_info_reports_the_table() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    let info = write_checkpoint(&ck, &spec(RowFormat::Nvfp4, 3)).unwrap();
    let out = d.path().join("t");
    pack_quiet(&ck, &out, &PackOptions::default()).unwrap();
    let t = open(&out).unwrap();
    let i = ple::info_to_c(&ple_core::format::table::table_info(&t));
    assert_eq!(i.struct_size, std::mem::size_of::<ple::ple_table_info>());
    assert_eq!(i.format, ple::PLE_FORMAT_NVFP4);
    assert_eq!(i.row_bytes, 90);
    assert_eq!(i.total_rows, info.total_rows);
    assert_eq!(i.addressed_rows, t.meta().hash.addressed_rows());
    assert_eq!((i.num_heads, i.head_dim, i.ngram_size), (16, 160, 3));
    assert_eq!((i.vocab_size, i.eos_token_id), (248_320, 248_044));
    assert_eq!(i.global_scale, synth::global_scale(RowFormat::Nvfp4));
    assert_eq!(i.file_size, info.table_bytes);
    assert_eq!(i.device_wait_supported, 0);
    // SAFETY: `info_to_c` writes NUL-terminated strings into these fixed arrays, which live in
    // `i` for the whole borrow (the same holds for the three CStr reads below).
    let name = unsafe { std::ffi::CStr::from_ptr(i.source_name.as_ptr()) };
    assert_eq!(name.to_str().unwrap(), "ck");
    // SAFETY: as above.
    let fp = unsafe { std::ffi::CStr::from_ptr(i.source_fingerprint.as_ptr()) };
    assert_eq!(fp.to_str().unwrap(), fingerprint(&ck).unwrap());

    // a long multi-byte name is truncated at a character boundary, NUL-terminated
    let long = "é".repeat(300);
    let ck2 = d.path().join(&long[..200]);
    write_checkpoint(&ck2, &spec(RowFormat::Bf16, 3)).unwrap();
    let out2 = d.path().join("t2");
    pack_quiet(&ck2, &out2, &PackOptions::default()).unwrap();
    let i = ple::info_to_c(&ple_core::format::table::table_info(&open(&out2).unwrap()));
    // SAFETY: as above.
    let name = unsafe { std::ffi::CStr::from_ptr(i.source_name.as_ptr()) };
    let s = name.to_str().expect("valid UTF-8 after truncation");
    assert!(s.len() <= 255 && s.chars().all(|c| c == 'é') && !s.is_empty());
}

extern "C" fn cancel_at_half(done: u64, total: u64, user: *mut std::ffi::c_void) -> i32 {
    // SAFETY: `user` is the `&mut calls` (a live u64) that `c_api_ple_pack` passes to ple_pack,
    // which calls this on the same thread while that borrow is alive.
    unsafe { *(user as *mut u64) += 1 };
    (done * 2 > total) as i32
}

#[test]
fn c_api_ple_pack() {
    use std::ffi::CString;
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    write_checkpoint(&ck, &spec(RowFormat::Fp8, 4)).unwrap();
    let out = d.path().join("t");
    let (c_ck, c_out) = (
        CString::new(ck.to_str().unwrap()).unwrap(),
        CString::new(out.to_str().unwrap()).unwrap(),
    );
    let mut o = std::mem::MaybeUninit::<ple::ple_pack_options>::uninit();
    // SAFETY: `o` is a valid place for one ple_pack_options, which the call fills completely.
    assert_eq!(unsafe { ple::ple_pack_options_default(o.as_mut_ptr()) }, 0);
    // SAFETY: filled by the successful call above.
    let mut o = unsafe { o.assume_init() };
    o.buffer_bytes = 16 << 10;
    let mut calls = 0u64;
    // SAFETY: both paths are NUL-terminated CStrings alive across the call, `o` is an
    // initialised options struct, and `user` points at `calls`, alive across the call (the
    // progress callback runs only during it).
    let st = unsafe {
        ple::ple_pack(
            c_ck.as_ptr(),
            c_out.as_ptr(),
            &o,
            Some(cancel_at_half),
            &mut calls as *mut u64 as *mut _,
        )
    };
    assert_eq!(st, ple::PLE_E_STATE);
    assert!(calls > 1);
    assert_nothing_opens(&out);
    // SAFETY: valid NUL-terminated paths; NULL options, callback and user data are allowed.
    let st = unsafe {
        ple::ple_pack(
            c_ck.as_ptr(),
            c_out.as_ptr(),
            std::ptr::null(),
            None,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: ple_last_error_message returns a NUL-terminated string valid until the next
    // libple call on this thread.
    let msg = unsafe { std::ffi::CStr::from_ptr(ple::ple_last_error_message()) };
    assert_eq!(st, 0, "{msg:?}");
    assert_rows(&open(&out).unwrap(), 4, RowFormat::Fp8);
    o.buffer_bytes = 1;
    // SAFETY: as the first call, without a callback.
    let st = unsafe {
        ple::ple_pack(
            c_ck.as_ptr(),
            c_out.as_ptr(),
            &o,
            None,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(st, ple::PLE_E_INVALID_ARGUMENT);
}
