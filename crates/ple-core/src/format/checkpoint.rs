//! Locating and checking the PLE table of a safetensors checkpoint
//! (`docs/FORMAT.md#safetensors-checkpoints`): the PLE shards, their dtypes and shapes, the global
//! scale and the hash parameters (hash tensors and/or config.json).
//!
//! Only headers and a few scalar tensors are read here (through `safetensors.rs`, which checks
//! every tensor's `data_offsets` against the file); the packer reads the shard data itself.

mod hash;
mod layers;
mod scan;

use hash::resolve_hash;
pub use hash::{HASH_TENSOR_KEYS, HashSource};
pub use layers::PleLayer;
pub use scan::{CheckpointDir, parse_config, read_config};

use crate::error::{Error, Result};
use crate::format::safetensors::TensorRef;
pub use crate::format::safetensors::{INDEX_FILE, SINGLE_FILE};
use crate::format::table::{FORMAT_VERSION, ROWS_FILE, SourceInfo, TableMeta};
use crate::model::{HEAD_DIM, HashParams, ModelConfig, RowFormat};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Name of the model config beside the safetensors files.
pub const CONFIG_FILE: &str = "config.json";
/// How the first PLE shard's name ends; the text before `.shard_0.weight` is the prefix.
pub const SHARD0_SUFFIX: &str = ".ngram_embedding.shard_0.weight";
/// The source tensors of one shard of the PLE table.
#[derive(Clone, Debug)]
pub struct ShardSource {
    /// `prefix.shard_{i}.weight`: NVFP4 codes (U8), FP8 bytes, BF16 or F32 values.
    pub weight: TensorRef,
    /// NVFP4 only: `prefix.shard_{i}.weight_scale` (F8_E4M3 block scales).
    pub scales: Option<TensorRef>,
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
    /// The layer's `ple_layer_index` (its place among the PLE layers; with a config.json, its
    /// place in `ple_layer_ids`; without one, in decoder-layer order).
    pub ple_layer_index: u64,
    /// config.json's constants, when the checkpoint has one.
    pub config: Option<ModelConfig>,
    pub shards: Vec<ShardSource>,
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

/// Shard tensors by (shard index, suffix after `shard_{i}.`).
type ShardTensors<'a> = BTreeMap<(u64, String), &'a TensorRef>;

/// Refuses PLE or hash tensors held by two files, and an index that disagrees with the headers
/// about any PLE tensor.
fn check_index(
    tensors: &Tensors,
    index: Option<&BTreeMap<String, String>>,
    prefix: &str,
    module: &str,
    d: &str,
) -> Result<()> {
    if let Some((n, a, b)) = tensors
        .duplicates
        .iter()
        .find(|(n, _, _)| n.starts_with(module) || HASH_TENSOR_KEYS.iter().any(|k| n.ends_with(k)))
    {
        return Err(Error::Format(format!(
            "{d}: tensor '{n}' is duplicated: it is in both {} and {}",
            a.display(),
            b.display()
        )));
    }
    let Some(map) = index else {
        return Ok(());
    };
    for (name, file) in map.iter().filter(|(n, _)| n.starts_with(module)) {
        let Some(t) = tensors.get(name) else {
            return Err(Error::Format(format!(
                "{d}: the index names tensor '{name}' in {file}, but no safetensors file holds it{}",
                shard_hint(prefix, name)
            )));
        };
        if t.path
            .file_name()
            .is_none_or(|f| f.to_string_lossy() != *file)
        {
            return Err(Error::Format(format!(
                "{d}: the index puts tensor '{name}' in {file}, but it is in {}",
                t.path.display()
            )));
        }
    }
    if let Some((name, t)) = tensors
        .by_name
        .iter()
        .find(|(n, _)| n.starts_with(prefix) && !map.contains_key(*n))
    {
        return Err(Error::Format(format!(
            "{d}: tensor '{name}' is in {} but the index does not list it",
            t.path.display()
        )));
    }
    Ok(())
}

/// The shard tensors `prefix.shard_{i}.{suffix}` and the number of shards (config.json's
/// `split_ngram_parts`, else the highest index + 1); every shard `0..n` has a weight.
fn collect_shards<'a>(
    tensors: &'a Tensors,
    prefix: &str,
    config: Option<&ModelConfig>,
    d: &str,
) -> Result<(ShardTensors<'a>, u64)> {
    let shard_head = format!("{prefix}.shard_");
    let mut shard_tensors: ShardTensors = BTreeMap::new();
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
    let num_shards: u64 = match config {
        Some(c) => c.split_ngram_parts as u64,
        None => max_index.saturating_add(1),
    };
    if num_shards > u32::MAX as u64 {
        return Err(Error::Format(format!(
            "{d}: shard index {max_index} is beyond the {} shards a table can have",
            u32::MAX
        )));
    }
    if let Some(((i, s), t)) = shard_tensors.iter().find(|((i, _), _)| *i >= num_shards) {
        return Err(Error::Format(format!(
            "{d}: stray shard {i}: tensor '{}' (suffix '{s}') is beyond the {num_shards} shards config.json's split_ngram_parts declares (shards 0..{})",
            t.info.name,
            num_shards - 1
        )));
    }
    // Every shard 0..num_shards needs its own tensor, so num_shards ≤ the number of tensors.
    for i in 0..num_shards {
        if !shard_tensors.contains_key(&(i, "weight".to_string())) {
            return Err(Error::Format(format!(
                "{d}: missing shard {i}: no tensor '{prefix}.shard_{i}.weight' (expected {num_shards} shards, 0..{})",
                num_shards - 1
            )));
        }
    }
    Ok((shard_tensors, num_shards))
}

