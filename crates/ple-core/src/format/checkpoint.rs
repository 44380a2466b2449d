//! Reading safetensors checkpoints (SPEC §4): the index, shard headers, the PLE shards, the global
//! scale and the hash tensors.
//!
//! Only headers and a few scalar tensors are read here; the packer reads the shard data itself,
//! range by range. Every tensor's `data_offsets` are checked against the file size, so a truncated
//! file is a [`Error::Format`] at open time, not a short read later.

use crate::error::{Error, Result};
use crate::format::table::{FORMAT_VERSION, ROWS_FILE, SourceInfo, TableMeta};
use crate::model::{HEAD_DIM, HashParams, ModelConfig, RowFormat};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Name of the index file of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the model config beside the safetensors files.
pub const CONFIG_FILE: &str = "config.json";
/// How the first PLE shard's name ends; the text before `.shard_0.weight` is the prefix.
pub const SHARD0_SUFFIX: &str = ".ngram_embedding.shard_0.weight";
/// Names (last component) of the three hash tensors a checkpoint may ship.
pub const HASH_TENSOR_KEYS: [&str; 3] = [
    "layer_multipliers",
    "ngram_heads_vocab_sizes",
    "ngram_heads_offsets",
];

/// Largest safetensors JSON header accepted (the format's own limit).
const MAX_HEADER: u64 = 100 << 20;
/// Largest tensor read whole into memory (scales, hash tensors).
const MAX_SMALL_TENSOR: u64 = 1 << 20;

/// Parses the index file and returns its `weight_map` (tensor name → file name).
pub fn read_index(dir: &Path) -> Result<BTreeMap<String, String>> {
    let index = dir.join(INDEX_FILE);
    let text = std::fs::read_to_string(&index).map_err(|e| Error::io_path("reading", &index, e))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Format(format!("{}: invalid JSON: {e}", index.display())))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::Format(format!("{}: no 'weight_map' object", index.display())))?;
    let mut out = BTreeMap::new();
    for (name, f) in map {
        let f = f.as_str().ok_or_else(|| {
            Error::Format(format!(
                "{}: weight_map['{name}'] is not a file name",
                index.display()
            ))
        })?;
        if f.is_empty() || f.contains('/') || f.starts_with('.') {
            return Err(Error::Format(format!(
                "{}: weight_map['{name}'] = '{f}' is not a plain file name",
                index.display()
            )));
        }
        out.insert(name.clone(), f.to_string());
    }
    Ok(out)
}

/// The safetensors files of a checkpoint, sorted by name: those the index names, or the single file.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join(INDEX_FILE);
    if index.exists() {
        let mut files: Vec<PathBuf> = read_index(dir)?.values().map(|f| dir.join(f)).collect();
        files.sort();
        files.dedup();
        Ok(files)
    } else if dir.join(SINGLE_FILE).exists() {
        Ok(vec![dir.join(SINGLE_FILE)])
    } else if !dir.is_dir() {
        Err(Error::io_path(
            "opening checkpoint",
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
        ))
    } else {
        Err(Error::Format(format!(
            "{}: neither {INDEX_FILE} nor {SINGLE_FILE} found",
            dir.display()
        )))
    }
}

/// Reads the 8-byte length and the JSON header of a safetensors file (bounded: never the data).
pub fn read_header_bytes(path: &Path) -> Result<Vec<u8>> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io_path("opening", path, e))?;
    let size = f
        .metadata()
        .map_err(|e| Error::io_path("stat", path, e))?
        .len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|_| {
        Error::Format(format!(
            "{}: shorter than the 8-byte safetensors header length",
            path.display()
        ))
    })?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER || 8 + n > size {
        return Err(Error::Format(format!(
            "{}: header length {n} runs past the end of the {size}-byte file (truncated or not safetensors)",
            path.display()
        )));
    }
    let mut buf = vec![0u8; 8 + n as usize];
    buf[..8].copy_from_slice(&len);
    f.read_exact(&mut buf[8..])
        .map_err(|e| Error::io_path("reading header of", path, e))?;
    Ok(buf)
}

/// Bytes per element of a safetensors dtype (None for sub-byte or unknown dtypes).
pub fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" | "C64" => 8,
        _ => return None,
    })
}

/// One tensor of a safetensors file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Absolute byte offset of the tensor's data in its file.
    pub offset: u64,
    /// Bytes of data.
    pub len: u64,
}

impl TensorInfo {
    /// Number of elements (product of the shape; 1 for a scalar).
    pub fn numel(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }
}

/// The parsed header of one safetensors file; tensors in header order.
#[derive(Clone, Debug)]
pub struct SafetensorsHeader {
    pub path: PathBuf,
    pub file_size: u64,
    /// Offset of the data section (8 + header length).
    pub data_start: u64,
    pub tensors: Vec<TensorInfo>,
}

