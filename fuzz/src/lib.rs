//! The bodies of libple's fuzz targets, shared by the libFuzzer entry points (`fuzz_targets/`,
//! nightly) and the stable driver (`src/bin/stable.rs`). Each body feeds arbitrary bytes to one
//! reader of libple and checks, beyond "no panic, no hang", the invariants the reader promises
//! when it accepts its input.
//!
//! Built with overflow checks and debug assertions on (see `Cargo.toml`), so a size computation
//! that would wrap is a crash here even where release builds would wrap silently.

mod batch;
pub mod seeds;

pub use batch::batch_context;

use ple_core::format::checkpoint::Checkpoint;
use ple_core::format::python_table::PythonTableJson;
use ple_core::format::safetensors::{SafetensorsHeader, parse_header};
use ple_core::format::table::{MAX_FILE_BYTES, TableMeta};
use ple_core::lookup::hash::Hasher;
use ple_core::model::{HashParams, ModelConfig};
use std::path::{Path, PathBuf};

/// The invariants of an accepted safetensors header: every tensor inside the data section, no
/// two sharing a byte, names unique, lengths matching shapes for whole-byte dtypes.
fn check_header(h: &SafetensorsHeader) {
    let mut spans: Vec<(u64, u64)> = Vec::new();
    let mut names = std::collections::HashSet::new();
    for t in &h.tensors {
        assert!(names.insert(t.name.as_str()), "duplicate name accepted");
        assert!(t.offset >= h.data_start, "tensor before the data section");
        let end = t.offset.checked_add(t.len).expect("end overflows");
        assert!(end <= h.file_size, "tensor past the end of the file");
        if let Some(sz) = ple_core::format::safetensors::dtype_size(&t.dtype) {
            assert_eq!(t.numel().and_then(|n| n.checked_mul(sz)), Some(t.len));
        }
        if t.len > 0 {
            spans.push((t.offset, end));
        }
    }
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlapping tensors accepted: {w:?}");
    }
}

/// Target `safetensors_header`: `data` is the start of a safetensors file (8-byte length, JSON
/// header, data). Parsed in memory, as `read_header` parses what it reads.
pub fn safetensors_header(data: &[u8]) -> bool {
    let Some(len) = data.get(..8) else {
        return false;
    };
    let n = u64::from_le_bytes(len.try_into().expect("8 bytes"));
    let Some(end) = n.checked_add(8).filter(|&e| e <= data.len() as u64) else {
        return false; // read_header_bytes refuses it before parsing
    };
    let path = Path::new("fuzz.safetensors");
    match parse_header(&data[..end as usize], data.len() as u64, path) {
        Ok(h) => {
            check_header(&h);
            true
        }
        Err(_) => false,
    }
}

/// A per-process scratch directory (the checkpoint target writes its files there).
fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ple-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch directory");
    d
}

/// Largest zero padding the checkpoint target appends to a file.
const MAX_PAD: u64 = 1 << 20;

/// Target `checkpoint_dir`: `data` = `[flags u8][pad u32 LE][config_len u16 LE][config.json]
/// [safetensors file]`. The file (plus `pad` zero bytes, at most 1 MiB, sparse) becomes
/// `model.safetensors` (flags bit 0 clear) or `model-00001-of-00001.safetensors` with an index
/// listing its tensors (bit 0 set); config.json is written when bit 1 is set. Then
/// `Checkpoint::open` and, if it accepts, `table_meta`, whose result must validate and match.
pub fn checkpoint_dir(data: &[u8]) -> bool {
    let Some((head, rest)) = data.split_at_checked(7) else {
        return false;
    };
    let flags = head[0];
    let pad = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as u64 % (MAX_PAD + 1);
    let clen = u16::from_le_bytes(head[5..7].try_into().expect("2 bytes")) as usize;
    let Some((config, file)) = rest.split_at_checked(clen) else {
        return false;
    };
    let dir = scratch().join("ck");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("checkpoint directory");
    let name = if flags & 1 != 0 {
        "model-00001-of-00001.safetensors"
    } else {
        "model.safetensors"
    };
    let p = dir.join(name);
    std::fs::write(&p, file).expect("write file");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .expect("reopen");
    f.set_len(file.len() as u64 + pad).expect("pad");
    if flags & 1 != 0 {
        write_index(&dir, file, name);
    }
    if flags & 2 != 0 {
        std::fs::write(dir.join("config.json"), config).expect("write config");
    }
    let Ok(ck) = Checkpoint::open(&dir) else {
        return false;
    };
    {
        assert_eq!(ck.shards.len(), ck.num_shards as usize);
        assert!(ck.global_scale.is_finite() && ck.global_scale > 0.0);
        ck.hash
            .validate()
            .expect("accepted hash parameters validate");
        if let Ok(m) = ck.table_meta() {
            m.validate().expect("table_meta validates");
            assert_eq!(m.checked_file_bytes(), Some(m.file_bytes()));
            assert_eq!(m.total_rows, ck.total_rows());
        }
        let again = ple_core::format::fingerprint::fingerprint(&dir).expect("fingerprint");
        assert_eq!(again, ck.fingerprint, "fingerprint not deterministic");
    }
    true
}