/// The row format shard 0's dtype names.
fn row_format_of(w0: &TensorRef, d: &str) -> Result<RowFormat> {
    match w0.info.dtype.as_str() {
        "U8" => Ok(RowFormat::Nvfp4),
        "F8_E4M3" => Ok(RowFormat::Fp8),
        "BF16" => Ok(RowFormat::Bf16),
        "F32" => Ok(RowFormat::F32),
        other => Err(Error::Format(format!(
            "{d}: {}: dtype {other} is not a PLE storage dtype (expected U8 for NVFP4, F8_E4M3 for FP8, BF16 or F32)",
            w0.describe()
        ))),
    }
}

/// The shape of the packed table: rows addressed, padded to the divisor, split into shards.
struct Shape {
    padded: u64,
    rows_per_shard: u64,
    head_dim: usize,
}

fn table_shape(
    hash: &HashParams,
    config: Option<&ModelConfig>,
    num_shards: u64,
    d: &str,
) -> Result<Shape> {
    let cfg = config.cloned().unwrap_or_default();
    let head_dim = if config.is_some() {
        cfg.head_dim()
    } else {
        HEAD_DIM
    };
    let div = cfg.make_ngram_vocab_size_divisible_by;
    let padded = hash
        .addressed_rows()
        .div_ceil(div)
        .checked_mul(div)
        .ok_or_else(|| {
            Error::Format(format!(
                "{d}: {} rows padded to a multiple of {div} overflow 64 bits",
                hash.addressed_rows()
            ))
        })?;
    Ok(Shape {
        padded,
        rows_per_shard: padded.div_ceil(num_shards),
        head_dim,
    })
}

