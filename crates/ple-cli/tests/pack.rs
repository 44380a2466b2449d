//! Packing checkpoints (`docs/FORMAT.md#safetensors-checkpoints`, `#the-packed-table`): every family, metadata, reuse/force/refusal, crash safety,
//! bad input, Python-written checkpoints and Python-tool tables.

use ple_core::error::Error;
use ple_core::format::checkpoint::{Checkpoint, HashSource};
use ple_core::format::fingerprint::fingerprint;
use ple_core::format::pack::{PackOptions, PackReport, pack};
use ple_core::format::safetensors as st;
use ple_core::format::table::{Table, TableOpenOptions};
use ple_core::model::{HashParams, RowFormat};
use ple_testkit::synth::{self, CheckpointSpec, Scale2Layout, expected_row, write_checkpoint};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const PLE: &str = env!("CARGO_BIN_EXE_ple");

fn spec(format: RowFormat, seed: u64) -> CheckpointSpec {
    let mut s = CheckpointSpec::new(format, 1000, 4, seed);
    s.shards_per_file = 2;
    s
}

fn pack_quiet(ck: &Path, out: &Path, opts: &PackOptions) -> ple_core::Result<PackReport> {
    pack(ck, out, opts, &mut |_, _| true)
}

fn open(dir: &Path) -> ple_core::Result<Table> {
    Table::open(dir, &TableOpenOptions::default())
}

/// Every row of the table equals the generator's row.
fn assert_rows(t: &Table, seed: u64, format: RowFormat) {
    for r in 0..t.meta().total_rows {
        assert_eq!(
            t.row(r),
            &expected_row(seed, format, r)[..],
            "row {r} of a {} table (seed {seed})",
            format.name()
        );
    }
}

