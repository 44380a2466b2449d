//! Packing from a llama.cpp Qwen4Exp GGUF (`docs/FORMAT.md#gguf-sources`), against GGUFs written
//! by gguf-py (PyPI `gguf`, the writer of llama.cpp's converter; `oracle/gguf_writer.py`): F32,
//! F16 and BF16 give the checkpoint's rows bit for bit (F16 as the f16 values widened to F32
//! rows), a quantised type is refused naming it, and a truncated or malformed GGUF is a Format
//! error that leaves no table (nor changes one already there).
//!
//! Needs `python3` with `numpy` and `gguf`. Where they are missing the tests skip with a loud
//! message, unless `CI=true`, where they fail.

mod common;

use common::*;
use ple_core::error::Error;
use ple_core::format::pack::PackOptions;
use ple_core::format::table::TableMeta;
use ple_core::model::RowFormat;
use std::path::{Path, PathBuf};
use std::process::Command;

const WRITER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/oracle/gguf_writer.py");

fn have_python() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy, gguf"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with numpy and gguf (PyPI) is needed for the GGUF oracle";
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{msg}: missing on CI");
        }
        eprintln!("SKIPPED: {msg}");
    }
    ok
}

/// Writes `out` from the table `table` with gguf-py as ggml type `ty`; returns the file.
fn write_gguf(table: &Path, out: &Path, ty: &str, extra: &[&str]) -> PathBuf {
    let o = Command::new("python3")
        .arg(WRITER)
        .arg(table)
        .arg(out)
        .arg(ty)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "gguf_writer.py: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out.to_path_buf()
}

fn packed(ck: &Path, out: &Path) -> TableMeta {
    pack_quiet(ck, out, &PackOptions::default()).unwrap();
    open(out).unwrap().meta().clone()
}

fn rows_of(table: &Path) -> Vec<u8> {
    std::fs::read(table.join("table.rows")).unwrap()
}

/// A table packed from a generated checkpoint of `format` (base 1000, 4 shards) in `d/name`.
fn ck_table(d: &Path, name: &str, format: RowFormat) -> PathBuf {
    let ck = bad_ck(d, name, &spec(format, 7));
    let t = d.join(name).join("table");
    packed(&ck, &t);
    t
}

#[test]
fn f32_f16_and_bf16_ggufs_pack_to_the_checkpoints_rows() {
    if !have_python() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let t32 = ck_table(d.path(), "f32", RowFormat::F32);
    let m32 = open(&t32).unwrap().meta().clone();

    // F32: the same rows, the same hash and shape; one source shard
    let g = write_gguf(&t32, &d.path().join("m32.gguf"), "f32", &[]);
    let m = packed(&g, &d.path().join("g32"));
    assert_eq!(rows_of(&d.path().join("g32")), rows_of(&t32));
    assert_eq!(
        (m.row_format, m.head_dim, m.total_rows),
        (RowFormat::F32, 160, m32.total_rows)
    );
    assert_eq!(m.hash, m32.hash);
    assert_eq!((m.num_shards, m.rows_per_shard), (1, m32.total_rows));
    assert_eq!(m.source.name, "m32.gguf");

    // F16: F32 rows holding the f16 values exactly (numpy's f16 → f32)
    let want = d.path().join("want16");
    let w = want.to_str().unwrap();
    let g = write_gguf(&t32, &d.path().join("m16.gguf"), "f16", &["--want", w]);
    let m = packed(&g, &d.path().join("g16"));
    assert_eq!(m.row_format, RowFormat::F32);
    let got = rows_of(&d.path().join("g16"));
    assert_eq!(got, std::fs::read(&want).unwrap());
    assert_ne!(
        got,
        rows_of(&t32),
        "the f16 rounding changed nothing: the test cannot fail"
    );

    // BF16: a BF16 checkpoint's rows, byte for byte, as BF16 rows
    let tb = ck_table(d.path(), "bf16", RowFormat::Bf16);
    let g = write_gguf(&tb, &d.path().join("mbf.gguf"), "bf16", &[]);
    let m = packed(&g, &d.path().join("gbf"));
    assert_eq!(m.row_format, RowFormat::Bf16);
    assert_eq!(rows_of(&d.path().join("gbf")), rows_of(&tb));

    // the table opens with the GGUF as its checkpoint, and not with another GGUF
    let with = |ck: &str| ple_core::format::table::TableOpenOptions {
        checkpoint_dir: Some(d.path().join(ck)),
        ..Default::default()
    };
    ple_core::format::table::Table::open(&d.path().join("gbf"), &with("mbf.gguf")).unwrap();
    let e = ple_core::format::table::Table::open(&d.path().join("gbf"), &with("m32.gguf"));
    assert!(e.is_err_and(|e| e.to_string().contains("was packed from 'mbf.gguf'")));

    // packing the same GGUF again reuses the table; another GGUF is refused without force
    let r = pack_quiet(&g, &d.path().join("gbf"), &PackOptions::default()).unwrap();
    assert!(r.reused);
    let e = err_of(pack_quiet(
        &d.path().join("m32.gguf"),
        &d.path().join("gbf"),
        &PackOptions::default(),
    ));
    assert!(
        e.to_string()
            .contains("already holds a table packed from 'mbf.gguf'"),
        "{e}"
    );
}

