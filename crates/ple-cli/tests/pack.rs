//! Packing checkpoints (`docs/FORMAT.md#safetensors-checkpoints`, `#the-packed-table`): every family, metadata, reuse/force/refusal, crash safety,
//! bad input, Python-written checkpoints and Python-tool tables.

mod common;

use common::*;
use ple_core::error::Error;
use ple_core::format::checkpoint::{Checkpoint, HashSource};
use ple_core::format::fingerprint::fingerprint;
use ple_core::format::pack::{PackOptions, pack};
use ple_core::format::safetensors as st;
use ple_core::format::table::{Table, TableOpenOptions};
use ple_core::model::{HashParams, RowFormat};
use ple_testkit::synth::{Scale2Layout, write_checkpoint};
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn each_family_packs_every_row_and_all_metadata() {
    let d = tempfile::tempdir().unwrap();
    let cases = [
        (
            RowFormat::Nvfp4,
            spec(RowFormat::Nvfp4, 11).with_hash_tensors(),
        ),
        (RowFormat::Fp8, {
            let mut s = spec(RowFormat::Fp8, 12);
            s.single_file = true;
            s
        }),
        (RowFormat::Bf16, {
            let mut s = spec(RowFormat::Bf16, 13);
            s.shards_per_file = 3;
            s
        }),
        (RowFormat::F32, {
            let mut s = spec(RowFormat::F32, 14).with_hash_tensors();
            s.shards_per_file = 1;
            s
        }),
    ];
    for (f, s) in cases {
        let ck = d.path().join(format!("ck-{}", f.name()));
        let out = d.path().join(format!("table-{}", f.name()));
        let info = write_checkpoint(&ck, &s).unwrap();
        let mut calls: Vec<(u64, u64)> = Vec::new();
        let rep = pack(&ck, &out, &PackOptions::default(), &mut |a, b| {
            calls.push((a, b));
            true
        })
        .unwrap();
        assert!(!rep.reused);
        assert_eq!(rep.bytes_written, info.table_bytes);
        assert_eq!(rep.total_rows, info.total_rows);
        // progress: starts at 0, never decreases, ends at total, total constant
        assert_eq!(calls.first(), Some(&(0, info.table_bytes)));
        assert_eq!(calls.last(), Some(&(info.table_bytes, info.table_bytes)));
        assert!(
            calls
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 == w[1].1)
        );

        let t = open(&out).unwrap();
        let m = t.meta();
        let hd = 160;
        assert_eq!(m.row_format, f);
        assert_eq!(m.row_bytes as usize, f.row_bytes(hd));
        assert_eq!(m.code_bytes as usize, f.code_bytes(hd));
        assert_eq!(m.scale_bytes as usize, f.scale_bytes(hd));
        assert_eq!(m.total_rows, info.total_rows);
        assert_eq!(m.rows_per_shard, info.rows_per_shard);
        assert_eq!(m.num_shards, 4);
        assert_eq!((m.head_dim, m.num_heads), (160, 16));
        assert_eq!((m.ngram_size, m.heads_per_ngram), (3, 8));
        assert_eq!(m.global_scale, s.global_scale);
        assert_eq!(m.hash, HashParams::derive(&s.config));
        assert_eq!(m.source.name, format!("ck-{}", f.name()));
        assert_eq!(m.source.fingerprint, fingerprint(&ck).unwrap());
        assert_eq!(m.source.fingerprint.len(), 64);
        assert_eq!(m.rows_file, "table.rows");
        // padded rows split evenly: rows_per_shard = ceil(round_up(addressed, 128) / 4)
        let padded = m.hash.addressed_rows().div_ceil(128) * 128;
        assert_eq!(m.rows_per_shard, padded.div_ceil(4));
        assert_eq!(
            std::fs::metadata(out.join("table.rows")).unwrap().len(),
            info.table_bytes
        );
        assert_rows(&t, s.seed, f);
        assert!(temp_files(&out).is_empty());
        // the metadata on disk is what the report says
        assert_eq!(rep.meta.as_ref(), Some(m));
    }
}