/// An index naming every tensor of the header of `file` (if it parses) in `name`.
fn write_index(dir: &Path, file: &[u8], name: &str) {
    let mut map = serde_json::Map::new();
    if let Some(n) = file.get(..8) {
        let n = u64::from_le_bytes(n.try_into().expect("8 bytes"));
        let json = usize::try_from(n)
            .ok()
            .and_then(|n| file.get(8..8usize.checked_add(n)?));
        if let Some(Ok(serde_json::Value::Object(h))) = json.map(serde_json::from_slice) {
            for k in h.keys().filter(|k| *k != "__metadata__") {
                map.insert(k.clone(), name.into());
            }
        }
    }
    let v = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), v.to_string()).expect("index");
}

/// Row ids of a few tokens under `p` (validated) must lie in the addressed rows.
fn check_ids(p: &HashParams) {
    let h = Hasher::new(p).expect("validated parameters build a hasher");
    let k = h.context_len();
    let mut out = vec![0u64; h.num_heads()];
    let addressed = p.addressed_rows();
    let last = i32::try_from(p.vocab_size - 1).unwrap_or(i32::MAX);
    for tok in [0, p.eos_token_id, last] {
        let ctx = vec![p.eos_token_id; k];
        h.ids(tok, &ctx, &mut out);
        assert!(
            out.iter().all(|&id| id < addressed),
            "row id past the heads"
        );
        let mut reference = vec![0u64; h.num_heads()];
        h.ids_reference(tok, &ctx, &mut reference);
        assert_eq!(out, reference, "fast and reference hash differ");
    }
}

/// Target `table_json`: `data` is a `table.json`. If it validates, every size is consistent
/// (the file size does not overflow and is within the limit) and the hash addresses only
/// rows inside the table.
pub fn table_json(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let Ok(m) = TableMeta::from_json(text, Path::new("table.json")) else {
        return false;
    };
    let bytes = m.checked_file_bytes().expect("validated: no overflow");
    assert!(bytes <= MAX_FILE_BYTES);
    assert_eq!(
        Some(m.total_rows),
        m.rows_per_shard.checked_mul(m.num_shards as u64)
    );
    assert!(m.hash.addressed_rows() <= m.total_rows);
    assert_eq!(m.num_heads as usize, m.hash.num_heads());
    check_ids(&m.hash);
    true
}

/// Target `python_table_json`: `data` = `[split u16 LE][Python-tool JSON][config.json]`. The
/// JSON is parsed as `<name>.packed_u8.json`, its row format resolved for head_dim 160; the
/// config is parsed as `config.json` and, if accepted, its hash parameters derived and checked.
pub fn python_table_json(data: &[u8]) -> bool {
    let Some((split, rest)) = data.split_at_checked(2) else {
        return false;
    };
    let at = (u16::from_le_bytes(split.try_into().expect("2 bytes")) as usize).min(rest.len());
    let (py, config) = rest.split_at(at);
    let mut accepted = false;
    if let Ok(text) = std::str::from_utf8(py)
        && let Ok(j) = PythonTableJson::parse(text, Path::new("t.packed_u8.json"))
    {
        accepted = true;
        assert_eq!(j.codes_width.checked_add(j.scales_width), Some(j.row_width));
        if let Ok(f) = j.row_format(160, Path::new("t.packed_u8.json")) {
            assert_eq!(f.code_bytes(160), j.codes_width as usize);
            assert_eq!(f.scale_bytes(160), j.scales_width as usize);
        }
    }
    if let Ok(text) = std::str::from_utf8(config)
        && let Ok(c) = ple_core::format::checkpoint::parse_config(text, Path::new("config.json"))
    {
        config_invariants(&c);
        accepted = true;
    }
    accepted
}

fn config_invariants(c: &ModelConfig) {
    c.validate().expect("parsed config validates");
    assert!(c.num_heads() >= 1 && c.head_dim() >= 1);
    // The prime search costs up to ~1 s at the bounds config.json may reach; keep the fuzzer fast.
    if c.ngram_vocab_size_base > 1 << 24 || (c.ple_layer_index + 1) * c.num_heads() as u64 > 64 {
        return;
    }
    let p = HashParams::derive(c);
    assert_eq!(p.num_heads(), c.num_heads());
    // derived parameters may still be refused (e.g. a multiplier overflowing i64), never panic
    if p.validate().is_ok() {
        check_ids(&p);
    }
}