impl SafetensorsHeader {
    /// The tensor called `name`, if the file has it.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Header entries in file order, keeping duplicates (serde_json's maps would silently keep one).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut v = Vec::new();
                while let Some((k, val)) = m.next_entry::<String, serde_json::Value>()? {
                    v.push((k, val));
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Reads and validates the header of a safetensors file: JSON well-formed, no duplicate names,
/// every tensor's `data_offsets` ordered, inside the file, and (for known dtypes) matching its shape.
pub fn read_header(path: &Path) -> Result<SafetensorsHeader> {
    let bytes = read_header_bytes(path)?;
    let file_size = std::fs::metadata(path)
        .map_err(|e| Error::io_path("stat", path, e))?
        .len();
    let data_start = bytes.len() as u64;
    let entries: Entries = serde_json::from_slice(&bytes[8..]).map_err(|e| {
        Error::Format(format!(
            "{}: safetensors header is not valid JSON: {e}",
            path.display()
        ))
    })?;
    let data_len = file_size - data_start;
    let mut seen = std::collections::HashSet::new();
    let mut tensors = Vec::with_capacity(entries.0.len());
    for (name, v) in entries.0 {
        if name == "__metadata__" {
            continue;
        }
        if !seen.insert(name.clone()) {
            return Err(Error::Format(format!(
                "{}: tensor '{name}' appears twice in the header (duplicate)",
                path.display()
            )));
        }
        let raw: RawTensor = serde_json::from_value(v).map_err(|e| {
            Error::Format(format!(
                "{}: header entry of tensor '{name}' is malformed: {e}",
                path.display()
            ))
        })?;
        let [b, e] = raw.data_offsets;
        if b > e {
            return Err(Error::Format(format!(
                "{}: tensor '{name}' has data_offsets [{b}, {e}] (begin after end)",
                path.display()
            )));
        }
        if e > data_len {
            return Err(Error::Format(format!(
                "{}: tensor '{name}' ends at data byte {e} but the file holds only {data_len} data bytes (truncated file)",
                path.display()
            )));
        }
        let t = TensorInfo {
            name,
            dtype: raw.dtype,
            shape: raw.shape,
            offset: data_start + b,
            len: e - b,
        };
        if let Some(sz) = dtype_size(&t.dtype) {
            let want = t.numel().and_then(|n| n.checked_mul(sz));
            if want != Some(t.len) {
                return Err(Error::Format(format!(
                    "{}: tensor '{}' ({} {:?}) needs {:?} bytes but its data_offsets span {}",
                    path.display(),
                    t.name,
                    t.dtype,
                    t.shape,
                    want,
                    t.len
                )));
            }
        }
        tensors.push(t);
    }
    Ok(SafetensorsHeader {
        path: path.to_path_buf(),
        file_size,
        data_start,
        tensors,
    })
}

/// Bytes of each data sample the fingerprint hashes.
const SAMPLE: u64 = 4096;
/// Evenly spaced samples per file.
const FILE_SAMPLES: u64 = 16;

/// Hashes `n` evenly spaced `SAMPLE`-byte blocks of `[start, end)` of `f` (the whole range when
/// it is smaller than `n` blocks).
fn hash_samples(
    h: &mut Sha256,
    f: &std::fs::File,
    path: &Path,
    start: u64,
    end: u64,
    n: u64,
) -> Result<()> {
    let len = end.saturating_sub(start);
    let mut buf = vec![0u8; SAMPLE as usize];
    let mut read = |off: u64, len: u64, h: &mut Sha256| -> Result<()> {
        let b = &mut buf[..len as usize];
        f.read_exact_at(b, off).map_err(|e| {
            Error::Format(format!(
                "{}: cannot read data at byte {off} ({e}): truncated file?",
                path.display()
            ))
        })?;
        h.update(off.to_le_bytes());
        h.update(&*b);
        Ok(())
    };
    if len <= n * SAMPLE {
        let mut o = start;
        while o < end {
            let l = SAMPLE.min(end - o);
            read(o, l, h)?;
            o += l;
        }
    } else {
        for k in 0..n {
            read(start + k * (len - SAMPLE) / (n - 1), SAMPLE, h)?;
        }
    }
    Ok(())
}

/// Fingerprint of a checkpoint: hex SHA-256 over the index file (if any) and, in name order, each
/// safetensors file's name, size, header and a sparse sample of its data (16 blocks of 4 KiB
/// evenly spaced over the data section, plus the first, middle and last 4 KiB of every PLE shard
/// tensor `*.ngram_embedding.shard_*`). Cheap (headers and a few hundred small reads), and it
/// changes with any tensor's dtype, shape or offsets, the files' sizes, and, with overwhelming
/// likelihood, with different weights of the same shapes (two checkpoints whose headers are
/// byte-identical still fingerprint apart).
pub fn fingerprint(dir: &Path) -> Result<String> {
    let mut h = Sha256::new();
    let index = dir.join(INDEX_FILE);
    if index.exists() {
        let bytes = std::fs::read(&index).map_err(|e| Error::io_path("reading", &index, e))?;
        h.update(b"index\0");
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    for path in safetensors_files(dir)? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let f = std::fs::File::open(&path).map_err(|e| Error::io_path("opening", &path, e))?;
        let size = f
            .metadata()
            .map_err(|e| Error::io_path("stat", &path, e))?
            .len();
        let header = read_header_bytes(&path)?;
        h.update(b"file\0");
        h.update(name.as_bytes());
        h.update([0]);
        h.update(size.to_le_bytes());
        h.update(&header);
        h.update(b"samples\0");
        hash_samples(&mut h, &f, &path, header.len() as u64, size, FILE_SAMPLES)?;
        let parsed = read_header(&path)?;
        let mut ple: Vec<&TensorInfo> = parsed
            .tensors
            .iter()
            .filter(|t| t.name.contains(".ngram_embedding.shard_"))
            .collect();
        ple.sort_by(|a, b| a.name.cmp(&b.name));
        for t in ple {
            h.update(t.name.as_bytes());
            h.update([0]);
            hash_samples(&mut h, &f, &path, t.offset, t.offset + t.len, 3)?;
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A tensor and the file that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub path: PathBuf,
    pub info: TensorInfo,
}

impl TensorRef {
    /// Reads a small tensor's bytes (scales, hash tensors; at most 1 MiB).
    pub fn read_small(&self) -> Result<Vec<u8>> {
        if self.info.len > MAX_SMALL_TENSOR {
            return Err(Error::Format(format!(
                "tensor '{}' in {} has {} bytes, too large for a scale or hash tensor",
                self.info.name,
                self.path.display(),
                self.info.len
            )));
        }
        let f = std::fs::File::open(&self.path)
            .map_err(|e| Error::io_path("opening", &self.path, e))?;
        let mut buf = vec![0u8; self.info.len as usize];
        f.read_exact_at(&mut buf, self.info.offset)
            .map_err(|e| Error::io_path("reading tensor data of", &self.path, e))?;
        Ok(buf)
    }

    fn describe(&self) -> String {
        format!(
            "tensor '{}' ({} {:?}) in {}",
            self.info.name,
            self.info.dtype,
            self.info.shape,
            self.path
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        )
    }
}

/// The source tensors of one shard of the PLE table.
#[derive(Clone, Debug)]
pub struct ShardSource {
    /// `prefix.shard_{i}.weight`: NVFP4 codes (U8), FP8 bytes or BF16 values.
    pub weight: TensorRef,
    /// NVFP4 only: `prefix.shard_{i}.weight_scale` (F8_E4M3 block scales).
    pub scales: Option<TensorRef>,
}

/// Where the hash parameters came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashSource {
    /// The checkpoint's hash tensors (no config.json).
    Tensors,
    /// Derived from config.json (no hash tensors).
    Config,
    /// Both present and equal.
    Both,
}

/// A checkpoint's PLE table, located and checked: every shard's dtype and shape, the global
/// scale, the hash parameters. Only headers and scalar tensors have been read.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    /// The checkpoint's directory name.
    pub name: String,
    pub fingerprint: String,
    pub format: RowFormat,
    /// E.g. `model.language_model.layers.1.ple.ple_embedding.ngram_embedding`.
    pub prefix: String,
    pub num_shards: u32,
    pub rows_per_shard: u64,
    pub head_dim: usize,
    pub global_scale: f32,
    pub hash: HashParams,
    pub hash_source: HashSource,
    /// config.json's constants, when the checkpoint has one.
    pub config: Option<ModelConfig>,
    pub shards: Vec<ShardSource>,
}

/// Reads `dir/config.json` if present.
pub fn read_config(path: &Path) -> Result<ModelConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io_path("reading", path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Format(format!("{}: invalid JSON: {e}", path.display())))?;
    ModelConfig::from_config_json(&v)
        .map_err(|e| Error::Format(format!("{}: {}", path.display(), strip_format(&e))))
}

fn strip_format(e: &Error) -> String {
    match e {
        Error::Format(m) => m.clone(),
        other => other.to_string(),
    }
}

/// The name of a directory (its last component, after resolving `.` and `..`).
pub fn dir_name(dir: &Path) -> String {
    let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    canon
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| canon.display().to_string())
}