#[test]
fn small_buffers_and_layouts_give_the_same_rows() {
    let d = tempfile::tempdir().unwrap();
    for (i, (layout, per_file, buffer)) in [
        (Scale2Layout::Prefix, 1, 4096),
        (Scale2Layout::Both, 0, 90 * 1000 + 7),
        (Scale2Layout::PerShard, 3, 1 << 20),
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = spec(RowFormat::Nvfp4, 20 + i as u64);
        s.scale2_layout = layout;
        s.shards_per_file = per_file;
        s.global_scale = 0.25;
        let ck = d.path().join(format!("ck{i}"));
        write_checkpoint(&ck, &s).unwrap();
        let out = d.path().join(format!("out{i}"));
        let opts = PackOptions {
            buffer_bytes: buffer,
            ..Default::default()
        };
        pack_quiet(&ck, &out, &opts).unwrap();
        let t = open(&out).unwrap();
        assert_eq!(t.global_scale(), 0.25);
        assert_rows(&t, s.seed, RowFormat::Nvfp4);
    }
}

#[test]
fn prefix_is_found_not_hard_coded_and_hash_tensors_alone_suffice() {
    let d = tempfile::tempdir().unwrap();
    let mut s = spec(RowFormat::Fp8, 5).with_hash_tensors();
    s.layer = 7;
    s.write_config = false;
    let ck = d.path().join("ck");
    write_checkpoint(&ck, &s).unwrap();
    let c = Checkpoint::open(&ck).unwrap();
    assert_eq!(
        c.prefix,
        "model.language_model.layers.7.ple.ple_embedding.ngram_embedding"
    );
    assert_eq!(c.hash_source, HashSource::Tensors);
    assert_eq!(c.hash, HashParams::derive(&s.config));
    let out = d.path().join("out");
    pack_quiet(&ck, &out, &PackOptions::default()).unwrap();
    assert_rows(&open(&out).unwrap(), 5, RowFormat::Fp8);

    // with both, they are checked against each other
    let ck2 = d.path().join("ck2");
    write_checkpoint(&ck2, &spec(RowFormat::Bf16, 6).with_hash_tensors()).unwrap();
    assert_eq!(
        Checkpoint::open(&ck2).unwrap().hash_source,
        HashSource::Both
    );
}

#[test]
fn table_of_another_checkpoint_is_refused_at_open() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("ck-a"), d.path().join("ck-b"));
    write_checkpoint(&a, &spec(RowFormat::Nvfp4, 1)).unwrap();
    // same shapes, same sizes, byte-identical index and headers: only the weights differ
    write_checkpoint(&b, &spec(RowFormat::Nvfp4, 2)).unwrap();
    for (fa, fb) in st::safetensors_files(&a)
        .unwrap()
        .iter()
        .zip(st::safetensors_files(&b).unwrap())
    {
        assert_eq!(
            st::read_header_bytes(fa).unwrap(),
            st::read_header_bytes(&fb).unwrap()
        );
    }
    assert_ne!(fingerprint(&a).unwrap(), fingerprint(&b).unwrap());
    let out = d.path().join("t");
    pack_quiet(&a, &out, &PackOptions::default()).unwrap();
    let with = |ck: &Path| TableOpenOptions {
        checkpoint_dir: Some(ck.to_path_buf()),
        ..Default::default()
    };
    Table::open(&out, &with(&a)).unwrap();
    let e = Table::open(&out, &with(&b)).err().expect("must refuse");
    assert!(matches!(e, Error::Format(_)), "{e}");
    assert!(
        e.to_string().contains("ck-a") && e.to_string().contains("ck-b"),
        "{e}"
    );
}