fn temp_files(dir: &Path) -> Vec<String> {
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
fn assert_nothing_opens(out: &Path) {
    assert!(open(out).is_err(), "a table opens at {}", out.display());
    assert!(
        temp_files(out).is_empty(),
        "temporary files left: {:?}",
        temp_files(out)
    );
}

fn err_of(r: ple_core::Result<PackReport>) -> Error {
    match r {
        Ok(rep) => panic!("pack succeeded: {rep:?}"),
        Err(e) => e,
    }
}

/// Packing `ck` fails with a Format error mentioning every one of `needles`, and leaves nothing.
fn assert_bad(ck: &Path, needles: &[&str]) {
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
fn read_st(path: &Path) -> (serde_json::Map<String, serde_json::Value>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (h.as_object().unwrap().clone(), bytes[8 + n..].to_vec())
}

fn write_st(path: &Path, h: &serde_json::Map<String, serde_json::Value>, data: &[u8]) {
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
fn edit_header_of(
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
fn no_data(mut v: serde_json::Value) -> serde_json::Value {
    v["shape"] = serde_json::json!([0]);
    v["data_offsets"] = serde_json::json!([0, 0]);
    v
}

fn edit_index(ck: &Path, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let p = ck.join(st::INDEX_FILE);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(v["weight_map"].as_object_mut().unwrap());
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

/// Overwrites the data of `tensor` in place.
fn patch_tensor(ck: &Path, tensor: &str, bytes: &[u8]) {
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
// Bad input: each a clear Format error, nothing at the destination.
// ---------------------------------------------------------------------------------------------

fn bad_ck(d: &Path, name: &str, s: &CheckpointSpec) -> PathBuf {
    let ck = d.join(name).join("ck");
    write_checkpoint(&ck, s).unwrap();
    ck
}

#[test]
fn bad_missing_shard() {
    let d = tempfile::tempdir().unwrap();
    let s = spec(RowFormat::Nvfp4, 1);
    let ck = bad_ck(d.path(), "a", &s);
    let p = s.prefix();
    for suffix in ["weight", "weight_scale", "weight_scale_2"] {
        let name = format!("{p}.shard_2.{suffix}");
        edit_header_of(&ck, &name, |h| {
            h.remove(&name);
        });
        edit_index(&ck, |m| {
            m.remove(&name);
        });
    }
    assert_bad(&ck, &["missing shard 2", &format!("{p}.shard_2.weight")]);

    // listed in the index but absent from the file
    let ck = bad_ck(d.path(), "b", &s);
    let name = format!("{p}.shard_1.weight");
    edit_header_of(&ck, &name, |h| {
        h.remove(&name);
    });
    assert_bad(&ck, &["missing shard 1", &name]);

    // without config.json the shard count comes from the tensors; a gap is still an error
    let mut s2 = spec(RowFormat::Bf16, 1).with_hash_tensors();
    s2.write_config = false;
    let ck = bad_ck(d.path(), "c", &s2);
    let name = format!("{p}.shard_1.weight");
    edit_header_of(&ck, &name, |h| {
        h.remove(&name);
    });
    edit_index(&ck, |m| {
        m.remove(&name);
    });
    assert_bad(&ck, &["missing shard 1"]);

    // NVFP4 shard without its block scales
    let ck = bad_ck(d.path(), "d", &s);
    let name = format!("{p}.shard_3.weight_scale");
    edit_header_of(&ck, &name, |h| {
        h.remove(&name);
    });
    edit_index(&ck, |m| {
        m.remove(&name);
    });
    assert_bad(&ck, &[&name, "missing"]);
}

#[test]
fn bad_stray_and_duplicate_shards() {
    let d = tempfile::tempdir().unwrap();
    let s = spec(RowFormat::Nvfp4, 1);
    let p = s.prefix();
    // a shard index beyond split_ngram_parts
    let ck = bad_ck(d.path(), "a", &s);
    let src = format!("{p}.shard_3.weight");
    let stray = format!("{p}.shard_4.weight");
    let file = edit_header_of(&ck, &src, |h| {
        let v = no_data(h[&src].clone());
        h.insert(stray.clone(), v);
    });
    let fname = file.file_name().unwrap().to_string_lossy().into_owned();
    edit_index(&ck, |m| {
        m.insert(stray.clone(), fname.into());
    });
    assert_bad(&ck, &["stray shard 4", &stray, "split_ngram_parts"]);

    // the same name twice in one header
    let ck = bad_ck(d.path(), "b", &s);
    let f0 = st::safetensors_files(&ck).unwrap()[0].clone();
    let mut bytes = std::fs::read(&f0).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let from = format!("\"{p}.shard_1.weight\"");
    let to = format!("\"{p}.shard_0.weight\"");
    assert!(header.contains(&from));
    let header = header.replace(&from, &to);
    bytes[8..8 + n].copy_from_slice(header.as_bytes());
    std::fs::write(&f0, &bytes).unwrap();
    assert_bad(&ck, &["appears twice", &format!("{p}.shard_0.weight")]);

    // the same tensor in two files
    let ck = bad_ck(d.path(), "c", &s);
    let files = st::safetensors_files(&ck).unwrap();
    let (h0, _) = read_st(&files[0]);
    let dup = format!("{p}.shard_0.weight_scale");
    let entry = no_data(h0[&dup].clone());
    let (mut h1, data1) = read_st(&files[1]);
    h1.insert(dup.clone(), entry);
    write_st(&files[1], &h1, &data1);
    assert_bad(&ck, &["duplicated", &dup]);

    // a non-canonical index ("shard_01") next to shard_1
    let ck = bad_ck(d.path(), "e", &s);
    let src = format!("{p}.shard_1.weight");
    let odd = format!("{p}.shard_01.weight");
    let file = edit_header_of(&ck, &src, |h| {
        let v = no_data(h[&src].clone());
        h.insert(odd.clone(), v);
    });
    let fname = file.file_name().unwrap().to_string_lossy().into_owned();
    edit_index(&ck, |m| {
        m.insert(odd.clone(), fname.into());
    });
    assert_bad(&ck, &[&odd, "not canonical"]);
}

#[test]
fn bad_dtype_and_shape() {
    let d = tempfile::tempdir().unwrap();
    let s = spec(RowFormat::Nvfp4, 1);
    let p = s.prefix();
    let rows = ple_testkit::synth::shape(&s.config, &HashParams::derive(&s.config)).0;

    let ck = bad_ck(d.path(), "a", &s);
    let name = format!("{p}.shard_2.weight");
    edit_header_of(&ck, &name, |h| {
        h[&name]["dtype"] = "I8".into();
    });
    assert_bad(&ck, &[&name, "wrong dtype", "expected U8", "found I8"]);

    let ck = bad_ck(d.path(), "b", &s);
    let name = format!("{p}.shard_1.weight_scale");
    edit_header_of(&ck, &name, |h| {
        h[&name]["dtype"] = "U8".into();
    });
    assert_bad(&ck, &[&name, "expected F8_E4M3", "found U8"]);

    let ck = bad_ck(d.path(), "c", &s);
    let name = format!("{p}.shard_3.weight");
    edit_header_of(&ck, &name, |h| {
        h[&name]["shape"] = serde_json::json!([rows * 2, 40]);
    });
    assert_bad(
        &ck,
        &[
            &name,
            "wrong shape",
            &format!("[{rows}, 80]"),
            &format!("[{}, 40]", rows * 2),
        ],
    );

    // shard 0 of an unknown storage dtype
    let ck = bad_ck(d.path(), "d", &s);
    let name = format!("{p}.shard_0.weight");
    edit_header_of(&ck, &name, |h| {
        h[&name]["dtype"] = "I8".into();
    });
    assert_bad(&ck, &[&name, "I8", "not a PLE storage dtype"]);

    // dtype whose size does not match the byte range
    let ck = bad_ck(d.path(), "e", &s);
    let name = format!("{p}.shard_0.weight");
    edit_header_of(&ck, &name, |h| {
        h[&name]["dtype"] = "BF16".into();
    });
    assert_bad(&ck, &[&name, "needs"]);

    // every shard has the same rows: a shorter shard (consistent byte range) is a shape error
    let s2 = spec(RowFormat::Bf16, 1);
    let ck = bad_ck(d.path(), "f", &s2);
    let name = format!("{p}.shard_1.weight");
    edit_header_of(&ck, &name, |h| {
        let [b, _]: [u64; 2] = serde_json::from_value(h[&name]["data_offsets"].clone()).unwrap();
        h[&name]["shape"] = serde_json::json!([rows - 1, 160]);
        h[&name]["data_offsets"] = serde_json::json!([b, b + (rows - 1) * 320]);
    });
    assert_bad(&ck, &[&name, "wrong shape"]);
}

#[test]
fn bad_scales() {
    let d = tempfile::tempdir().unwrap();
    let s = spec(RowFormat::Nvfp4, 1);
    let p = s.prefix();
    let ck = bad_ck(d.path(), "a", &s);
    patch_tensor(
        &ck,
        &format!("{p}.shard_3.weight_scale_2"),
        &0.03125f32.to_le_bytes(),
    );
    assert_bad(
        &ck,
        &[
            "global scale copies differ",
            "shard_3.weight_scale_2",
            "0.03125",
        ],
    );

    let mut sb = s.clone();
    sb.scale2_layout = Scale2Layout::Both;
    let ck = bad_ck(d.path(), "b", &sb);
    patch_tensor(&ck, &format!("{p}.weight_scale_2"), &2.0f32.to_le_bytes());
    assert_bad(&ck, &["copies differ", &format!("{p}.weight_scale_2")]);

    // NVFP4 without any weight_scale_2
    let ck = bad_ck(d.path(), "c", &s);
    for i in 0..4 {
        let name = format!("{p}.shard_{i}.weight_scale_2");
        edit_header_of(&ck, &name, |h| {
            h.remove(&name);
        });
        edit_index(&ck, |m| {
            m.remove(&name);
        });
    }
    assert_bad(&ck, &["without a global scale", "weight_scale_2"]);

    // FP8 global scale of the wrong dtype, and a non-positive one
    let sf = spec(RowFormat::Fp8, 1);
    let ck = bad_ck(d.path(), "d", &sf);
    let name = format!("{p}.weight_scale");
    edit_header_of(&ck, &name, |h| {
        h[&name]["dtype"] = "I32".into();
    });
    assert_bad(&ck, &[&name, "scalar global scale"]);
    let ck = bad_ck(d.path(), "e", &sf);
    patch_tensor(&ck, &name, &(-1.0f32).to_le_bytes());
    assert_bad(&ck, &[&name, "not a positive finite"]);
}

#[test]
fn bad_files_truncated_header_and_json() {
    let d = tempfile::tempdir().unwrap();
    let s = spec(RowFormat::Nvfp4, 1);

    let ck = bad_ck(d.path(), "a", &s);
    let last = st::safetensors_files(&ck).unwrap().pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    assert_bad(
        &ck,
        &["truncated", &last.file_name().unwrap().to_string_lossy()],
    );

    let ck = bad_ck(d.path(), "b", &s);
    let f0 = st::safetensors_files(&ck).unwrap()[0].clone();
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(&f0).unwrap();
    f.write_all_at(&(len * 4).to_le_bytes(), 0).unwrap();
    assert_bad(&ck, &["header length", "runs past the end"]);

    // a file shorter than the 8-byte length
    let ck = bad_ck(d.path(), "c", &s);
    std::fs::write(&st::safetensors_files(&ck).unwrap()[0], b"abc").unwrap();
    assert_bad(&ck, &["shorter than the 8-byte"]);

    let ck = bad_ck(d.path(), "d", &s);
    std::fs::write(ck.join(st::INDEX_FILE), "{ \"weight_map\": ").unwrap();
    assert_bad(&ck, &[st::INDEX_FILE, "invalid JSON"]);

    let ck = bad_ck(d.path(), "e", &s);
    let f0 = st::safetensors_files(&ck).unwrap()[0].clone();
    let mut bytes = std::fs::read(&f0).unwrap();
    bytes[8] = b'[';
    bytes[9] = b'!';
    std::fs::write(&f0, &bytes).unwrap();
    assert_bad(
        &ck,
        &[
            "header is not valid JSON",
            &f0.file_name().unwrap().to_string_lossy(),
        ],
    );

    // index names a file that is not there
    let ck = bad_ck(d.path(), "f", &s);
    std::fs::remove_file(st::safetensors_files(&ck).unwrap().pop().unwrap()).unwrap();
    assert_bad(&ck, &["does not exist"]);

    // invalid config.json
    let ck = bad_ck(d.path(), "g", &s);
    std::fs::write(ck.join("config.json"), "{ text_config: }").unwrap();
    assert_bad(&ck, &["config.json", "invalid JSON"]);

    // not a checkpoint at all
    let empty = d.path().join("h").join("ck");
    std::fs::create_dir_all(&empty).unwrap();
    assert_bad(&empty, &["neither", st::INDEX_FILE]);
    let e = err_of(pack_quiet(
        &d.path().join("nope"),
        &d.path().join("o"),
        &PackOptions::default(),
    ));
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(!d.path().join("o").exists());

    // no PLE table in the checkpoint
    let ck = bad_ck(d.path(), "i", &s);
    for f in st::safetensors_files(&ck).unwrap() {
        let (mut h, data) = read_st(&f);
        let keys: Vec<String> = h
            .keys()
            .filter(|k| k.contains("ngram_embedding"))
            .cloned()
            .collect();
        for k in keys {
            h.remove(&k);
        }
        write_st(&f, &h, &data);
    }
    edit_index(&ck, |m| m.retain(|k, _| !k.contains("ngram_embedding")));
    assert_bad(&ck, &["no PLE n-gram table"]);
}

/// Runs `f` on another thread; fails the test if it takes longer than 20 s (a blocking open of a
/// FIFO never returns).
fn within_20s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("hung (blocked on a FIFO?)")
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn bad_files_fifos_overlaps_and_empty_paths() {
    let d = tempfile::tempdir().unwrap();
    let s = spec(RowFormat::Fp8, 1);

    // a FIFO shard or config.json: a Format error naming it, never a hang
    for (name, victim) in [("fifo-shard", None), ("fifo-config", Some("config.json"))] {
        let ck = bad_ck(d.path(), name, &s);
        let p = match victim {
            Some(f) => ck.join(f),
            None => st::safetensors_files(&ck).unwrap()[0].clone(),
        };
        std::fs::remove_file(&p).unwrap();
        mkfifo(&p);
        let out = ck.parent().unwrap().join("out");
        let (ck2, out2) = (ck.clone(), out.clone());
        let e = within_20s(move || err_of(pack_quiet(&ck2, &out2, &PackOptions::default())));
        assert!(matches!(e, Error::Format(_)), "{e}");
        assert!(e.to_string().contains("is a FIFO"), "{e}");
        assert_nothing_opens(&out);
    }

    // two shards whose data_offsets share bytes: refused, not packed as duplicated rows
    let ck = bad_ck(d.path(), "overlap", &s);
    let w0 = format!("{}.shard_0.weight", s.prefix());
    let w1 = format!("{}.shard_1.weight", s.prefix());
    edit_header_of(&ck, &w0, |h| {
        assert!(h.contains_key(&w1), "shards 0 and 1 share a file");
        let offs = h[&w0]["data_offsets"].clone();
        h.get_mut(&w1).unwrap()["data_offsets"] = offs;
    });
    assert_bad(&ck, &["overlap", &w0, &w1]);

    // empty paths are invalid arguments, not I/O errors about ""
    let ck = bad_ck(d.path(), "ok", &s);
    let e = err_of(pack_quiet(
        Path::new(""),
        &d.path().join("o"),
        &PackOptions::default(),
    ));
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = err_of(pack_quiet(&ck, Path::new(""), &PackOptions::default()));
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

#[test]
fn bad_hash_parameters() {
    let d = tempfile::tempdir().unwrap();
    // neither config.json nor hash tensors
    let mut s = spec(RowFormat::Nvfp4, 1);
    s.write_config = false;
    let ck = bad_ck(d.path(), "a", &s);
    assert_bad(&ck, &["no hash parameters", "config.json"]);

    // hash tensors that disagree with config.json
    let mut s = spec(RowFormat::Nvfp4, 1);
    let mut h = HashParams::derive(&s.config);
    h.multipliers[1] += 2;
    s.hash_tensors = Some(h.clone());
    let ck = bad_ck(d.path(), "b", &s);
    assert_bad(
        &ck,
        &[
            "layer_multipliers",
            "disagrees",
            &h.multipliers[1].to_string(),
        ],
    );

    let mut s = spec(RowFormat::Fp8, 1);
    let mut h = HashParams::derive(&s.config);
    h.head_sizes.swap(0, 1);
    h.offsets = h
        .head_sizes
        .iter()
        .scan(0, |a, &x| {
            let o = *a;
            *a += x;
            Some(o)
        })
        .collect();
    s.hash_tensors = Some(h);
    let ck = bad_ck(d.path(), "c", &s);
    assert_bad(&ck, &["ngram_heads_vocab_sizes", "disagrees"]);

    // only some of the hash tensors
    let s = spec(RowFormat::Bf16, 1).with_hash_tensors();
    let ck = bad_ck(d.path(), "d", &s);
    let name = "model.language_model.layers.1.ple.ple_embedding.ngram_heads_offsets".to_string();
    edit_header_of(&ck, &name, |h| {
        h.remove(&name);
    });
    edit_index(&ck, |m| {
        m.remove(&name);
    });
    assert_bad(&ck, &["incomplete hash tensors", "ngram_heads_offsets"]);

    // a shard count other than config.json's split_ngram_parts
    let s = spec(RowFormat::Bf16, 1);
    let ck = bad_ck(d.path(), "e", &s);
    let cfg = ck.join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("\"split_ngram_parts\": 4", "\"split_ngram_parts\": 8"),
    )
    .unwrap();
    assert_bad(&ck, &["missing shard 4"]);
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
    // middle of the table, so the kill lands mid-pack deterministically.
    let mut child = Command::new(PLE)
        .args(["pack", "--progress-lines", "--buffer-bytes", "4096"])
        .arg(&ck)
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let sz = unsafe { libc::fcntl(stderr.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
    assert!(sz > 0, "F_SETPIPE_SZ: {}", std::io::Error::last_os_error());
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
    let name = unsafe { std::ffi::CStr::from_ptr(i.source_name.as_ptr()) };
    assert_eq!(name.to_str().unwrap(), "ck");
    let fp = unsafe { std::ffi::CStr::from_ptr(i.source_fingerprint.as_ptr()) };
    assert_eq!(fp.to_str().unwrap(), fingerprint(&ck).unwrap());

    // a long multi-byte name is truncated at a character boundary, NUL-terminated
    let long = "é".repeat(300);
    let ck2 = d.path().join(&long[..200]);
    write_checkpoint(&ck2, &spec(RowFormat::Bf16, 3)).unwrap();
    let out2 = d.path().join("t2");
    pack_quiet(&ck2, &out2, &PackOptions::default()).unwrap();
    let i = ple::info_to_c(&ple_core::format::table::table_info(&open(&out2).unwrap()));
    let name = unsafe { std::ffi::CStr::from_ptr(i.source_name.as_ptr()) };
    let s = name.to_str().expect("valid UTF-8 after truncation");
    assert!(s.len() <= 255 && s.chars().all(|c| c == 'é') && !s.is_empty());
}

extern "C" fn cancel_at_half(done: u64, total: u64, user: *mut std::ffi::c_void) -> i32 {
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
    assert_eq!(unsafe { ple::ple_pack_options_default(o.as_mut_ptr()) }, 0);
    let mut o = unsafe { o.assume_init() };
    o.buffer_bytes = 16 << 10;
    let mut calls = 0u64;
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
    let st = unsafe {
        ple::ple_pack(
            c_ck.as_ptr(),
            c_out.as_ptr(),
            std::ptr::null(),
            None,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(st, 0);
    assert_rows(&open(&out).unwrap(), 4, RowFormat::Fp8);
    o.buffer_bytes = 1;
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