/// Checks every shard's weight (and, for NVFP4, block scales) against the shape.
fn shard_sources(
    shard_tensors: &ShardTensors,
    format: RowFormat,
    shape: &Shape,
    num_shards: u64,
    prefix: &str,
    d: &str,
) -> Result<Vec<ShardSource>> {
    let hd = shape.head_dim as u64;
    let cols = match format {
        RowFormat::Nvfp4 => hd / 2,
        RowFormat::Fp8 | RowFormat::Bf16 | RowFormat::F32 => hd,
    };
    let (rps, padded) = (shape.rows_per_shard, shape.padded);
    let dtype = shard_tensors[&(0, "weight".to_string())].info.dtype.clone();
    let mut shards = Vec::with_capacity(shard_tensors.len());
    for i in 0..num_shards {
        let w = shard_tensors[&(i, "weight".to_string())];
        check_tensor(w, &dtype, &[rps, cols], padded, num_shards)?;
        let scales = if format == RowFormat::Nvfp4 {
            let s = shard_tensors
                .get(&(i, "weight_scale".to_string()))
                .ok_or_else(|| {
                    Error::Format(format!(
                        "{d}: NVFP4 shard {i} has no block scales: tensor '{prefix}.shard_{i}.weight_scale' is missing"
                    ))
                })?;
            check_tensor(s, "F8_E4M3", &[rps, hd / 16], padded, num_shards)?;
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
        RowFormat::Bf16 | RowFormat::F32 => &["weight"],
    };
    for ((_, s), t) in shard_tensors {
        if !allowed.contains(&s.as_str()) {
            log::warn!(
                "{d}: ignoring tensor '{}' (not part of a {} PLE table)",
                t.info.name,
                format.name()
            );
        }
    }
    Ok(shards)
}

/// The global scale (`weight_scale_2` for NVFP4, `weight_scale` for FP8, 1.0 for BF16 and F32): every
/// copy found, the module's and each shard's, must agree.
fn global_scale(
    tensors: &Tensors,
    shard_tensors: &ShardTensors,
    format: RowFormat,
    prefix: &str,
    d: &str,
) -> Result<f32> {
    let key = match format {
        RowFormat::Bf16 | RowFormat::F32 => return Ok(1.0),
        RowFormat::Nvfp4 => "weight_scale_2",
        RowFormat::Fp8 => "weight_scale",
    };
    let mut copies: Vec<&TensorRef> = Vec::new();
    if let Some(t) = tensors.get(&format!("{prefix}.{key}")) {
        copies.push(t);
    }
    copies.extend(
        shard_tensors
            .iter()
            .filter(|((_, s), _)| s == key)
            .map(|(_, t)| *t),
    );
    let Some(first_t) = copies.first() else {
        return Err(Error::Format(format!(
            "{d}: {} checkpoint without a global scale: neither '{prefix}.{key}' nor '{prefix}.shard_{{i}}.{key}' exists",
            format.name()
        )));
    };
    let first = first_t.scalar_f32()?;
    for c in &copies[1..] {
        let v = c.scalar_f32()?;
        if v.to_bits() != first.to_bits() {
            return Err(Error::Format(format!(
                "{d}: the global scale copies differ: '{}' = {first} but '{}' = {v}",
                first_t.info.name, c.info.name
            )));
        }
    }
    Ok(first)
}

impl Checkpoint {
    /// Locates and checks the PLE table of the checkpoint directory `dir` (its only PLE layer)
    /// (`docs/FORMAT.md#safetensors-checkpoints`). A GGUF file or a directory: `source::open`.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        Checkpoint::open_layer(dir, None)
    }

    /// The PLE layers of the checkpoint directory `dir`
    /// (`docs/FORMAT.md#several-ple-layers`).
    pub fn layers(dir: &Path) -> Result<Vec<PleLayer>> {
        CheckpointDir::scan(dir)?.layers()
    }

    /// As [`Checkpoint::open`], for the PLE layer whose `ple_layer_index` is `layer` (`None`: the
    /// only one). Its hash is derived with that index. Several layers of one directory:
    /// [`CheckpointDir`] (reads its headers once).
    pub fn open_layer(dir: &Path, layer: Option<u64>) -> Result<Checkpoint> {
        CheckpointDir::scan(dir)?.open_layer(layer)
    }

    /// Bytes of one packed row.
    pub fn row_bytes(&self) -> usize {
        self.format.row_bytes(self.head_dim)
    }

    /// Rows of the packed table (rows_per_shard × num_shards; saturating, and a saturated count
    /// fails [`Checkpoint::table_meta`]'s validation).
    pub fn total_rows(&self) -> u64 {
        self.rows_per_shard.saturating_mul(self.num_shards as u64)
    }

    /// The metadata of the table packed from this checkpoint (validated).
    pub fn table_meta(&self) -> Result<TableMeta> {
        let f = self.format;
        let hd = self.head_dim;
        let to_u32 = |v: usize, what: &str| {
            u32::try_from(v).map_err(|_| {
                Error::Format(format!(
                    "{}: {what} {v} of the PLE table does not fit 32 bits",
                    self.dir.display()
                ))
            })
        };
        let m = TableMeta {
            format_version: FORMAT_VERSION,
            row_format: f,
            row_bytes: to_u32(f.row_bytes(hd), "row_bytes")?,
            code_bytes: to_u32(f.code_bytes(hd), "code_bytes")?,
            scale_bytes: to_u32(f.scale_bytes(hd), "scale_bytes")?,
            total_rows: self.total_rows(),
            rows_per_shard: self.rows_per_shard,
            num_shards: self.num_shards,
            head_dim: to_u32(hd, "head_dim")?,
            num_heads: to_u32(self.hash.num_heads(), "num_heads")?,
            ngram_size: self.hash.ngram_size,
            heads_per_ngram: self.hash.heads_per_ngram,
            ple_layer_index: self.ple_layer_index,
            global_scale: self.global_scale,
            hash: self.hash.clone(),
            source: SourceInfo {
                name: self.name.clone(),
                fingerprint: self.fingerprint.clone(),
            },
            rows_file: ROWS_FILE.to_string(),
            shard: None,
        };
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