/// The tensors of all files, by name, with the file that holds each.
struct Tensors {
    by_name: HashMap<String, TensorRef>,
    /// Names found in two files: (name, first file, second file).
    duplicates: Vec<(String, PathBuf, PathBuf)>,
}

impl Tensors {
    fn get(&self, name: &str) -> Option<&TensorRef> {
        self.by_name.get(name)
    }
}

fn load_tensors(dir: &Path) -> Result<(Tensors, Option<BTreeMap<String, String>>)> {
    let files = safetensors_files(dir)?;
    let index = if dir.join(INDEX_FILE).exists() {
        Some(read_index(dir)?)
    } else {
        None
    };
    let mut by_name: HashMap<String, TensorRef> = HashMap::new();
    let mut duplicates = Vec::new();
    for f in &files {
        if !f.exists() {
            return Err(Error::Format(format!(
                "{}: the index names shard file {} but it does not exist",
                dir.join(INDEX_FILE).display(),
                f.file_name().unwrap_or_default().to_string_lossy()
            )));
        }
        let h = read_header(f)?;
        for t in h.tensors {
            let name = t.name.clone();
            let r = TensorRef {
                path: f.clone(),
                info: t,
            };
            if let Some(prev) = by_name.get(&name) {
                duplicates.push((name, prev.path.clone(), f.clone()));
            } else {
                by_name.insert(name, r);
            }
        }
    }
    Ok((
        Tensors {
            by_name,
            duplicates,
        },
        index,
    ))
}