#[test]
fn reuse_refusal_and_force() {
    use std::os::unix::fs::MetadataExt;
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("ck-a"), d.path().join("ck-b"));
    write_checkpoint(&a, &spec(RowFormat::Nvfp4, 1)).unwrap();
    write_checkpoint(&b, &spec(RowFormat::Nvfp4, 2)).unwrap();
    let out = d.path().join("t");
    let r1 = pack_quiet(&a, &out, &PackOptions::default()).unwrap();
    assert!(!r1.reused);
    let ino = std::fs::metadata(out.join("table.rows")).unwrap().ino();

    // same checkpoint: reused, nothing rewritten
    let r2 = pack_quiet(&a, &out, &PackOptions::default()).unwrap();
    assert!(r2.reused);
    assert_eq!(r2.bytes_written, 0);
    assert_eq!(
        std::fs::metadata(out.join("table.rows")).unwrap().ino(),
        ino
    );

    // another checkpoint: refused, naming both; the old table is untouched
    let e = err_of(pack_quiet(&b, &out, &PackOptions::default()));
    let msg = e.to_string();
    assert!(matches!(e, Error::Format(_)), "{msg}");
    assert!(msg.contains("'ck-a'") && msg.contains("'ck-b'"), "{msg}");
    assert_rows(&open(&out).unwrap(), 1, RowFormat::Nvfp4);
    assert_eq!(
        std::fs::metadata(out.join("table.rows")).unwrap().ino(),
        ino
    );

    // force: replaced
    let force = PackOptions {
        force: true,
        ..Default::default()
    };
    let r3 = pack_quiet(&b, &out, &force).unwrap();
    assert!(!r3.reused);
    let t = open(&out).unwrap();
    assert_eq!(t.meta().source.name, "ck-b");
    assert_rows(&t, 2, RowFormat::Nvfp4);

    // force on the same checkpoint rebuilds instead of reusing
    let ino_b = std::fs::metadata(out.join("table.rows")).unwrap().ino();
    assert!(!pack_quiet(&b, &out, &force).unwrap().reused);
    assert_ne!(
        std::fs::metadata(out.join("table.rows")).unwrap().ino(),
        ino_b
    );

    // a changed config.json (same shards) makes the old metadata stale: rebuilt, not reused
    let cfg = b.join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace(
            "\"split_ngram_parts\"",
            "\"seed\": 99, \"split_ngram_parts\"",
        ),
    )
    .unwrap();
    let r4 = pack_quiet(&b, &out, &PackOptions::default()).unwrap();
    assert!(!r4.reused);
    assert_ne!(
        open(&out).unwrap().meta().hash.multipliers,
        HashParams::derive(&spec(RowFormat::Nvfp4, 2).config).multipliers
    );

    // unreadable metadata in the way: refused without force
    std::fs::write(out.join("table.json"), "not json").unwrap();
    let e = err_of(pack_quiet(&a, &out, &PackOptions::default()));
    assert!(e.to_string().contains("not libple table metadata"), "{e}");
    pack_quiet(&a, &out, &force).unwrap();
    assert_rows(&open(&out).unwrap(), 1, RowFormat::Nvfp4);
}

#[test]
fn rebuilding_under_an_open_table_leaves_it_reading_the_old_rows() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("ck-a"), d.path().join("ck-b"));
    write_checkpoint(&a, &spec(RowFormat::Fp8, 31)).unwrap();
    write_checkpoint(&b, &spec(RowFormat::Fp8, 32)).unwrap();
    let out = d.path().join("t");
    pack_quiet(&a, &out, &PackOptions::default()).unwrap();
    let old = open(&out).unwrap();
    let force = PackOptions {
        force: true,
        ..Default::default()
    };
    pack_quiet(&b, &out, &force).unwrap();
    assert_rows(&old, 31, RowFormat::Fp8);
    assert_eq!(old.meta().source.name, "ck-a");
    let new = open(&out).unwrap();
    assert_rows(&new, 32, RowFormat::Fp8);
    // and through the CLI too (another process replacing the files)
    let st = Command::new(PLE)
        .args(["pack", "--force"])
        .arg(&a)
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert_rows(&new, 32, RowFormat::Fp8);
    assert_rows(&old, 31, RowFormat::Fp8);
    assert_rows(&open(&out).unwrap(), 31, RowFormat::Fp8);
}