#[test]
fn a_quantised_gguf_is_refused_naming_its_type() {
    if !have_python() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let t32 = ck_table(d.path(), "f32", RowFormat::F32);
    let g = write_gguf(&t32, &d.path().join("q.gguf"), "q8_0", &[]);
    assert_bad(
        &g,
        &["per_layer_token_embd.weight' is Q8_0", "F32, F16 and BF16"],
    );
    // through the CLI: a failing exit and the same message
    let o = Command::new(PLE)
        .arg("pack")
        .arg(&g)
        .arg(d.path().join("cli-out"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("format error") && err.contains("Q8_0"),
        "{err}"
    );
    assert!(!d.path().join("cli-out").join("table.json").exists());
}

#[test]
fn a_truncated_or_malformed_gguf_is_a_format_error_and_leaves_no_table() {
    if !have_python() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let t32 = ck_table(d.path(), "f32", RowFormat::F32);
    let good = std::fs::read(write_gguf(&t32, &d.path().join("g.gguf"), "f32", &[])).unwrap();
    let data_start = ple_core::format::gguf::Gguf::open(&d.path().join("g.gguf"))
        .unwrap()
        .data_start as usize;
    // an existing table the failed packs (with force) must leave as it was
    let keep = d.path().join("keep");
    packed(&d.path().join("g.gguf"), &keep);
    let kept = rows_of(&keep);
    let force = PackOptions {
        force: true,
        ..Default::default()
    };
    let bad = d.path().join("bad.gguf");
    let mut cuts: Vec<usize> = (0..40).map(|i| i * data_start / 40).collect();
    cuts.extend([
        4,
        8,
        23,
        data_start - 1,
        data_start,
        data_start + 4096,
        good.len() - 1,
    ]);
    for cut in cuts {
        std::fs::write(&bad, &good[..cut]).unwrap();
        let e = err_of(pack_quiet(&bad, &keep, &force));
        let msg = e.to_string();
        assert!(
            matches!(e, Error::Format(_)),
            "cut at {cut}: not a Format error: {msg}"
        );
        // a file of fewer than 4 bytes is no GGUF at all
        let why = if cut < 4 {
            "not a GGUF"
        } else {
            "truncated GGUF"
        };
        assert!(msg.contains(why), "cut at {cut}: {msg}");
        assert_eq!(rows_of(&keep), kept, "cut at {cut}");
        assert!(temp_files(&keep).is_empty());
        assert_bad(&bad, &[why]);
    }

    let patched = |at: usize, bytes: &[u8]| {
        let mut b = good.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        std::fs::write(&bad, &b).unwrap();
        bad.clone()
    };
    assert_bad(&patched(0, b"GGUX"), &["is a file but not a GGUF"]);
    assert_bad(&patched(4, &1u32.to_le_bytes()), &["GGUF version 1"]);
    // the first key's value type (after magic, version, counts, the key's length and text)
    let klen = u64::from_le_bytes(good[24..32].try_into().unwrap()) as usize;
    assert_bad(
        &patched(32 + klen, &77u32.to_le_bytes()),
        &["unknown value type 77"],
    );
    // the tensor count far beyond what the file holds
    assert_bad(&patched(8, &(1u64 << 40).to_le_bytes()), &["tensors"]);

    let variant = |name: &str, extra: &[&str]| write_gguf(&t32, &d.path().join(name), "f32", extra);
    assert_bad(
        &variant("two.gguf", &["--layers", "2"]),
        &["lists 2 PLE layers", "qwen4exp.ple.layers"],
    );
    assert_bad(
        &variant("nomul.gguf", &["--drop", "ple.layer_multipliers"]),
        &["key 'qwen4exp.ple.layer_multipliers' missing"],
    );
    assert_bad(
        &variant("novocab.gguf", &["--drop", "tokenizer.ggml.tokens"]),
        &["no vocabulary size"],
    );
    assert_bad(
        &variant("nolayers.gguf", &["--drop", "ple.layers"]),
        &["qwen4exp.ple.layers' missing"],
    );
}