fn as_scalar_f32(t: &TensorRef) -> Result<f32> {
    let ok_shape = t.info.shape.is_empty() || t.info.shape == [1];
    if !ok_shape || !matches!(t.info.dtype.as_str(), "F32" | "BF16" | "F16") {
        return Err(Error::Format(format!(
            "{}: expected a scalar global scale, F32 (or BF16/F16) of shape [] or [1]",
            t.describe()
        )));
    }
    let b = t.read_small()?;
    let v = match t.info.dtype.as_str() {
        "F32" => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        "BF16" => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        _ => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
    };
    if !(v.is_finite() && v > 0.0) {
        return Err(Error::Format(format!(
            "{}: global scale {v} is not a positive finite number",
            t.describe()
        )));
    }
    Ok(v)
}

fn as_ints(t: &TensorRef, want_len: Option<usize>) -> Result<Vec<u64>> {
    let sz = match t.info.dtype.as_str() {
        "I64" | "U64" => 8,
        "I32" | "U32" => 4,
        "I16" | "U16" => 2,
        "I8" | "U8" => 1,
        _ => {
            return Err(Error::Format(format!(
                "{}: expected an integer dtype (I64, I32, U64, …)",
                t.describe()
            )));
        }
    };
    if t.info.shape.len() != 1 || want_len.is_some_and(|n| t.info.shape[0] != n as u64) {
        return Err(Error::Format(format!(
            "{}: expected shape [{}]",
            t.describe(),
            want_len.map(|n| n.to_string()).unwrap_or("n".into())
        )));
    }
    let b = t.read_small()?;
    let signed = t.info.dtype.starts_with('I');
    let mut out = Vec::with_capacity(b.len() / sz);
    for c in b.chunks_exact(sz) {
        let mut w = [0u8; 8];
        w[..sz].copy_from_slice(c);
        let mut v = u64::from_le_bytes(w);
        if signed && sz < 8 && c[sz - 1] & 0x80 != 0 {
            v |= !0u64 << (sz * 8);
        }
        if signed && (v as i64) < 0 {
            return Err(Error::Format(format!(
                "{}: negative value {}",
                t.describe(),
                v as i64
            )));
        }
        out.push(v);
    }
    Ok(out)
}