#[test]
fn cancel_leaves_nothing_and_keeps_an_existing_table() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("ck-a"), d.path().join("ck-b"));
    write_checkpoint(&a, &spec(RowFormat::Bf16, 1)).unwrap();
    write_checkpoint(&b, &spec(RowFormat::Bf16, 2)).unwrap();
    let opts = PackOptions {
        buffer_bytes: 64 << 10,
        ..Default::default()
    };
    let out = d.path().join("fresh");
    let e = err_of(pack(&a, &out, &opts, &mut |done, _| done == 0));
    assert!(matches!(&e, Error::State(m) if m == "cancelled"), "{e}");
    assert_nothing_opens(&out);

    // cancelling a forced rebuild leaves the old table as it was
    let out = d.path().join("existing");
    pack_quiet(&a, &out, &opts).unwrap();
    let force = PackOptions {
        force: true,
        ..opts.clone()
    };
    let e = err_of(pack(&b, &out, &force, &mut |done, total| done < total / 2));
    assert!(matches!(e, Error::State(_)), "{e}");
    assert!(temp_files(&out).is_empty());
    assert_rows(&open(&out).unwrap(), 1, RowFormat::Bf16);
}

#[test]
fn stale_temporary_files_are_removed_and_a_second_packer_is_locked_out() {
    use std::os::fd::AsRawFd;
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    write_checkpoint(&ck, &spec(RowFormat::Fp8, 3)).unwrap();
    let out = d.path().join("t");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join(".table.rows.tmp-4000000"), b"partial").unwrap();
    std::fs::write(out.join(".table.json.tmp-4000000"), b"{").unwrap();

    let lock = std::fs::File::open(&out).unwrap();
    // SAFETY: flock on a descriptor this test owns (kept open by `lock`); no memory is passed.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let e = err_of(pack_quiet(&ck, &out, &PackOptions::default()));
    assert!(
        matches!(e, Error::State(_)) && e.to_string().contains("another packer"),
        "{e}"
    );
    drop(lock);

    pack_quiet(&ck, &out, &PackOptions::default()).unwrap();
    assert!(temp_files(&out).is_empty(), "{:?}", temp_files(&out));
    assert_rows(&open(&out).unwrap(), 3, RowFormat::Fp8);
}

// ---------------------------------------------------------------------------------------------
// Python: a checkpoint written by the `safetensors` package, and a Python-tool table.
// ---------------------------------------------------------------------------------------------

/// Runs tests/fixtures/make_checkpoint.py into `out`. None = Python or a package is missing and
/// we are not in CI (skipped loudly); in CI that fails the test.
fn python_fixture(out: &Path) -> Option<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/make_checkpoint.py");
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let r = Command::new("python3").arg(&script).arg(out).output();
    let missing = match &r {
        Err(e) => Some(format!("python3 not runnable: {e}")),
        Ok(o) if o.status.code() == Some(3) => {
            Some(String::from_utf8_lossy(&o.stderr).into_owned())
        }
        Ok(o) => {
            assert!(
                o.status.success(),
                "make_checkpoint.py failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            None
        }
    };
    if let Some(m) = missing {
        if ci {
            panic!("CI: the Python fixture cannot run ({m}); install numpy and safetensors");
        }
        eprintln!(
            "\n*** SKIPPING the Python-checkpoint test: {m} (pip install numpy safetensors) ***\n"
        );
        return None;
    }
    let text = std::fs::read_to_string(out.join("expected.json")).unwrap();
    Some(serde_json::from_str(&text).unwrap())
}

