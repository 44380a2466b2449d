//! Packing bad checkpoints: each a clear `Format` (or `InvalidArgument`) error naming what is
//! wrong, never a hang, and nothing at the destination (`docs/FORMAT.md#safetensors-checkpoints`).

mod common;

use common::*;
use ple_core::error::Error;
use ple_core::format::pack::PackOptions;
use ple_core::format::safetensors as st;
use ple_core::model::{HashParams, RowFormat};
use ple_testkit::synth::Scale2Layout;
use std::path::Path;

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

    // F32 rows: a shard of another dtype over the same bytes ([rows, 320] BF16) is refused, not
    // converted; so is F16, which no row format stores exactly as is
    let s3 = spec(RowFormat::F32, 1);
    let ck = bad_ck(d.path(), "g", &s3);
    let name = format!("{p}.shard_2.weight");
    edit_header_of(&ck, &name, |h| {
        h[&name]["dtype"] = "BF16".into();
        h[&name]["shape"] = serde_json::json!([rows, 320]);
    });
    assert_bad(&ck, &[&name, "wrong dtype", "expected F32", "found BF16"]);
    let ck = bad_ck(d.path(), "h", &s3);
    let name = format!("{p}.shard_0.weight");
    edit_header_of(&ck, &name, |h| {
        h[&name]["dtype"] = "F16".into();
        h[&name]["shape"] = serde_json::json!([rows, 320]);
    });
    assert_bad(&ck, &[&name, "F16", "not a PLE storage dtype"]);
    // an F32 shard of 80 columns over the same bytes ([2 * rows, 80]) is a shape error
    let ck = bad_ck(d.path(), "i", &s3);
    let name = format!("{p}.shard_1.weight");
    edit_header_of(&ck, &name, |h| {
        h[&name]["shape"] = serde_json::json!([rows * 2, 80]);
    });
    assert_bad(
        &ck,
        &[
            &name,
            "wrong shape",
            &format!("[{rows}, 160]"),
            &format!("[{}, 80]", rows * 2),
        ],
    );
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
