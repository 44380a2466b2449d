//! The adapter for tables made by the Python tool: a row file `<name>.packed_u8` (same row layout
//! as a libple table) with metadata `<name>.packed_u8.json` in the tool's own schema, converted
//! here into [`TableMeta`] (`docs/FORMAT.md#python-tool-tables`).

use crate::error::{Error, Result};
use crate::format::checkpoint::{CONFIG_FILE, Checkpoint, read_config};
use crate::format::files::{MAX_TABLE_META, read_text_capped};
use crate::format::safetensors::{INDEX_FILE, SINGLE_FILE};
use crate::format::source;
use crate::format::table::{FORMAT_VERSION, SourceInfo, TableMeta, TableOpenOptions};
use crate::model::{HashParams, ModelConfig, RowFormat};
use std::path::{Path, PathBuf};

/// Suffix of a row file made by the Python tool (`<name>.packed_u8`, metadata in `<name>.packed_u8.json`).
pub const PY_ROWS_SUFFIX: &str = ".packed_u8";

/// Looks for a Python-tool table in `dir`: exactly one `<name>.packed_u8` with its `.json`.
pub fn find_python_table(dir: &Path) -> Result<Option<(PathBuf, PathBuf)>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io_path("listing", dir, e))?;
    let mut found = Vec::new();
    let mut orphans = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(PY_ROWS_SUFFIX) && !name.starts_with('.') {
            let json = dir.join(format!("{name}.json"));
            if json.is_file() {
                found.push((e.path(), json));
            } else {
                orphans.push(name);
            }
        }
    }
    found.sort();
    match found.len() {
        0 if !orphans.is_empty() => Err(Error::Format(format!(
            "{}: {} has no metadata file {}.json (incomplete Python-tool table)",
            dir.display(),
            orphans[0],
            orphans[0]
        ))),
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(Error::Format(format!(
            "{}: several Python-tool tables ({}); open a directory holding one",
            dir.display(),
            found
                .iter()
                .map(|(p, _)| p
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The row format a Python-tool dtype/format string names.
fn python_format_hint(s: &str) -> Option<RowFormat> {
    match s.to_ascii_lowercase().as_str() {
        "u8" | "uint8" | "nvfp4" => Some(RowFormat::Nvfp4),
        "f8_e4m3" | "fp8" | "fp8_e4m3" | "float8_e4m3fn" | "e4m3" => Some(RowFormat::Fp8),
        "bf16" | "bfloat16" => Some(RowFormat::Bf16),
        "f32" | "float32" => Some(RowFormat::F32),
        _ => None,
    }
}

/// The fields of a Python-tool table's JSON, parsed and checked against each other, before the
/// checkpoint is consulted.
#[derive(Clone, Debug, PartialEq)]
pub struct PythonTableJson {
    pub rows_per_shard: u64,
    pub num_shards: u32,
    pub row_width: u32,
    pub codes_width: u32,
    pub scales_width: u32,
    pub total_rows: u64,
    pub snapshot: String,
    /// `global_scale`, if the JSON has one.
    pub global_scale: Option<f32>,
    /// The row format named by `shard_dtype`/`storage_dtype`/`dtype`/`row_format`/`kind`, if any
    /// (all that are present must agree).
    pub format_hint: Option<RowFormat>,
}

impl PythonTableJson {
    /// Parses the JSON text (`what` names the file in errors).
    pub fn parse(text: &str, what: &Path) -> Result<PythonTableJson> {
        let jd = what.display();
        let v: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::Format(format!("{jd}: invalid JSON: {e}")))?;
        let int = |k: &str| -> Result<u64> {
            v.get(k).and_then(|x| x.as_u64()).ok_or_else(|| {
                Error::Format(format!(
                    "{jd}: field '{k}' is missing or not a non-negative integer"
                ))
            })
        };
        let int32 = |k: &str| -> Result<u32> {
            let x = int(k)?;
            u32::try_from(x).map_err(|_| Error::Format(format!("{jd}: {k} {x} too large")))
        };
        let (row_width, codes_width, scales_width) = (
            int32("row_width")?,
            int32("codes_width")?,
            int32("scales_width")?,
        );
        if codes_width.checked_add(scales_width) != Some(row_width) {
            return Err(Error::Format(format!(
                "{jd}: row_width {row_width} != codes_width {codes_width} + scales_width {scales_width}"
            )));
        }
        let global_scale =
            match v.get("global_scale") {
                None | Some(serde_json::Value::Null) => None,
                Some(x) => Some(x.as_f64().ok_or_else(|| {
                    Error::Format(format!("{jd}: global_scale {x} is not a number"))
                })? as f32),
            };
        Ok(PythonTableJson {
            rows_per_shard: int("rows_per_shard")?,
            num_shards: int32("num_shards")?,
            row_width,
            codes_width,
            scales_width,
            total_rows: int("total_rows")?,
            snapshot: v
                .get("snapshot")
                .and_then(|x| x.as_str())
                .ok_or_else(|| {
                    Error::Format(format!("{jd}: field 'snapshot' is missing or not a string"))
                })?
                .to_string(),
            global_scale,
            format_hint: format_hint(&v, &jd.to_string())?,
        })
    }

    /// The row format: the hint, else the one whose widths for `head_dim` match; the widths
    /// must match the format either way.
    pub fn row_format(&self, head_dim: usize, what: &Path) -> Result<RowFormat> {
        let jd = what.display();
        let (cw, sw) = (self.codes_width as u64, self.scales_width as u64);
        let widths = |f: RowFormat| {
            (
                f.code_bytes(head_dim) as u64,
                f.scale_bytes(head_dim) as u64,
            )
        };
        let format = match self.format_hint {
            Some(f) => f,
            None => [
                RowFormat::Nvfp4,
                RowFormat::Fp8,
                RowFormat::Bf16,
                RowFormat::F32,
            ]
            .into_iter()
                .find(|&f| widths(f) == (cw, sw))
                .ok_or_else(|| {
                    Error::Format(format!(
                        "{jd}: codes_width {cw} + scales_width {sw} match no row format for head_dim {head_dim}"
                    ))
                })?,
        };
        if widths(format) != (cw, sw) {
            return Err(Error::Format(format!(
                "{jd}: a {} row of head_dim {head_dim} has codes_width {} and scales_width {}, the table says {cw} and {sw}",
                format.name(),
                widths(format).0,
                widths(format).1
            )));
        }
        Ok(format)
    }
}

/// The row format the dtype/format fields of the JSON name (all present must agree).
fn format_hint(v: &serde_json::Value, jd: &str) -> Result<Option<RowFormat>> {
    let mut hint: Option<(&str, RowFormat)> = None;
    for k in [
        "shard_dtype",
        "storage_dtype",
        "dtype",
        "row_format",
        "kind",
    ] {
        if let Some(s) = v.get(k).and_then(|x| x.as_str()) {
            let f = python_format_hint(s).ok_or_else(|| {
                Error::Format(format!("{jd}: {k} '{s}' is not a known PLE storage format"))
            })?;
            if let Some((k0, f0)) = hint
                && f0 != f
            {
                return Err(Error::Format(format!(
                    "{jd}: {k0} says {} but {k} '{s}' says {}",
                    f0.name(),
                    f.name()
                )));
            }
            hint = Some((k, f));
        }
    }
    Ok(hint.map(|(_, f)| f))
}

/// Where the hash parameters and the global scale come from: config.json and/or the checkpoint.
struct Sources {
    config_path: PathBuf,
    config: Option<ModelConfig>,
    checkpoint: Option<Checkpoint>,
}

impl Sources {
    /// Finds them by the rule of [`python_table_meta`] (steps 1 and 3).
    fn locate(dir: &Path, rows: &Path, opts: &TableOpenOptions) -> Result<Sources> {
        let config_path = opts
            .config_json_path
            .clone()
            .unwrap_or_else(|| dir.join(CONFIG_FILE));
        let ck_dir = opts.checkpoint_dir.clone().or_else(|| {
            let d = config_path.parent()?;
            (d.join(INDEX_FILE).is_file() || d.join(SINGLE_FILE).is_file()).then(|| d.to_path_buf())
        });
        let config = if config_path.is_file() {
            Some(read_config(&config_path)?)
        } else if ck_dir.is_none() {
            return Err(Error::Format(format!(
                "{} is a Python-tool table ({}), which carries no hash parameters, and there is no config.json at {}: pass the checkpoint's config.json (config_json_path, `--config`)",
                dir.display(),
                rows.file_name().unwrap_or_default().to_string_lossy(),
                config_path.display()
            )));
        } else {
            None
        };
        let checkpoint = match &ck_dir {
            Some(d) => Some(source::open(d)?),
            None => None,
        };
        Ok(Sources {
            config_path,
            config,
            checkpoint,
        })
    }

    /// The model constants in use: config.json's, else the checkpoint's.
    fn model_config(&self) -> ModelConfig {
        match (&self.config, &self.checkpoint) {
            (Some(c), _) => c.clone(),
            (None, Some(k)) => k.config.clone().unwrap_or_default(),
            (None, None) => ModelConfig::default(),
        }
    }
}

/// Step 2 of the rule: the checkpoint must be the table's source; returns its hash parameters,
/// global scale and fingerprint.
fn from_checkpoint(
    k: &Checkpoint,
    src: &Sources,
    py: &PythonTableJson,
    format: RowFormat,
    rows: &Path,
    json: &Path,
) -> Result<(HashParams, f32, String)> {
    if k.name != py.snapshot {
        return Err(Error::Format(format!(
            "{} was packed from snapshot '{}', not from checkpoint {} ('{}')",
            rows.display(),
            py.snapshot,
            k.dir.display(),
            k.name
        )));
    }
    if k.format != format || k.rows_per_shard != py.rows_per_shard || k.num_shards != py.num_shards
    {
        return Err(Error::Format(format!(
            "{}: {} × {} rows of {} do not match checkpoint {} ({} × {} rows of {})",
            rows.display(),
            py.num_shards,
            py.rows_per_shard,
            format.name(),
            k.dir.display(),
            k.num_shards,
            k.rows_per_shard,
            k.format.name()
        )));
    }
    if let Some(c) = &src.config
        && HashParams::derive(c) != k.hash
    {
        return Err(Error::Format(format!(
            "{} derives other hash parameters than checkpoint {} holds",
            src.config_path.display(),
            k.dir.display()
        )));
    }
    if let Some(s) = py.global_scale
        && s != k.global_scale
    {
        return Err(Error::Format(format!(
            "{}: global_scale {s} differs from the checkpoint's {}",
            json.display(),
            k.global_scale
        )));
    }
    Ok((k.hash.clone(), k.global_scale, k.fingerprint.clone()))
}

/// Converts a Python-tool table's JSON (`rows_per_shard, num_shards, row_width, codes_width,
/// scales_width, total_rows, snapshot`; optionally `shard_dtype`/`storage_dtype`/`dtype`/
/// `row_format`/`kind` and `global_scale`) into [`TableMeta`].
///
/// The Python tool stores neither the hash parameters nor the global scale; they come from the
/// checkpoint. The rule:
/// 1. The checkpoint is `opts.checkpoint_dir`, else the directory of the config.json in use
///    (`opts.config_json_path`, else `config.json` beside the table) when it holds safetensors
///    (`model.safetensors.index.json` or `model.safetensors`).
/// 2. With a checkpoint: its hash parameters (hash tensors and/or config.json, checked as when
///    packing), its global scale and its fingerprint are used; the table's `snapshot` must equal
///    the checkpoint's directory name and its shape (format, rows_per_shard, num_shards) must
///    match, else the table is refused as packed from another checkpoint.
/// 3. Without one: hash parameters derived from config.json (missing → Format error); the global
///    scale from a `global_scale` number in the table's JSON (1.0 for bf16 and f32), else a Format error
///    asking for the checkpoint. The source fingerprint is then empty (unknown).
///
/// A `global_scale` in the JSON and the checkpoint's must agree.
pub fn python_table_meta(
    dir: &Path,
    rows: &Path,
    json: &Path,
    opts: &TableOpenOptions,
) -> Result<TableMeta> {
    let py = PythonTableJson::parse(&read_text_capped(json, MAX_TABLE_META)?, json)?;
    let src = Sources::locate(dir, rows, opts)?;
    let cfg = src.model_config();
    let hd = cfg.head_dim();
    let format = py.row_format(hd, json)?;
    let (hash, global_scale, fingerprint) = match &src.checkpoint {
        Some(k) => from_checkpoint(k, &src, &py, format, rows, json)?,
        None => {
            let scale = match (py.global_scale, format) {
                (Some(s), _) => s,
                (None, RowFormat::Bf16 | RowFormat::F32) => 1.0,
                (None, f) => {
                    return Err(Error::Format(format!(
                        "{}: a {} Python-tool table does not store its global scale: use the config.json inside the checkpoint directory (the scale is then read from the safetensors), pass checkpoint_dir, or add \"global_scale\": <value> to {}",
                        dir.display(),
                        f.name(),
                        json.display()
                    )));
                }
            };
            (HashParams::derive(&cfg), scale, String::new())
        }
    };
    let meta = TableMeta {
        format_version: FORMAT_VERSION,
        row_format: format,
        row_bytes: py.row_width,
        code_bytes: py.codes_width,
        scale_bytes: py.scales_width,
        total_rows: py.total_rows,
        rows_per_shard: py.rows_per_shard,
        num_shards: py.num_shards,
        head_dim: u32::try_from(hd).unwrap_or(u32::MAX),
        num_heads: u32::try_from(cfg.num_heads()).unwrap_or(u32::MAX),
        ngram_size: hash.ngram_size,
        heads_per_ngram: hash.heads_per_ngram,
        ple_layer_index: cfg.ple_layer_index,
        global_scale,
        hash,
        source: SourceInfo {
            name: py.snapshot,
            fingerprint,
        },
        rows_file: rows
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned(),
        shard: None,
    };
    meta.validate()
        .map_err(|e| Error::Format(format!("{}: {e}", json.display())))?;
    Ok(meta)
}