#[test]
fn python_written_checkpoint_packs_to_the_python_tool_table() {
    let d = tempfile::tempdir().unwrap();
    let Some(exp) = python_fixture(d.path()) else {
        return;
    };
    let ck = PathBuf::from(exp["checkpoint"].as_str().unwrap());
    let c = Checkpoint::open(&ck).unwrap();
    assert_eq!(c.format, RowFormat::Nvfp4);
    assert_eq!(c.hash_source, HashSource::Both);
    assert_eq!(c.global_scale as f64, exp["global_scale"].as_f64().unwrap());
    let ints = |k: &str| -> Vec<u64> {
        exp[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    };
    assert_eq!(c.hash.multipliers, ints("multipliers"));
    assert_eq!(c.hash.head_sizes, ints("head_sizes"));
    assert_eq!(c.hash.offsets, ints("offsets"));
    assert_eq!(c.rows_per_shard, exp["rows_per_shard"].as_u64().unwrap());

    let out = d.path().join("packed");
    pack_quiet(
        &ck,
        &out,
        &PackOptions {
            buffer_bytes: 9000,
            ..Default::default()
        },
    )
    .unwrap();
    let ours = std::fs::read(out.join("table.rows")).unwrap();
    let theirs = std::fs::read(exp["table_file"].as_str().unwrap()).unwrap();
    assert_eq!(ours.len(), theirs.len());
    assert!(
        ours == theirs,
        "packed rows differ from numpy's concatenation"
    );

    // The Python tool's table opens: hash parameters and global scale from the checkpoint that
    // holds the config.json given.
    let pt = PathBuf::from(exp["table_dir"].as_str().unwrap());
    let e = open(&pt).err().expect("no config.json beside it");
    assert!(e.to_string().contains("config.json"), "{e}");
    let opts = TableOpenOptions {
        config_json_path: Some(ck.join("config.json")),
        ..Default::default()
    };
    let t = Table::open(&pt, &opts).unwrap();
    let ours_t = open(&out).unwrap();
    assert_eq!(t.meta().hash, ours_t.meta().hash);
    assert_eq!(t.global_scale(), ours_t.global_scale());
    assert_eq!(t.meta().source, ours_t.meta().source);
    assert_eq!(t.bytes(), ours_t.bytes());
    let with_ck = TableOpenOptions {
        checkpoint_dir: Some(ck.clone()),
        ..Default::default()
    };
    Table::open(&pt, &with_ck).unwrap();
}

/// A Python-tool table made here (no Python needed): the rule for the global scale and the
/// checks against the checkpoint.
#[test]
fn python_tool_tables_open_with_the_documented_rule() {
    let d = tempfile::tempdir().unwrap();
    let s = spec(RowFormat::Nvfp4, 44);
    let ck = d.path().join("snap-1234");
    let info = write_checkpoint(&ck, &s).unwrap();
    let out = d.path().join("ours");
    pack_quiet(&ck, &out, &PackOptions::default()).unwrap();

    let pt = d.path().join("py");
    std::fs::create_dir_all(&pt).unwrap();
    let name = "layer.ngram_embedding.packed_u8";
    std::fs::copy(out.join("table.rows"), pt.join(name)).unwrap();
    let mut meta = serde_json::json!({
        "rows_per_shard": info.rows_per_shard, "num_shards": 4, "row_width": 90,
        "codes_width": 80, "scales_width": 10, "total_rows": info.total_rows,
        "shard_dtype": "U8", "snapshot": "snap-1234",
    });
    let write_meta = |m: &serde_json::Value| {
        std::fs::write(pt.join(format!("{name}.json")), m.to_string()).unwrap()
    };
    write_meta(&meta);

    // config.json beside the table, no checkpoint: the global scale is unknown → error
    std::fs::copy(ck.join("config.json"), pt.join("config.json")).unwrap();
    let e = open(&pt).err().expect("needs a global scale");
    assert!(e.to_string().contains("global scale"), "{e}");
    // … unless the JSON carries it
    meta["global_scale"] = 0.015625.into();
    write_meta(&meta);
    let t = open(&pt).unwrap();
    assert_eq!(t.global_scale(), 0.015625);
    assert_eq!(t.meta().source.fingerprint, "");
    assert_eq!(t.meta().source.name, "snap-1234");
    assert_rows(&t, 44, RowFormat::Nvfp4);
    let info_c = ple::info_to_c(&ple_core::format::table::table_info(&t));
    assert_eq!(info_c.source_fingerprint[0], 0);

    // a config.json inside the checkpoint: scale and fingerprint from there; must agree
    let opts = TableOpenOptions {
        config_json_path: Some(ck.join("config.json")),
        ..Default::default()
    };
    let t = Table::open(&pt, &opts).unwrap();
    assert_eq!(t.meta().source.fingerprint, fingerprint(&ck).unwrap());
    meta["global_scale"] = 0.5.into();
    write_meta(&meta);
    let e = Table::open(&pt, &opts).err().unwrap();
    assert!(e.to_string().contains("differs from the checkpoint"), "{e}");
    meta.as_object_mut().unwrap().remove("global_scale");

    // the snapshot must be the checkpoint's
    meta["snapshot"] = "other-snapshot".into();
    write_meta(&meta);
    let e = Table::open(&pt, &opts).err().unwrap();
    assert!(
        e.to_string().contains("other-snapshot") && e.to_string().contains("snap-1234"),
        "{e}"
    );
    meta["snapshot"] = "snap-1234".into();

    // widths against the dtype
    meta["shard_dtype"] = "F8_E4M3".into();
    write_meta(&meta);
    let e = Table::open(&pt, &opts).err().unwrap();
    assert!(e.to_string().contains("codes_width"), "{e}");
    meta.as_object_mut().unwrap().remove("shard_dtype");
    write_meta(&meta);
    assert_eq!(Table::open(&pt, &opts).unwrap().format(), RowFormat::Nvfp4);

    // a truncated row file
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(pt.join(name))
        .unwrap();
    f.set_len(info.table_bytes - 90).unwrap();
    let e = Table::open(&pt, &opts).err().unwrap();
    assert!(e.to_string().contains("file size"), "{e}");

    // no config.json anywhere
    std::fs::remove_file(pt.join("config.json")).unwrap();
    let e = open(&pt).err().unwrap();
    assert!(
        matches!(e, Error::Format(_)) && e.to_string().contains("config.json"),
        "{e}"
    );
}

#[test]
fn python_tool_tables_of_f32_rows_open_by_width_or_dtype() {
    let d = tempfile::tempdir().unwrap();
    let s = spec(RowFormat::F32, 45);
    let ck = d.path().join("snap-f32");
    let info = write_checkpoint(&ck, &s).unwrap();
    let out = d.path().join("ours");
    pack_quiet(&ck, &out, &PackOptions::default()).unwrap();
    let pt = d.path().join("py");
    std::fs::create_dir_all(&pt).unwrap();
    let name = "layer.ngram_embedding.packed_u8";
    std::fs::copy(out.join("table.rows"), pt.join(name)).unwrap();
    std::fs::copy(ck.join("config.json"), pt.join("config.json")).unwrap();
    let mut meta = serde_json::json!({
        "rows_per_shard": info.rows_per_shard, "num_shards": 4, "row_width": 640,
        "codes_width": 640, "scales_width": 0, "total_rows": info.total_rows,
        "snapshot": "snap-f32",
    });
    let write_meta = |m: &serde_json::Value| {
        std::fs::write(pt.join(format!("{name}.json")), m.to_string()).unwrap()
    };
    // no dtype: the widths name f32; no checkpoint: the global scale of f32 rows is 1.0
    write_meta(&meta);
    let t = open(&pt).unwrap();
    assert_eq!((t.format(), t.global_scale()), (RowFormat::F32, 1.0));
    assert_rows(&t, 45, RowFormat::F32);
    // the dtype the tool would write for F32 shards; with the checkpoint, its fingerprint
    meta["shard_dtype"] = "F32".into();
    write_meta(&meta);
    let opts = TableOpenOptions {
        config_json_path: Some(ck.join("config.json")),
        ..Default::default()
    };
    let t = Table::open(&pt, &opts).unwrap();
    assert_eq!(t.format(), RowFormat::F32);
    assert_eq!(t.meta().source.fingerprint, fingerprint(&ck).unwrap());
    // a dtype whose widths are not the table's is refused
    meta["shard_dtype"] = "BF16".into();
    write_meta(&meta);
    let e = Table::open(&pt, &opts).err().unwrap();
    assert!(e.to_string().contains("codes_width"), "{e}");
}
