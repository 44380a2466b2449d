//! Helpers shared by the CLI tests: synthetic checkpoints and tables, packing quietly, reading
//! and editing safetensors headers, and checks on what a pack leaves.
#![allow(
    dead_code,
    reason = "each test binary uses a different subset of the helpers"
)]

use ple_core::error::Error;
use ple_core::format::pack::{PackOptions, PackReport, pack};
use ple_core::format::safetensors as st;
use ple_core::format::table::{Table, TableOpenOptions};
use ple_core::model::RowFormat;
use ple_testkit::synth::{CheckpointSpec, expected_row, write_checkpoint};
use std::io::Write;
use std::path::{Path, PathBuf};

pub const PLE: &str = env!("CARGO_BIN_EXE_ple");

/// The standard output of a command that must have succeeded (else its output and errors).
pub fn stdout_of_success(out: std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// A small generated NVFP4 table (base 3,000, 8 shards) in `dir/t`, for the benchmarks' tests.
pub fn small_table(dir: &Path) -> PathBuf {
    let table = dir.join("t");
    ple_testkit::synth::write_table(
        &table,
        RowFormat::Nvfp4,
        &ple_testkit::synth::small_config(3000, 8),
        2,
    )
    .unwrap();
    table
}

pub fn spec(format: RowFormat, seed: u64) -> CheckpointSpec {
    let mut s = CheckpointSpec::new(format, 1000, 4, seed);
    s.shards_per_file = 2;
    s
}

pub fn pack_quiet(ck: &Path, out: &Path, opts: &PackOptions) -> ple_core::Result<PackReport> {
    pack(ck, out, opts, &mut |_, _| true)
}

pub fn open(dir: &Path) -> ple_core::Result<Table> {
    Table::open(dir, &TableOpenOptions::default())
}

/// Every row of the table equals the generator's row.
pub fn assert_rows(t: &Table, seed: u64, format: RowFormat) {
    for r in 0..t.meta().total_rows {
        assert_eq!(
            t.row(r).unwrap(),
            expected_row(seed, format, r),
            "row {r} of a {} table (seed {seed})",
            format.name()
        );
    }
}

pub fn temp_files(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp-"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Nothing at `out` opens as a table and no temporary file is left.
pub fn assert_nothing_opens(out: &Path) {
    assert!(open(out).is_err(), "a table opens at {}", out.display());
    assert!(
        temp_files(out).is_empty(),
        "temporary files left: {:?}",
        temp_files(out)
    );
}

pub fn err_of(r: ple_core::Result<PackReport>) -> Error {
    match r {
        Ok(rep) => panic!("pack succeeded: {rep:?}"),
        Err(e) => e,
    }
}

/// Packing `ck` fails with a Format error mentioning every one of `needles`, and leaves nothing.
pub fn assert_bad(ck: &Path, needles: &[&str]) {
    let out = ck.parent().unwrap().join("out-bad");
    let e = err_of(pack_quiet(ck, &out, &PackOptions::default()));
    let msg = e.to_string();
    assert!(matches!(e, Error::Format(_)), "not a Format error: {msg}");
    for n in needles {
        assert!(msg.contains(n), "error '{msg}' does not mention '{n}'");
    }
    assert_nothing_opens(&out);
}

/// The header of a safetensors file as a JSON map, and its data section.
pub fn read_st(path: &Path) -> (serde_json::Map<String, serde_json::Value>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (h.as_object().unwrap().clone(), bytes[8 + n..].to_vec())
}

pub fn write_st(path: &Path, h: &serde_json::Map<String, serde_json::Value>, data: &[u8]) {
    let mut hb = serde_json::to_vec(h).unwrap();
    while hb.len() % 8 != 0 {
        hb.push(b' ');
    }
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(hb.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&hb).unwrap();
    f.write_all(data).unwrap();
}

/// Edits the header of the safetensors file holding `tensor`; returns that file.
pub fn edit_header_of(
    ck: &Path,
    tensor: &str,
    f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> PathBuf {
    for p in st::safetensors_files(ck).unwrap() {
        let (mut h, data) = read_st(&p);
        if h.contains_key(tensor) {
            f(&mut h);
            write_st(&p, &h, &data);
            return p;
        }
    }
    panic!("no file holds {tensor}");
}

/// A copy of a header entry that holds no data (so it overlaps no other tensor).
pub fn no_data(mut v: serde_json::Value) -> serde_json::Value {
    v["shape"] = serde_json::json!([0]);
    v["data_offsets"] = serde_json::json!([0, 0]);
    v
}

pub fn edit_index(ck: &Path, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let p = ck.join(st::INDEX_FILE);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(v["weight_map"].as_object_mut().unwrap());
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

/// Overwrites the data of `tensor` in place.
pub fn patch_tensor(ck: &Path, tensor: &str, bytes: &[u8]) {
    for p in st::safetensors_files(ck).unwrap() {
        let h = st::read_header(&p).unwrap();
        if let Some(t) = h.get(tensor) {
            assert_eq!(t.len, bytes.len() as u64);
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.write_all_at(bytes, t.offset).unwrap();
            return;
        }
    }
    panic!("no file holds {tensor}");
}

pub fn bad_ck(d: &Path, name: &str, s: &CheckpointSpec) -> PathBuf {
    let ck = d.join(name).join("ck");
    write_checkpoint(&ck, s).unwrap();
    ck
}

/// Runs `f` on another thread; fails the test if it takes longer than 20 s (a blocking open of a
/// FIFO never returns).
pub fn within_20s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("hung (blocked on a FIFO?)")
}

pub fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}