/// Finds one hash tensor: under the PLE module first, else anywhere by its last component.
fn find_hash_tensor<'a>(
    tensors: &'a Tensors,
    module: &str,
    key: &str,
) -> Result<Option<&'a TensorRef>> {
    let exact = format!("{module}.{key}");
    if let Some(t) = tensors.get(&exact) {
        return Ok(Some(t));
    }
    let suffix = format!(".{key}");
    let mut found: Vec<&TensorRef> = tensors
        .by_name
        .values()
        .filter(|t| t.info.name.ends_with(&suffix) || t.info.name == key)
        .collect();
    found.sort_by(|a, b| a.info.name.cmp(&b.info.name));
    let under: Vec<&TensorRef> = found
        .iter()
        .copied()
        .filter(|t| t.info.name.starts_with(&format!("{module}.")))
        .collect();
    let pick = if !under.is_empty() { under } else { found };
    match pick.len() {
        0 => Ok(None),
        1 => Ok(Some(pick[0])),
        _ => Err(Error::Format(format!(
            "several hash tensors named *.{key}: {}",
            pick.iter()
                .map(|t| t.info.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

fn first_diff(a: &[u64], b: &[u64]) -> String {
    if a.len() != b.len() {
        return format!("{} values vs {}", a.len(), b.len());
    }
    let i = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0);
    format!("[{i}] = {} vs {}", a[i], b[i])
}

impl Checkpoint {
    /// Locates and checks the PLE table of the checkpoint in `dir` (SPEC §4).
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        if dir.exists() && !dir.is_dir() {
            return Err(Error::Format(format!(
                "{} is a file; give the checkpoint's directory (holding {INDEX_FILE} or {SINGLE_FILE})",
                dir.display()
            )));
        }
        if !dir.is_dir() {
            return Err(Error::io_path(
                "opening checkpoint",
                dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
            ));
        }
        let (tensors, index) = load_tensors(dir)?;
        let fingerprint = fingerprint(dir)?;
        let d = dir.display();

        // The prefix: find `*.ngram_embedding.shard_0.weight`, never a hard-coded layer.
        let mut prefixes: Vec<String> = tensors
            .by_name
            .keys()
            .filter_map(|n| {
                n.strip_suffix(".shard_0.weight")
                    .filter(|_| n.ends_with(SHARD0_SUFFIX))
                    .map(str::to_string)
            })
            .collect();
        prefixes.sort();
        let prefix = match prefixes.len() {
            1 => prefixes.pop().unwrap(),
            0 => {
                let mut any: Vec<&String> = tensors
                    .by_name
                    .keys()
                    .filter(|n| n.contains(".ngram_embedding.shard_"))
                    .collect();
                any.sort();
                return Err(match any.first() {
                    Some(n) => Error::Format(format!(
                        "{d}: missing shard 0: the checkpoint has PLE shard tensors (e.g. '{n}') but no '*{SHARD0_SUFFIX}'"
                    )),
                    None => Error::Format(format!(
                        "{d}: no PLE n-gram table: no tensor named '*{SHARD0_SUFFIX}' among the {} tensors",
                        tensors.by_name.len()
                    )),
                });
            }
            _ => {
                return Err(Error::Format(format!(
                    "{d}: several PLE tables: {} (one PLE layer expected)",
                    prefixes.join(", ")
                )));
            }
        };
        let module = prefix
            .strip_suffix(".ngram_embedding")
            .unwrap_or(&prefix)
            .to_string();
        if let Some((n, a, b)) = tensors.duplicates.iter().find(|(n, _, _)| {
            n.starts_with(&module) || HASH_TENSOR_KEYS.iter().any(|k| n.ends_with(k))
        }) {
            return Err(Error::Format(format!(
                "{d}: tensor '{n}' is duplicated: it is in both {} and {}",
                a.display(),
                b.display()
            )));
        }
        // The index must agree with the headers for every PLE tensor.
        if let Some(map) = &index {
            for (name, file) in map.iter().filter(|(n, _)| n.starts_with(&module)) {
                match tensors.get(name) {
                    None => {
                        return Err(Error::Format(format!(
                            "{d}: the index names tensor '{name}' in {file}, but no safetensors file holds it{}",
                            shard_hint(&prefix, name)
                        )));
                    }
                    Some(t)
                        if t.path
                            .file_name()
                            .map(|f| f.to_string_lossy() != *file)
                            .unwrap_or(true) =>
                    {
                        return Err(Error::Format(format!(
                            "{d}: the index puts tensor '{name}' in {file}, but it is in {}",
                            t.path.display()
                        )));
                    }
                    _ => {}
                }
            }
            for (name, t) in tensors
                .by_name
                .iter()
                .filter(|(n, _)| n.starts_with(&prefix))
            {
                if !map.contains_key(name) {
                    return Err(Error::Format(format!(
                        "{d}: tensor '{name}' is in {} but the index does not list it",
                        t.path.display()
                    )));
                }
            }
        }

        let config_path = dir.join(CONFIG_FILE);
        let config = if config_path.exists() {
            Some(read_config(&config_path)?)
        } else {
            None
        };

        // Shard tensors: prefix.shard_{i}.{suffix}.
        let shard_head = format!("{prefix}.shard_");
        let mut shard_tensors: BTreeMap<(u64, String), &TensorRef> = BTreeMap::new();
        for (name, t) in tensors.by_name.iter() {
            let Some(rest) = name.strip_prefix(&shard_head) else {
                continue;
            };
            let (idx, suffix) = rest.split_once('.').unwrap_or((rest, ""));
            let i: u64 = match idx.parse() {
                Ok(i) if idx.bytes().all(|c| c.is_ascii_digit()) => i,
                _ => {
                    return Err(Error::Format(format!(
                        "{d}: tensor '{name}': '{idx}' is not a shard index"
                    )));
                }
            };
            if idx != i.to_string() {
                return Err(Error::Format(format!(
                    "{d}: tensor '{name}': shard index '{idx}' is not canonical (duplicate of shard {i}?)"
                )));
            }
            shard_tensors.insert((i, suffix.to_string()), t);
        }
        let max_index = shard_tensors.keys().map(|(i, _)| *i).max().unwrap_or(0);
        let num_shards: u64 = match &config {
            Some(c) => c.split_ngram_parts as u64,
            None => max_index + 1,
        };
        if let Some(((i, s), t)) = shard_tensors.iter().find(|((i, _), _)| *i >= num_shards) {
            return Err(Error::Format(format!(
                "{d}: stray shard {i}: tensor '{}' (suffix '{s}') is beyond the {num_shards} shards config.json's split_ngram_parts declares (shards 0..{})",
                t.info.name,
                num_shards - 1
            )));
        }
        for i in 0..num_shards {
            if !shard_tensors.contains_key(&(i, "weight".to_string())) {
                return Err(Error::Format(format!(
                    "{d}: missing shard {i}: no tensor '{prefix}.shard_{i}.weight' (expected {num_shards} shards, 0..{})",
                    num_shards - 1
                )));
            }
        }

        // Family from shard 0's dtype.
        let w0 = shard_tensors[&(0, "weight".to_string())];
        let format = match w0.info.dtype.as_str() {
            "U8" => RowFormat::Nvfp4,
            "F8_E4M3" => RowFormat::Fp8,
            "BF16" => RowFormat::Bf16,
            other => {
                return Err(Error::Format(format!(
                    "{d}: {}: dtype {other} is not a PLE storage dtype (expected U8 for NVFP4, F8_E4M3 for FP8 or BF16)",
                    w0.describe()
                )));
            }
        };

        // Hash parameters: tensors, config.json, or both (then equal).
        let mut found = Vec::new();
        for k in HASH_TENSOR_KEYS {
            found.push(find_hash_tensor(&tensors, &module, k)?);
        }
        let from_tensors = if found.iter().all(|f| f.is_none()) {
            None
        } else if found.iter().any(|f| f.is_none()) {
            let have: Vec<&str> = found
                .iter()
                .flatten()
                .map(|t| t.info.name.as_str())
                .collect();
            let missing: Vec<&str> = HASH_TENSOR_KEYS
                .iter()
                .zip(&found)
                .filter(|(_, f)| f.is_none())
                .map(|(k, _)| *k)
                .collect();
            return Err(Error::Format(format!(
                "{d}: incomplete hash tensors: found {}, missing *.{}",
                have.join(", "),
                missing.join(", *.")
            )));
        } else {
            let base = config.clone().unwrap_or_default();
            let mults = as_ints(found[0].unwrap(), Some(base.ngram_size as usize))?;
            let sizes = as_ints(found[1].unwrap(), Some(base.num_heads()))?;
            let offsets = as_ints(found[2].unwrap(), Some(base.num_heads()))?;
            let p = HashParams {
                multipliers: mults,
                head_sizes: sizes,
                offsets,
                eos_token_id: base.eos_token_id,
                vocab_size: base.vocab_size,
                ngram_size: base.ngram_size,
                heads_per_ngram: base.heads_per_ngram,
            };
            p.validate()
                .map_err(|e| Error::Format(format!("{d}: hash tensors: {}", strip_format(&e))))?;
            Some(p)
        };
        let from_config = config.as_ref().map(HashParams::derive);
        let (hash, hash_source) = match (from_tensors, from_config) {
            (None, None) => {
                return Err(Error::Format(format!(
                    "{d}: no hash parameters: the checkpoint has neither {CONFIG_FILE} nor hash tensors (*.layer_multipliers, *.ngram_heads_vocab_sizes, *.ngram_heads_offsets)"
                )));
            }
            (Some(t), None) => (t, HashSource::Tensors),
            (None, Some(c)) => (c, HashSource::Config),
            (Some(t), Some(c)) => {
                for (what, a, b) in [
                    ("layer_multipliers", &t.multipliers, &c.multipliers),
                    ("ngram_heads_vocab_sizes", &t.head_sizes, &c.head_sizes),
                    ("ngram_heads_offsets", &t.offsets, &c.offsets),
                ] {
                    if a != b {
                        return Err(Error::Format(format!(
                            "{d}: hash tensor {what} disagrees with the values config.json derives: {} (tensor vs config)",
                            first_diff(a, b)
                        )));
                    }
                }
                (t, HashSource::Both)
            }
        };

        let cfg = config.clone().unwrap_or_default();
        let head_dim = if config.is_some() {
            cfg.head_dim()
        } else {
            HEAD_DIM
        };
        let div = cfg.make_ngram_vocab_size_divisible_by;
        let padded = hash.addressed_rows().div_ceil(div) * div;
        let rows_per_shard = padded.div_ceil(num_shards);
        let cols = match format {
            RowFormat::Nvfp4 => head_dim as u64 / 2,
            RowFormat::Fp8 | RowFormat::Bf16 => head_dim as u64,
        };
        let dtype = w0.info.dtype.clone();
        let mut shards = Vec::with_capacity(num_shards as usize);
        for i in 0..num_shards {
            let w = shard_tensors[&(i, "weight".to_string())];
            check_tensor(w, &dtype, &[rows_per_shard, cols], padded, num_shards)?;
            let scales = if format == RowFormat::Nvfp4 {
                let s = shard_tensors
                    .get(&(i, "weight_scale".to_string()))
                    .ok_or_else(|| {
                        Error::Format(format!(
                            "{d}: NVFP4 shard {i} has no block scales: tensor '{prefix}.shard_{i}.weight_scale' is missing"
                        ))
                    })?;
                check_tensor(
                    s,
                    "F8_E4M3",
                    &[rows_per_shard, head_dim as u64 / 16],
                    padded,
                    num_shards,
                )?;
                Some((*s).clone())
            } else {
                None
            };
            shards.push(ShardSource {
                weight: w.clone(),
                scales,
            });
        }
        let allowed: &[&str] = match format {
            RowFormat::Nvfp4 => &["weight", "weight_scale", "weight_scale_2", "input_scale"],
            RowFormat::Fp8 => &["weight", "weight_scale", "input_scale"],
            RowFormat::Bf16 => &["weight"],
        };
        for ((_, s), t) in &shard_tensors {
            if !allowed.contains(&s.as_str()) {
                log::warn!(
                    "{d}: ignoring tensor '{}' (not part of a {} PLE table)",
                    t.info.name,
                    format.name()
                );
            }
        }

        // The global scale: every copy found must agree.
        let global_scale = match format {
            RowFormat::Bf16 => 1.0,
            RowFormat::Nvfp4 | RowFormat::Fp8 => {
                let key = if format == RowFormat::Nvfp4 {
                    "weight_scale_2"
                } else {
                    "weight_scale"
                };
                let mut copies: Vec<&TensorRef> = Vec::new();
                if let Some(t) = tensors.get(&format!("{prefix}.{key}")) {
                    copies.push(t);
                }
                for ((_, s), t) in &shard_tensors {
                    if s == key {
                        copies.push(t);
                    }
                }
                if copies.is_empty() {
                    return Err(Error::Format(format!(
                        "{d}: {} checkpoint without a global scale: neither '{prefix}.{key}' nor '{prefix}.shard_{{i}}.{key}' exists",
                        format.name()
                    )));
                }
                let first = as_scalar_f32(copies[0])?;
                for c in &copies[1..] {
                    let v = as_scalar_f32(c)?;
                    if v.to_bits() != first.to_bits() {
                        return Err(Error::Format(format!(
                            "{d}: the global scale copies differ: '{}' = {first} but '{}' = {v}",
                            copies[0].info.name, c.info.name
                        )));
                    }
                }
                first
            }
        };

        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            name: dir_name(dir),
            fingerprint,
            format,
            prefix,
            num_shards: num_shards as u32,
            rows_per_shard,
            head_dim,
            global_scale,
            hash,
            hash_source,
            config,
            shards,
        })
    }

    /// Bytes of one packed row.
    pub fn row_bytes(&self) -> usize {
        self.format.row_bytes(self.head_dim)
    }

    /// Rows of the packed table (rows_per_shard × num_shards).
    pub fn total_rows(&self) -> u64 {
        self.rows_per_shard * self.num_shards as u64
    }

    /// The metadata of the table packed from this checkpoint (validated).
    pub fn table_meta(&self) -> Result<TableMeta> {
        let cfg = self.config.clone().unwrap_or_default();
        let f = self.format;
        let m = TableMeta {
            format_version: FORMAT_VERSION,
            row_format: f,
            row_bytes: f.row_bytes(self.head_dim) as u32,
            code_bytes: f.code_bytes(self.head_dim) as u32,
            scale_bytes: f.scale_bytes(self.head_dim) as u32,
            total_rows: self.total_rows(),
            rows_per_shard: self.rows_per_shard,
            num_shards: self.num_shards,
            head_dim: self.head_dim as u32,
            num_heads: self.hash.num_heads() as u32,
            ngram_size: self.hash.ngram_size,
            heads_per_ngram: self.hash.heads_per_ngram,
            global_scale: self.global_scale,
            hash: self.hash.clone(),
            source: SourceInfo {
                name: self.name.clone(),
                fingerprint: self.fingerprint.clone(),
            },
            rows_file: ROWS_FILE.to_string(),
        };
        debug_assert_eq!(cfg.num_heads(), m.num_heads as usize);
        m.validate().map_err(|e| {
            Error::Format(format!(
                "{}: the checkpoint's PLE table cannot be served: {}",
                self.dir.display(),
                strip_format(&e)
            ))
        })?;
        Ok(m)
    }
}

fn shard_hint(prefix: &str, name: &str) -> String {
    name.strip_prefix(&format!("{prefix}.shard_"))
        .and_then(|r| r.split('.').next())
        .map(|i| format!(" (missing shard {i})"))
        .unwrap_or_default()
}

fn check_tensor(t: &TensorRef, dtype: &str, shape: &[u64], padded: u64, shards: u64) -> Result<()> {
    if t.info.dtype != dtype {
        return Err(Error::Format(format!(
            "{}: wrong dtype: expected {dtype}, found {}",
            t.describe(),
            t.info.dtype
        )));
    }
    if t.info.shape != shape {
        return Err(Error::Format(format!(
            "{}: wrong shape: expected {shape:?} (rows_per_shard = ceil({padded} padded rows / {shards} shards)), found {:?}",
            t.describe(),
            t.info.shape
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor_file(dtype: &str, shape: Vec<u64>, data: &[u8]) -> (tempfile::TempDir, TensorRef) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.safetensors");
        std::fs::write(&p, [&[0u8; 16][..], data].concat()).unwrap();
        let r = TensorRef {
            path: p,
            info: TensorInfo {
                name: "m.ple_embedding.ngram_heads_offsets".into(),
                dtype: dtype.into(),
                shape,
                offset: 16,
                len: data.len() as u64,
            },
        };
        (d, r)
    }

    #[test]
    fn hash_tensors_of_any_integer_dtype() {
        let vals = [0u64, 7, 1 << 20];
        let le = |w: usize| -> Vec<u8> {
            vals.iter()
                .flat_map(|v| v.to_le_bytes()[..w].to_vec())
                .collect()
        };
        for (dt, w) in [("I64", 8), ("U64", 8), ("I32", 4), ("U32", 4)] {
            let (_d, t) = tensor_file(dt, vec![3], &le(w));
            assert_eq!(as_ints(&t, Some(3)).unwrap(), vals, "{dt}");
        }
        let (_d, t) = tensor_file("I16", vec![2], &[5, 0, 0xFF, 0x7F]);
        assert_eq!(as_ints(&t, Some(2)).unwrap(), vec![5, 0x7FFF]);
        // negative values, float dtypes and wrong lengths are errors naming the tensor
        let (_d, t) = tensor_file("I32", vec![1], &(-3i32).to_le_bytes());
        let e = as_ints(&t, Some(1)).unwrap_err().to_string();
        assert!(
            e.contains("negative value -3") && e.contains("ngram_heads_offsets"),
            "{e}"
        );
        let (_d, t) = tensor_file("F32", vec![1], &1f32.to_le_bytes());
        assert!(
            as_ints(&t, Some(1))
                .unwrap_err()
                .to_string()
                .contains("integer dtype")
        );
        let (_d, t) = tensor_file("I64", vec![3], &le(8));
        assert!(
            as_ints(&t, Some(16))
                .unwrap_err()
                .to_string()
                .contains("expected shape [16]")
        );
    }

    #[test]
    fn scalar_scales_in_f32_bf16_f16() {
        let (_d, t) = tensor_file("F32", vec![], &0.375f32.to_le_bytes());
        assert_eq!(as_scalar_f32(&t).unwrap(), 0.375);
        let (_d, t) = tensor_file("BF16", vec![1], &half::bf16::from_f32(0.5).to_le_bytes());
        assert_eq!(as_scalar_f32(&t).unwrap(), 0.5);
        let (_d, t) = tensor_file("F16", vec![], &half::f16::from_f32(2.0).to_le_bytes());
        assert_eq!(as_scalar_f32(&t).unwrap(), 2.0);
        let (_d, t) = tensor_file("F32", vec![2], &[0u8; 8]);
        assert!(
            as_scalar_f32(&t)
                .unwrap_err()
                .to_string()
                .contains("scalar")
        );
        let (_d, t) = tensor_file("F32", vec![], &f32::NAN.to_le_bytes());
        assert!(
            as_scalar_f32(&t)
                .unwrap_err()
                .to_string()
                .contains("positive finite")
        );
    }

    #[test]
    fn header_offsets_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("h.safetensors");
        let write = |h: &str, data: usize| {
            let mut b = (h.len() as u64).to_le_bytes().to_vec();
            b.extend_from_slice(h.as_bytes());
            b.extend(std::iter::repeat_n(0u8, data));
            std::fs::write(&p, b).unwrap();
        };
        write(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"__metadata__":{"k":"v"}}"#,
            4,
        );
        let h = read_header(&p).unwrap();
        assert_eq!(h.tensors.len(), 1);
        assert_eq!(h.get("a").unwrap().offset, h.data_start);
        write(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
            3,
        );
        assert!(
            read_header(&p)
                .unwrap_err()
                .to_string()
                .contains("truncated")
        );
        write(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,0]}}"#,
            4,
        );
        assert!(
            read_header(&p)
                .unwrap_err()
                .to_string()
                .contains("begin after end")
        );
        write(
            r#"{"a":{"dtype":"U8","shape":[2,3],"data_offsets":[0,4]}}"#,
            4,
        );
        assert!(read_header(&p).unwrap_err().to_string().contains("needs"));
        write(r#"{"a":{"dtype":"U8","shape":[4]}}"#, 4);
        assert!(
            read_header(&p)
                .unwrap_err()
                .to_string()
                .contains("malformed")
        );
        write(
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
            2,
        );
        assert!(
            read_header(&p)
                .unwrap_err()
                .to_string()
                .contains("appears twice")
        );
        // unknown (sub-byte) dtypes pass the size check; they are refused only where used
        write(
            r#"{"a":{"dtype":"F4","shape":[8],"data_offsets":[0,4]}}"#,
            4,
        );
        assert_eq!(read_header(&p).unwrap().tensors[0].dtype, "F4");
    }
}
